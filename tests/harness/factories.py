"""What many tests build or measure the same way, built one way: markers, the
``slackwater`` command, /metrics samples, waiting for a condition, a broker that cannot
be reached."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from slackwater.markers import Marker, MarkerStatus

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "slackwater.json"
# The `slackwater` command as a user runs it, from this interpreter's environment.
SLACKWATER = (sys.executable, "-m", "slackwater.cli")


def run_cli(*arguments: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``slackwater ARGUMENTS`` to its end, output captured as text."""
    return subprocess.run(
        [*SLACKWATER, *arguments],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def marker(
    partition: int,
    status: MarkerStatus,
    offset: int,
    *,
    topic: str = "orders",
    epoch: int = 1,
    seq: int = 0,
    emitter_id: str = "e",
) -> Marker:
    """A marker as an emitter writes it (emitted at time 0)."""
    return Marker(
        topic=topic,
        partition=partition,
        status=status,
        offset=offset,
        emitted_at=0,
        emitter_id=emitter_id,
        epoch=epoch,
        seq=seq,
    )


def parsed_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Exposition text as (name, labels, value), one per sample."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def samples(text: str) -> dict[str, float]:
    """Exposition text as {'name{label="value",...}': value}, labels sorted by name."""
    values: dict[str, float] = {}
    for name, labels, value in parsed_samples(text):
        label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        values[f"{name}{{{label_text}}}" if label_text else name] = value
    return values


def scrape_metrics(url: str) -> dict[str, float]:
    """A real scrape of a /metrics endpoint, as :func:`samples`."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return samples(response.read().decode())


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``predicate()``'s first truthy value, polled every 50 ms; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def deploy_metric_names() -> set[str]:
    """Every slackwater_* series name the alert rules and the dashboard query."""
    texts = [(PROMETHEUS / "alerts.yml").read_text()]
    dashboard = json.loads(DASHBOARD.read_text())
    texts += [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    return set(re.findall(r"slackwater_[a-z_]+", "\n".join(texts)))


class ResettingEndpoint:
    """A loopback port that resets every connection as it accepts it: to a Kafka client,
    a broker it cannot reach (``Connect to ... failed: Connection reset by peer``, as
    often as it retries), with every failed attempt counted, so that a test waits for a
    number of failures instead of for a time."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        self._resets = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def resets(self) -> int:
        """Connections reset so far."""
        with self._lock:
            return self._resets

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            # Linger 0: close() sends a reset, the client's connect fails.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()
            with self._lock:
                self._resets += 1

    def __enter__(self) -> ResettingEndpoint:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self._server.close()
        self._thread.join(10)


def json_shaped_bytes(*words: bytes) -> Any:
    """A hypothesis strategy: bytes made of pieces of JSON (and ``words``), with what
    breaks JSON parsers: numbers too long to parse, nesting too deep, non-finite numbers,
    lone surrogates."""
    from hypothesis import strategies as st

    pieces = [b"{", b"}", b"[", b"]", b",", b":", b"1", b".", b"e", b"-", b"+", b"null"]
    pieces += [b"9" * 4400, b"[" * 2000, b"1e400", b"NaN", b'"\\ud800"', *words]
    return st.lists(st.sampled_from(pieces), max_size=30).map(b"".join)
