"""Helpers for tests that run slackwater as a user would: waiting on a running process."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def wait_while_running(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str,
    process: subprocess.Popen[bytes],
    log: Path,
) -> None:
    """Until ``predicate()``; fails at once, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"process exited: {log.read_text()[-3000:]}"
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:]}")
