"""Scheduled runs (issue 32): ``trigger(availableNow=True)`` on the source, and bounded
runs (``endingOffsets``), on Apache Kafka. Each run's windows are checked against
Spark's batch ``groupBy(window)`` over the topic's records read back with Spark's own
Kafka reader: the windows the rules allow (docs/source.md, "Scheduled and bounded
runs"), each written exactly once across runs on one checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from slackwater.markers import MarkerStatus
from spark_consumer.source import SourceError
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_jobs import (
    OUT_OF_ORDERNESS_S,
    WINDOW_S,
    ScheduledJob,
    batch_windows,
    events,
)
from tests.harness.spark_checkpoint import batch_ids, planned_batch


@pytest.fixture
def scheduled(
    spark: SparkSession, broker: Any, new_topic: Callable[..., str], tmp_path: Path
) -> tuple[ScheduledJob, Writer]:
    topic, control = new_topic(partitions=3), new_topic(prefix="control")
    return (
        ScheduledJob(spark, broker.bootstrap_servers, topic, control, tmp_path),
        Writer(broker.bootstrap_servers, topic, control),
    )


def _write_seconds(writer: Writer, seconds: range) -> None:
    """Records at ``seconds``, dealt round the three partitions (each in order)."""
    for second in seconds:
        writer.data(second % 3, second)


def _idle_all(writer: Writer) -> None:
    for partition in range(3):
        writer.marker(partition, MarkerStatus.IDLE)


def _valve_when_all_idle(seconds: range) -> int:
    """DESIGN §5 rule 2: with every channel IDLE, the output is the flush, the highest
    channel watermark, a channel's being its newest event time less the bound."""
    return BASE_MS + (max(seconds) - OUT_OF_ORDERNESS_S) * 1000


def test_a_run_reads_to_the_ends_in_batches_of_max_offsets_per_trigger_and_emits_what_markers_allow(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    first = range(0, 150)
    _write_seconds(writer, first)
    _idle_all(writer)
    progress = job.run(maxOffsetsPerTrigger=50)
    read = [p["numInputRows"] for p in progress]
    # 150 records in batches of at most 50 (+1: the synthetic row a batch may carry).
    assert len([r for r in read if r > 1]) >= 3, read
    assert max(read) <= 51, read
    expected = batch_windows(
        spark, broker.bootstrap_servers, job.topic, _valve_when_all_idle(first)
    )
    assert expected, "the reference has closed windows"
    assert job.rows() == expected


def test_the_next_run_on_the_checkpoint_goes_on_where_the_last_stopped(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 150))
    _idle_all(writer)
    job.run(maxOffsetsPerTrigger=50)
    both = range(0, 300)
    _write_seconds(writer, range(150, 300))
    _idle_all(writer)
    job.run(maxOffsetsPerTrigger=50)
    expected = batch_windows(spark, broker.bootstrap_servers, job.topic, _valve_when_all_idle(both))
    assert job.rows() == expected  # each window once: none twice, none skipped


def test_a_partition_read_to_its_end_without_a_marker_holds_the_runs_windows(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 60))
    writer.marker(0, MarkerStatus.IDLE)
    writer.marker(1, MarkerStatus.IDLE)  # partition 2's newest record is at 59 s
    job.run()
    # The valve: the min over the ACTIVE channel, partition 2's 59 s less 1 s.
    holds = BASE_MS + (59 - OUT_OF_ORDERNESS_S) * 1000
    expected = batch_windows(spark, broker.bootstrap_servers, job.topic, holds)
    assert job.rows() == expected
    assert [start for start, _ in expected] == [0, 10, 20, 30, 40]


def test_records_written_after_a_run_starts_wait_for_the_next_run(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 30))
    _idle_all(writer)
    frame = events(spark, broker.bootstrap_servers, [job.topic], job.control)
    counted = (
        frame.filter(F.col("event_time").isNotNull())
        .groupBy(F.window("event_time", f"{WINDOW_S} seconds"))
        .count()
    )
    written: list[tuple[int, int]] = []
    runs = 0

    def batch(rows: Any, batch_id: int) -> None:
        for row in rows.collect():  # (collected: the batch's state stores commit)
            start_ms = int(row["window"]["start"].timestamp() * 1000)
            written.append(((start_ms - BASE_MS) // 1000, int(row["count"])))
        if runs == 1 and batch_id == 0:  # while the run runs: records, markers at their ends
            _write_seconds(writer, range(30, 90))
            _idle_all(writer)

    def run() -> list[Any]:
        query = (
            counted.writeStream.outputMode("append")
            .foreachBatch(batch)
            .option("checkpointLocation", str(job.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(300), "the run did not end"
        assert query.exception() is None
        return list(query.recentProgress)

    runs = 1
    first = run()
    ends = json.loads(first[-1]["sources"][0]["endOffset"])["topics"][job.topic]["end"]
    assert ends == [10, 10, 10]  # the ends seen when the run started: no further
    assert sorted(written) == batch_windows(
        spark, broker.bootstrap_servers, job.topic, _valve_when_all_idle(range(0, 30))
    )
    # The next run sees the ends when it starts: all of them, each window once.
    runs = 2
    run()
    expected = batch_windows(
        spark, broker.bootstrap_servers, job.topic, _valve_when_all_idle(range(0, 90))
    )
    assert expected[-1][0] == 70
    assert sorted(written) == expected


def test_a_bounded_run_emits_every_window_and_ends(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 95))  # no marker at all: FINISHED at the ends
    job.run(endingOffsets="latest", maxOffsetsPerTrigger=40)
    expected = batch_windows(spark, broker.bootstrap_servers, job.topic, 2**62)
    assert [start for start, _ in expected] == list(range(0, 100, 10))
    assert job.rows() == expected


def test_a_bounded_checkpoint_runs_again_to_the_same_ends_and_refuses_to_go_past_them(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 40))
    first = job.run(endingOffsets="latest")
    once = job.rows()
    _write_seconds(writer, range(40, 60))
    again = job.run(endingOffsets="latest")  # the kept ends: nothing more, nothing twice
    assert job.rows() == once
    assert all(p["numInputRows"] == 0 for p in again), again  # nothing read, not dropped
    ends = [json.loads(p["sources"][0]["endOffset"]) for p in (first[-1], *again)]
    assert {json.dumps(e["topics"]) for e in ends} == {json.dumps(ends[0]["topics"])}
    with pytest.raises(Exception, match="option 'endingOffsets' is left out"):
        job.run()


def test_ending_offsets_given_per_partition_end_there(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 30))  # 10 records per partition
    job.run(endingOffsets=json.dumps({job.topic: {"0": 5, "1": -1}}))  # 2: not named, its end
    read = sorted(s for s in range(0, 30) if (s % 3 == 0 and s // 3 < 5) or s % 3 in (1, 2))
    assert sum(count for _, count in job.rows()) == len(read)
    assert job.rows() == sorted(
        (start, sum(1 for s in read if start <= s < start + WINDOW_S))
        for start in range(0, 30, WINDOW_S)
    )


def test_ending_offsets_without_available_now_is_refused_in_one_line(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer], tmp_path: Path
) -> None:
    job, writer = scheduled
    _write_seconds(writer, range(0, 3))
    frame = events(
        spark,
        broker.bootstrap_servers,
        [job.topic],
        job.control,
        options={"endingOffsets": "latest"},
    )
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    with pytest.raises(Exception, match=r"start the query with trigger\(availableNow=True\)"):
        query.awaitTermination(120)


def test_an_unreadable_ending_offsets_is_named() -> None:
    from spark_consumer.source.shared.options import SourceOptions

    base = {"kafka.bootstrap.servers": "localhost:1", "subscribe": "t"}
    for wrong in ('{"t": {"0": -2}}', "[1]", "yesterday", '{"t": {"0": "5"}}'):
        with pytest.raises(SourceError, match="option 'endingOffsets' must be latest"):
            SourceOptions.parse({**base, "endingOffsets": wrong})
    assert SourceOptions.parse({**base, "endingOffsets": " LATEST "}).ending_offsets == "latest"
    # One spelling, so that a restart with the same offsets spelt otherwise is the same.
    spelt = SourceOptions.parse({**base, "endingOffsets": '{ "t" : {"1": 4, "0": -1} }'})
    assert spelt.ending_offsets == '{"t":{"0":-1,"1":4}}'
    with pytest.raises(SourceError, match=r"names topic\(s\) orderz, which the query does not"):
        SourceOptions.parse({**base, "endingOffsets": '{"orderz": {"0": 5}}'})


def _forget_last_batch(job: ScheduledJob) -> int:
    """The checkpoint and the sink as a run SIGKILLed before it planned its last batch
    leaves them: offsets/N, commits/N, the sink's metadata log entry N and the files it
    lists, gone. Returns N."""
    last = max(batch_ids(job.checkpoint, "commits"))
    entry = job.output / "_spark_metadata" / str(last)
    for line in entry.read_text().splitlines()[1:]:  # "v1", then one file per line
        Path(json.loads(line)["path"].removeprefix("file://")).unlink()
    for folder in (job.checkpoint / "offsets", job.checkpoint / "commits", entry.parent):
        for name in (str(last), f".{last}.crc"):  # (Hadoop's checksum beside each file)
            (folder / name).unlink(missing_ok=True)
    return last


def test_a_run_killed_before_spark_applied_its_last_watermark_writes_those_windows_next(
    spark: SparkSession, broker: Any, scheduled: tuple[ScheduledJob, Writer]
) -> None:
    """Spark owes a no-data batch for a watermark that moved only while the run that
    moved it lives: a run killed right after the batch that planned it would leave the
    windows it closes unwritten, a bounded run's for good (its checkpoint goes on to the
    same ends alone). Each run's last batch applies the watermark its plan moved."""
    job, writer = scheduled
    _write_seconds(writer, range(0, 45))
    job.run(endingOffsets="latest")
    every = batch_windows(spark, broker.bootstrap_servers, job.topic, 2**62)
    assert job.rows() == every
    last = _forget_last_batch(job)
    before = planned_batch(job.checkpoint, last - 1).slackwater_offset()
    assert before["watermark"] > before["late_threshold"]  # planned, not applied yet
    assert job.rows() != every  # that batch wrote the last windows
    job.run(endingOffsets="latest")
    assert job.rows() == every
