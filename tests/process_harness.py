"""Helpers for tests that run slackwater as a user would: a process, its /metrics."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# The `slackwater` command as a user runs it, from this interpreter's environment.
SLACKWATER = (sys.executable, "-m", "slackwater.cli")


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


def scrape(url: str) -> dict[str, float]:
    """A real scrape of a /metrics endpoint, as {'name{label="value",...}': value}."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
