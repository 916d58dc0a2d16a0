"""A control topic other writers filled with garbage (issue 13), end to end on Kafka:
12,000 bad records of every class amid valid markers, through the CLI and the source.

Nothing may crash, stall or fence: the windows come out exact and once, the emitter
started on the polluted topic writes correct markers with a sane epoch, `status`
prints, and every skipped record is counted where an operator looks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.markers import EpochClaim, Marker, MarkerStatus, encode
from tests.conftest import TopicFactory
from tests.harness.emitter import DEADLINE_S, control_markers
from tests.harness.factories import SLACKWATER, run_cli, scrape_metrics
from tests.harness.kafka_writer import Writer
from tests.harness.process import wait_while_running
from tests.harness.source_jobs import events, window_job

IDLE, FINISHED = MarkerStatus.IDLE, MarkerStatus.FINISHED
PER_CLASS = 1_500
# Five of the eight classes are malformed (tombstones, unlisted partitions and other
# topics are not: they are skipped, held or ignored, and counted apart).
MALFORMED = PER_CLASS * 5


def _garbage(topic: str) -> dict[str, list[tuple[bytes | None, bytes | None]]]:
    """Bad control records by class, PER_CLASS of each (8 classes: 12,000)."""

    def marker(**changes: object) -> bytes:
        document = json.loads(
            encode(
                Marker(
                    topic=topic, partition=0, status=IDLE, offset=1, emitted_at=1,
                    emitter_id="forger", epoch=1, seq=0,
                )
            )[1]
        )  # fmt: skip
        document.update(changes)
        return json.dumps(document).encode()

    key = f"{topic}:0".encode()
    huge_claim = json.dumps(
        {"kind": "epoch_claim", "emitter_id": "forger", "epoch": 10**23, "claimed_at": 1}
    ).encode()
    return {
        "not JSON": [(key, b"\xff{not json %d" % i) for i in range(PER_CLASS)],
        "not a record": [(key, json.dumps([i, "x"]).encode()) for i in range(PER_CLASS)],
        "key does not match value": [(f"{topic}:1".encode(), marker()) for _ in range(PER_CLASS)],
        "out of range": [
            (key, marker(**{field: value}))
            for i in range(PER_CLASS)
            for field, value in [
                [("offset", 2**63), ("emitted_at", 10**23), ("seq", -1), ("epoch", 10**23)][i % 4]
            ]
        ],
        "tombstone": [(key, None) for _ in range(PER_CLASS)],
        "epoch claim out of range": [(b"epoch_claim", huge_claim) for _ in range(PER_CLASS)],
        # Well formed, but for a partition the broker does not list (it stalled every
        # window before issue 13) and for a topic nobody subscribed.
        "unlisted partition": [
            (f"{topic}:9".encode(), marker(partition=9, status="ACTIVE", offset=i))
            for i in range(PER_CLASS)
        ],
        "other topic": [
            (b"nobodys-topic:0", marker(topic="nobodys-topic", status="FINISHED"))
            for _ in range(PER_CLASS)
        ],
    }


def _emit(
    bootstrap: str, topic: str, control: str, port: int, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *SLACKWATER, "emit", "--bootstrap-servers", bootstrap, "--topic", topic,
                "--control-topic", control, "--idle-timeout", "2s",
                "--poll-interval", "200ms", "--metrics-port", str(port),
                "--emitter-id", "fresh",
            ],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


def _finish_all(bootstrap: str, topic: str, control: str, partitions: int) -> None:
    for partition in range(partitions):
        finished = run_cli(
            "finish", "--bootstrap-servers", bootstrap, "--control-topic", control,
            "--topic", topic, "--partition", str(partition), "--timeout", "30",
        )  # fmt: skip
        assert finished.returncode == 0, finished.stderr


def _status(bootstrap: str, control: str) -> dict[str, Any]:
    arguments = ["--bootstrap-servers", bootstrap, "--control-topic", control]
    status = run_cli("status", "--json", *arguments)
    assert status.returncode == 0, status.stderr
    assert "Traceback" not in status.stderr
    document: dict[str, Any] = json.loads(status.stdout)
    return document


def _pollute(write: Writer, topic: str) -> None:
    """A previous emitter's valid history (epoch 2, partition 2 IDLE at its log end),
    then the garbage."""
    previous = EpochClaim(emitter_id="previous", epoch=2, claimed_at=1)
    write.raw_control(*encode(previous))
    write.raw_control(
        *encode(
            Marker(
                topic=topic, partition=2, status=IDLE, offset=10, emitted_at=1,
                emitter_id="previous", epoch=2, seq=0,
            )
        )
    )  # fmt: skip
    garbage = _garbage(topic)
    for records in garbage.values():
        for key, value in records:
            write.producer.produce(write.control_topic, key=key, value=value)
    assert write.producer.flush(30) == 0
    assert sum(len(r) for r in garbage.values()) >= 10_000


def test_twelve_thousand_bad_control_records_neither_crash_nor_stall_nor_fence(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=3), new_topic(partitions=1, prefix="ctl")
    bootstrap = broker.bootstrap_servers
    write = Writer(bootstrap, topic, control)
    write.data(0, *range(30))
    write.data(1, *[s + 0.5 for s in range(30)])
    write.data(2, *range(10))  # then quiet
    _pollute(write, topic)

    # The consumer: a quiet partition marked IDLE does not stall the windows, whatever
    # else the control topic holds.
    job = window_job(spark, events(spark, bootstrap, [topic], control), tmp_path, "10 seconds")
    try:
        job.settle()
        assert job.windows() == {(0, 10): 30, (10, 20): 20}
        counters = job.source_offset()["counters"]
        assert counters["control_malformed"] == MALFORMED
        assert counters["control_tombstones"] == PER_CLASS

        # The emitter, started as a user would on the polluted topic.
        metrics_port = free_port()
        log = tmp_path / "emit.log"
        emitter = _emit(bootstrap, topic, control, metrics_port, log)
        try:

            def fresh_markers() -> list[Marker]:
                return [m for m in control_markers(bootstrap, control) if m.emitter_id == "fresh"]

            wait_while_running(
                lambda: len(fresh_markers()) >= 2, DEADLINE_S, "IDLE of p0 and p1", emitter, log
            )
            fresh = fresh_markers()
            # One above the highest valid epoch (2), not 10^23 + 1.
            assert {(m.topic, m.partition, m.status, m.offset, m.epoch) for m in fresh} == {
                (topic, 0, IDLE, 30, 3),
                (topic, 1, IDLE, 30, 3),
            }
            metrics = scrape_metrics(f"http://127.0.0.1:{metrics_port}/metrics")
            assert metrics["slackwater_emitter_control_records_malformed_total"] == MALFORMED
            assert metrics["slackwater_emitter_control_records_tombstones_total"] == PER_CLASS
            assert metrics["slackwater_emitter_unlisted_partitions"] == 1
            assert metrics["slackwater_emitter_watched_partitions"] == 3
            assert metrics["slackwater_emitter_fenced"] == 0

            # Everything ends: slackwater finish for each partition, then every window closes.
            _finish_all(bootstrap, topic, control, 3)
            job.settle()
            assert job.rows() == [(0, 30), (10, 20), (20, 20)]  # every window once, exact

            document = _status(bootstrap, control)
            assert document["malformed_records"] == MALFORMED
            assert document["tombstones"] == PER_CLASS
            assert document["emitters"]["fresh"] == [3]
            assert "forger" in document["emitters"]  # a forged writer stands out
            assert emitter.poll() is None  # still running through all of it
        finally:
            emitter.send_signal(signal.SIGTERM)
            assert emitter.wait(timeout=20) == 0, log.read_text()[-2000:]
        assert "Traceback" not in log.read_text()
    finally:
        job.stop()
