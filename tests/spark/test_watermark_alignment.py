"""Watermark alignment (issue 43, option ``maxWatermarkDrift``) on Apache Kafka and a
local SparkSession: a skewed backfill read with the drift set. Every plan the query
logged is checked against the rules from its own offset (tests/harness/skewed_backfill:
what is held, how far ahead, the budget, never a stall), and every window (or joined
row) against the same records aggregated in Python: each exact, each once."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from examples.join_two_topics import orders_joined_with_payments
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.consume.job import committed_rows
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import kill_inside_a_batch, wait_while_running
from tests.harness.skewed_backfill import (
    SKEWED_SECONDS,
    Batch,
    aligned_events,
    channel_ends,
    check_alignment,
    expected_alignment,
    logged_batches,
    minute_counts,
    minute_windows,
    run_to_end,
    settle,
    start_json,
    timed,
    write_skewed,
    written_windows,
)
from tests.harness.source_jobs import iso_ms
from tests.harness.spark_checkpoint import batch_ids, planned_batch

IDLE, FINISHED = MarkerStatus.IDLE, MarkerStatus.FINISHED
ROOT = Path(__file__).resolve().parents[2]
TopicFactory = Callable[..., str]

DRIFT, DRIFT_MS, BUDGET = "5m", 300_000, 60
ALIGNED = {"maxWatermarkDrift": DRIFT, "maxOffsetsPerTrigger": str(BUDGET)}


def _skewed(broker: KafkaBroker, new_topic: TopicFactory) -> tuple[Writer, list[int]]:
    topic, control = new_topic(partitions=4), new_topic(prefix="ctl")
    writer = Writer(broker.bootstrap_servers, topic, control)
    return writer, write_skewed(writer)


def _held_at_least_once(batches: list[Batch]) -> None:
    """Else the test proves nothing of alignment."""
    assert any(batch.expected.held for batch in batches), [b.raw["alignment"] for b in batches]


def _longest_wait(batches: list[Batch]) -> dict[str, int]:
    """Per channel, the most plans in a row in which it could move and got no record."""
    longest: dict[str, int] = {}
    running: dict[str, int] = {}
    for batch in batches:
        for channel, records in batch.planned.items():
            waiting = channel in batch.can_move and records == 0
            running[channel] = running.get(channel, 0) + 1 if waiting else 0
            longest[channel] = max(longest.get(channel, 0), running[channel])
    return longest


def test_a_skewed_backfill_streams_every_window_once_holding_the_partitions_ahead(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    writer, seconds = _skewed(broker, new_topic)
    for partition in SKEWED_SECONDS:
        writer.marker(partition, FINISHED)  # at its end: every window closes
    frame = aligned_events(
        spark, broker.bootstrap_servers, [writer.topic], writer.control_topic, **ALIGNED
    )
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    query = start_json(minute_counts(frame), checkpoint, output)
    try:
        settle(query)
    finally:
        query.stop()
    assert written_windows(output) == minute_windows(seconds)  # each exact, each once
    batches = check_alignment(checkpoint, channel_ends(writer), DRIFT_MS, BUDGET)
    _held_at_least_once(batches)
    # Never stalled: the budget was spent every plan, and a held partition waited no
    # longer than the others took to read what they had to come within the drift.
    assert len(batches) <= math.ceil(len(seconds) / (BUDGET - 4)) + 4, len(batches)
    slow = len(SKEWED_SECONDS[0]) + len(SKEWED_SECONDS[1])
    assert max(_longest_wait(batches).values()) <= math.ceil(slow / (BUDGET - 4))


def _held_committed(checkpoint: Path) -> bool:
    """A batch that held a partition back has committed."""
    return any(
        planned_batch(checkpoint, batch).slackwater_offset()["alignment"]["held"]
        for batch in batch_ids(checkpoint, "commits") & batch_ids(checkpoint, "offsets")
    )


# A Spark start of its own: on a machine busy with other work, longer than the suite's 300 s.
@pytest.mark.timeout(900)
def test_two_available_now_runs_with_a_sigkill_between_write_every_window_once(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """The first run, a process, dies (SIGKILL) inside a batch after one that held
    partitions back; the second goes on from the checkpoint: what is held follows from
    the offset, nothing kept in the dead run's memory."""
    writer, seconds = _skewed(broker, new_topic)
    for partition in SKEWED_SECONDS:
        writer.marker(partition, FINISHED)
    checkpoint, output, log = tmp_path / "checkpoint", tmp_path / "out", tmp_path / "run.log"
    arguments = ["--bootstrap", broker.bootstrap_servers, "--topic", writer.topic]
    arguments += ["--control", writer.control_topic, "--checkpoint", str(checkpoint)]
    arguments += ["--output", str(output)]
    arguments += [f"--option={name}={value}" for name, value in ALIGNED.items()]
    first = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.skewed_backfill", *arguments],
        cwd=ROOT,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL takes Spark's JVM too
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    try:
        wait_while_running(lambda: _held_committed(checkpoint), 600, "a held batch", first, log)
        killed = kill_inside_a_batch(first, checkpoint, log)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    assert written_windows(output) != minute_windows(seconds)  # the run did not end
    frame = aligned_events(
        spark, broker.bootstrap_servers, [writer.topic], writer.control_topic, **ALIGNED
    )
    run_to_end(start_json(minute_counts(frame), checkpoint, output, available_now=True))
    assert killed in batch_ids(checkpoint, "commits")  # run again by the second run
    assert written_windows(output) == minute_windows(seconds)
    batches = check_alignment(checkpoint, channel_ends(writer), DRIFT_MS, BUDGET)
    # The second run's first plan held too: from the offset the first run logged.
    assert batches[[b.batch_id for b in batches].index(killed) + 1].expected.held, killed


def test_a_bounded_run_holds_back_and_ends_with_every_window(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """endingOffsets: no marker; each partition FINISHES at its end."""
    writer, seconds = _skewed(broker, new_topic)
    frame = aligned_events(
        spark,
        broker.bootstrap_servers,
        [writer.topic],
        writer.control_topic,
        endingOffsets="latest",
        **ALIGNED,
    )
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    run_to_end(start_json(minute_counts(frame), checkpoint, output, available_now=True))
    assert written_windows(output) == minute_windows(seconds)
    batches = check_alignment(checkpoint, channel_ends(writer), DRIFT_MS, BUDGET)
    _held_at_least_once(batches)
    assert set(batches[-1].offset.statuses().values()) == {"FINISHED"}


def test_a_join_of_two_topics_holds_the_topic_ahead_and_joins_every_order_once(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Orders over an hour; payments only for its last ten minutes (two in three paid,
    3 s after the order): the payments topic runs ahead and is held back."""
    orders, payments = new_topic(partitions=2), new_topic(partitions=2)
    control = new_topic(prefix="ctl")
    order_writer = Writer(broker.bootstrap_servers, orders, control)
    payment_writer = Writer(broker.bootstrap_servers, payments, control)
    expected: dict[str, int | None] = {}  # order -> paid at (s)
    paid: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    for partition in (0, 1):
        for second in range(15 * partition, 3600, 30):
            order = f"o{second}"
            timed(order_writer, partition, second, order=order)
            expected[order] = second + 3 if second >= 3000 and second % 45 != 0 else None
            if expected[order] is not None:
                paid[second // 30 % 2].append((second + 3, order))
    for partition, records in paid.items():
        for second, order in sorted(records):  # each partition in event-time order
            timed(payment_writer, partition, second, order=order)
    for writer in (order_writer, payment_writer):
        for partition in (0, 1):
            writer.marker(partition, FINISHED)
    frame = aligned_events(
        spark,
        broker.bootstrap_servers,
        [orders, payments],
        control,
        eventTimeField="ts",
        maxWatermarkDrift=DRIFT,
        maxOffsetsPerTrigger="30",
    )
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    query = start_json(orders_joined_with_payments(frame, orders, payments), checkpoint, output)
    try:
        settle(query)
    finally:
        query.stop()
    rows = committed_rows(output)
    joined = {
        row["order_id"]: None if row.get("paid_at") is None else _seconds(row["paid_at"])
        for row in rows
    }
    assert len(rows) == len(expected)  # each order once
    assert joined == expected
    assert all(_seconds(row["order_time"]) == int(row["order_id"][1:]) for row in rows)
    ends = channel_ends(order_writer, payment_writer)
    batches = check_alignment(checkpoint, ends, DRIFT_MS, 30)
    assert any({f"{payments}:0", f"{payments}:1"} <= batch.expected.held for batch in batches)


def _seconds(iso: str) -> int:
    return (iso_ms(iso) - BASE_MS) // 1000


def test_every_partition_held_falls_back_to_the_furthest_behind_that_can_move(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Partition 0 is read to its end at 4 s and stays ACTIVE (no marker): the reference.
    Partitions 1 and 2, far ahead of it, are both held; the query does not stall: it
    reads the one further behind, and the other once within the drift of it."""
    topic, control = new_topic(partitions=3), new_topic(prefix="ctl")
    writer = Writer(broker.bootstrap_servers, topic, control)
    seconds = {0: range(0, 5), 1: range(1000, 1600, 10), 2: range(1300, 1900, 10)}
    for partition, written in seconds.items():
        writer.data(partition, *written)
    frame = aligned_events(
        spark, broker.bootstrap_servers, [topic], control, maxWatermarkDrift="1m",
        maxOffsetsPerTrigger="20",
    )  # fmt: skip
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"
    ends = channel_ends(writer)
    query = start_json(minute_counts(frame), checkpoint, output)
    try:
        settle(query)
        read = logged_batches(checkpoint, ends, 60_000)[-1].offset.data[topic]
        assert written_windows(output) == []  # partition 0 holds the valve at 3 s
        for partition in seconds:
            writer.marker(partition, FINISHED)
        settle(query)
    finally:
        query.stop()
    assert read == {str(p): end for p, end in writer.log_end.items()}  # all, no stall
    every = [second for written in seconds.values() for second in written]
    assert written_windows(output) == minute_windows(every)
    batches = check_alignment(checkpoint, ends, 60_000, 20)
    assert any(batch.expected.fell_back and batch.expected.held for batch in batches)


def test_idle_and_finished_partitions_are_never_waited_for_nor_unknown_event_times(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Partition 0 goes IDLE and 1 FINISHED at 9 s; 2 and 3 then run to 130 and 178 s,
    3 50 s ahead of 2, within the drift (1 minute) of it though not of the two at 9 s.
    Partition 4's records have no readable event time. The query stops and starts
    again between the two: what is held follows from the offset alone."""
    topic, control = new_topic(partitions=5), new_topic(prefix="ctl")
    writer = Writer(broker.bootstrap_servers, topic, control)
    for partition in range(4):
        timed(writer, partition, *range(10))
    writer.data(4, *range(10))  # value {}: no "ts", its event time unknown
    writer.marker(0, IDLE)
    writer.marker(1, FINISHED)
    checkpoint, output = tmp_path / "checkpoint", tmp_path / "out"

    def run(*marked: int) -> None:
        frame = aligned_events(
            spark, broker.bootstrap_servers, [topic], control, eventTimeField="ts",
            maxWatermarkDrift="1m", maxOffsetsPerTrigger="20",
        )  # fmt: skip
        query = start_json(minute_counts(frame), checkpoint, output)
        try:
            settle(query)
            for partition in marked:
                writer.marker(partition, FINISHED)
            settle(query)
        finally:
            query.stop()

    run()
    first_ends, first_last = channel_ends(writer), max(batch_ids(checkpoint, "offsets"))
    first = check_alignment(checkpoint, first_ends, 60_000, 20)
    timed(writer, 2, *range(30, 130, 2))
    timed(writer, 3, *range(80, 180, 2))
    writer.data(4, *range(50))
    run(0, 2, 3, 4)
    ends = channel_ends(writer)
    batches = first + check_alignment(checkpoint, ends, 60_000, 20, after=first_last)
    assert not [batch.batch_id for batch in batches if batch.expected.held]
    # Had IDLE and FINISHED been in the reference, partition 3 would have been held.
    waited = ("ACTIVE", "IDLE", "FINISHED")
    assert any(
        expected_alignment(batch.offset, ends, 60_000, waited).held
        for batch in batches
        if batch.batch_id > first_last
    )
    unknown = f"{topic}:4"
    assert all(batch.planned[unknown] for batch in batches if unknown in batch.can_move)
    assert batches[-1].raw["counters"].get("records_late", 0) == 0
    readable = [*range(10), *range(10), *range(10), *range(10)]
    readable += [*range(30, 130, 2), *range(80, 180, 2)]
    assert written_windows(output) == minute_windows(readable)
