"""`slackwater consume --backfill` as a process (issue 32, item 5): a one-off run that
reads to the log ends seen when it starts, writes every window and exits 0; exact and
each window once across a SIGKILL in the middle of the run and the run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from slackwater.kafka_broker import KafkaBroker, free_port
from spark_consumer.consume.job import committed_rows
from tests.conftest import TopicFactory
from tests.harness.factories import SLACKWATER
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import frozen, kill_inside_a_batch, wait_while_running
from tests.harness.source_jobs import iso_ms
from tests.harness.spark_checkpoint import batch_ids

WINDOW_S = 5


def _backfill(
    bootstrap: str, topic: str, control: str, tmp: Path, log: Path, *more: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *SLACKWATER, "consume",
            "--bootstrap-servers", bootstrap, "--topic", topic, "--control-topic", control,
            "--window", f"{WINDOW_S}s", "--max-out-of-orderness", "1s",
            "--output", str(tmp / "out"), "--checkpoint", str(tmp / "checkpoint"),
            "--metrics-port", str(free_port()), *more,
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def _reference(
    spark: SparkSession, bootstrap: str, topic: str, ends: dict[int, int]
) -> Counter[tuple[int, str]]:
    """Spark's batch aggregation of the records up to ``ends``, read back by Spark's own
    Kafka reader: {(window start s, key): count}."""
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
        .load()
    )
    rows = (
        records.groupBy(F.window("timestamp", f"{WINDOW_S} seconds"), F.col("key").cast("string"))
        .count()
        .collect()
    )
    return Counter(
        {
            ((int(r["window"]["start"].timestamp() * 1000) - BASE_MS) // 1000, r["key"]): r["count"]
            for r in rows
        }
    )


@pytest.mark.integration
# Three Spark starts: on a machine busy with other work, longer than the suite's 300 s.
@pytest.mark.timeout(1800)
def test_a_backfill_writes_every_window_once_across_a_sigkill_and_ends(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    bootstrap = broker.bootstrap_servers
    write = Writer(bootstrap, topic, control)
    for second in range(0, 42):  # no marker at all: a backfill FINISHES every partition
        write.data(0, second, key="k0")
        write.data(1, second + 0.5, key="k1")
    ends = dict(write.log_end)
    log = tmp_path / "consume.log"
    first = _backfill(bootstrap, topic, control, tmp_path, log, "--backfill")
    try:
        kill_inside_a_batch(first, tmp_path / "checkpoint" / "windows", log)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    write.data(0, 100, key="k0")  # after the run started: not this backfill's
    again = _backfill(bootstrap, topic, control, tmp_path, log, "--backfill")
    assert again.wait(600) == 0, log.read_text()[-3000:]
    rows = committed_rows(tmp_path / "out")
    written = Counter(
        {((iso_ms(str(r["window_start"])) - BASE_MS) // 1000, r["key"]): r["count"] for r in rows}
    )
    assert len(written) == len(rows)  # each window and key once
    expected = _reference(spark, bootstrap, topic, ends)
    assert len(expected) == 2 * 9  # 42 s of two keys: every window, the last one too
    assert written == expected
    # Without --backfill the checkpoint would go past its ends, every record late: refused.
    before = log.stat().st_size
    streaming = _backfill(bootstrap, topic, control, tmp_path, log, "--trigger", "200ms")
    try:
        assert streaming.wait(600) == 1
    finally:
        if streaming.poll() is None:
            os.killpg(streaming.pid, signal.SIGKILL)
    said = log.read_bytes()[before:].decode().strip().splitlines()
    refused = [line for line in said if line.startswith("slackwater consume:")]
    assert len(refused) == 1 and "option 'endingOffsets' is left out" in refused[0], said


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_backfill_stopped_before_it_ended_exits_1_saying_so(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """SIGTERM (a node drain) while a batch is in flight: a supervisor must not take the
    backfill for done, so consume exits 1 with one line, not 0."""
    topic, control = new_topic(partitions=1), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    write.data(0, *range(0, 10))
    log = tmp_path / "consume.log"
    process = _backfill(broker.bootstrap_servers, topic, control, tmp_path, log, "--backfill")
    checkpoint = tmp_path / "checkpoint" / "windows"

    def in_flight() -> set[int]:
        return batch_ids(checkpoint, "offsets") - batch_ids(checkpoint, "commits")

    try:
        # SIGTERM while every thread is stopped with a batch in flight (the run cannot end
        # while the signal is sent); a look whose threads did not all stop is made again.
        signalled = False
        while not signalled:
            wait_while_running(in_flight, 600, "a batch in flight", process, log)
            with frozen(process) as stopped:
                if stopped and in_flight():
                    process.send_signal(signal.SIGTERM)  # the driver alone, as a supervisor
                    signalled = True
        assert process.wait(120) == 1, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    said = [line for line in log.read_text().splitlines() if line.startswith("slackwater")]
    assert said[-1].startswith("slackwater consume: stopped before the backfill ended"), said
