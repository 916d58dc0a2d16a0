"""How long a control topic goes without an active emitter when the active one dies.

On Apache Kafka (`slackwater broker`'s launcher, Kafka's own group settings but for
``group.min.session.timeout.ms``, lowered so that sessions under 6 s can be measured):
``--replicas`` ``slackwater emit`` processes on one control topic; the active one is
SIGKILLed ``--kills`` times, and a replacement started after each kill (as a
deployment does). Per kill: from the SIGKILL to the new active emitter's epoch claim
on the control topic (its ``claimed_at``), and to its ``/status`` saying ``active``.
The takeover waits for the group to evict the dead member, so the session timeout
(``--session-timeout``, the emitter's ``session_timeout_ms``) is its floor.

    .venv/bin/python -m bench.emitter_takeover_bench [--kills 10] [--session-timeout 10s]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from confluent_kafka.admin import AdminClient, NewTopic

from emitter.control_topic import ControlTopicReader
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import EpochClaim
from tests.harness.emitter_processes import EmitterProcess, start_emitter_process

DEADLINE_S = 300.0
T = TypeVar("T")


def _wait(predicate: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def _active(emitters: list[EmitterProcess]) -> EmitterProcess | None:
    live = [e for e in emitters if e.process.poll() is None]
    active = [e for e in live if e.role() == "active"]
    return active[0] if len(active) == 1 else None


def run(kills: int, replicas: int, session_timeout: str) -> list[tuple[float, float]]:
    """(ms to the new claim, ms to /status active) per kill."""
    settings = {"group.min.session.timeout.ms": "1000", "group.initial.rebalance.delay.ms": "0"}
    with KafkaBroker(settings=settings) as broker, tempfile.TemporaryDirectory() as logs:
        bootstrap = broker.bootstrap_servers
        topic, control = f"t-{uuid.uuid4().hex[:8]}", f"ctl-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 8, 1)])[topic].result()
        emitters = [
            start_emitter_process(
                bootstrap,
                topic,
                control,
                f"e{i}",
                Path(logs),
                SLACKWATER_SESSION_TIMEOUT_MS=session_timeout,
            )
            for i in range(replicas)
        ]
        reader: ControlTopicReader | None = None
        results: list[tuple[float, float]] = []
        try:
            active = _wait(lambda: _active(emitters), "a first active emitter")
            reader = ControlTopicReader(bootstrap, control, {}, 5.0)
            reader.read_to_end()
            for kill in range(kills):
                killed_ms = time.time_ns() / 1e6
                active.kill()
                claim = reader.read_until(lambda r: isinstance(r, EpochClaim), DEADLINE_S)
                claimed = claim.records[-1]
                assert isinstance(claimed, EpochClaim)
                active = _wait(lambda: _active(emitters), "the next active emitter")
                ready_ms = time.time_ns() / 1e6
                results.append((claimed.claimed_at - killed_ms, ready_ms - killed_ms))
                print(
                    f"kill {kill + 1}: claim after {results[-1][0]:.0f} ms, "
                    f"/status active after {results[-1][1]:.0f} ms",
                    flush=True,
                )
                emitters.append(
                    start_emitter_process(
                        bootstrap,
                        topic,
                        control,
                        f"e{replicas + kill}",
                        Path(logs),
                        SLACKWATER_SESSION_TIMEOUT_MS=session_timeout,
                    )
                )
        finally:
            if reader is not None:
                reader.close()
            for emitter in emitters:
                emitter.terminate()
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--session-timeout", default="10s")
    args = parser.parse_args()
    results = run(args.kills, args.replicas, args.session_timeout)
    claims = [r[0] for r in results]
    actives = [r[1] for r in results]
    print(
        f"session timeout {args.session_timeout}, {args.replicas} replicas, "
        f"{len(results)} kills: claim median {statistics.median(claims):.0f} ms, "
        f"max {max(claims):.0f} ms; /status active median "
        f"{statistics.median(actives):.0f} ms, max {max(actives):.0f} ms"
    )


if __name__ == "__main__":
    main()
