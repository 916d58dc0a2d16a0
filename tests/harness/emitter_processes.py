"""Emitters as a deployment runs them: ``slackwater emit`` processes, each in its own
process group, that a test can SIGKILL, SIGSTOP and SIGCONT, and ask for their role."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slackwater.kafka_broker import free_port
from tests.harness.factories import SLACKWATER

# The settings of the election tests' emitters (session timeout: the broker's minimum
# is lowered for them, tests/conftest.TEST_BROKER_SETTINGS).
ELECTION_SETTINGS = {
    "SLACKWATER_IDLE_TIMEOUT_MS": "1s",
    "SLACKWATER_POLL_INTERVAL_MS": "200ms",
    "SLACKWATER_REQUEST_TIMEOUT_MS": "2s",
    "SLACKWATER_METADATA_INTERVAL_MS": "500ms",
    "SLACKWATER_SESSION_TIMEOUT_MS": "2s",
}


@dataclass
class EmitterProcess:
    """One ``slackwater emit`` process and the port of its HTTP server."""

    emitter_id: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    stopped: bool = field(default=False)

    def status(self) -> dict[str, Any] | None:
        """Its ``/status``, or None while it does not answer (starting, stopped, dead)."""
        if self.stopped or self.process.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=2) as r:
                document: dict[str, Any] = json.load(r)
                return document
        except (OSError, ValueError):
            return None

    def role(self) -> str | None:
        document = self.status()
        return None if document is None else str(document["role"])

    def epoch(self) -> int | None:
        document = self.status()
        return None if document is None else document["epoch"]

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def freeze(self) -> None:
        self.stopped = True
        os.killpg(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        if self.process.poll() is None:
            if self.stopped:
                self.thaw()
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)


def start_emitter_process(
    bootstrap: str, topic: str, control: str, emitter_id: str, log_dir: Path, **settings: str
) -> EmitterProcess:
    """``slackwater emit`` for ``topic`` on ``control``, its output in ``log_dir``."""
    port = free_port()
    log = log_dir / f"{emitter_id}.log"
    env = {
        **os.environ,
        **ELECTION_SETTINGS,
        **settings,
        "SLACKWATER_BOOTSTRAP_SERVERS": bootstrap,
        "SLACKWATER_TOPICS": topic,
        "SLACKWATER_CONTROL_TOPIC": control,
        "SLACKWATER_EMITTER_ID": emitter_id,
        "SLACKWATER_METRICS_PORT": str(port),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*SLACKWATER, "emit"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: signals reach every thread of it
        )
    return EmitterProcess(emitter_id, process, port, log)


def probe(port: int, path: str) -> int | None:
    """An HTTP probe's status code (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None
