"""Watermark alignment's tests (issue 43, option ``maxWatermarkDrift``): a skewed
backfill's records, a one-minute window count through the source to Spark's JSON file
sink, and the rules every batch the query logged is checked against, computed from the
offset it logged (docs/source.md's text, not the planner's code).

Run as a process (``python -m tests.harness.skewed_backfill``) it is one availableNow
run of that count, so that a test can SIGKILL it between two runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark_consumer.consume.job import committed_rows
from spark_consumer.source import read_stream
from spark_consumer.source.wire.offset import SourceOffset
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_jobs import iso_ms
from tests.harness.spark_checkpoint import batch_ids, planned_batch

WINDOW_S = 60
OUT_OF_ORDERNESS = "1s"

# Two partitions whose records cover an hour, two whose records cover its last ten
# minutes: read as Kafka has them, the recent two run ahead of the others by most of an
# hour at first; 600 records in all.
SKEWED_SECONDS = {
    0: range(0, 3600, 24),
    1: range(12, 3600, 24),
    2: range(3000, 3600, 4),
    3: range(3002, 3600, 4),
}


def write_skewed(writer: Writer) -> list[int]:
    """``SKEWED_SECONDS`` to partitions 0-3 of the writer's topic; the seconds written."""
    for partition, seconds in SKEWED_SECONDS.items():
        writer.data(partition, *seconds)
    return [second for seconds in SKEWED_SECONDS.values() for second in seconds]


def timed(writer: Writer, partition: int, *seconds: int, **fields: object) -> None:
    """Records whose JSON value carries their event time under "ts" (the option
    ``eventTimeField``), with ``fields``; a record written by ``Writer.data`` has none."""
    for second in seconds:
        value = json.dumps({"ts": BASE_MS + second * 1000, **fields}).encode()
        writer.producer.produce(
            writer.topic, value=value, partition=partition, timestamp=BASE_MS + second * 1000
        )
        writer.log_end[partition] = writer.log_end.get(partition, 0) + 1
    assert writer.producer.flush(10) == 0


def channel_ends(*writers: Writer) -> dict[str, int]:
    """Every partition's log end, by channel ("topic:partition")."""
    return {f"{w.topic}:{p}": end for w in writers for p, end in w.log_end.items()}


def window_start_s(second: int) -> int:
    """The start of the one-minute window (Spark's, aligned to the epoch) of an event
    time ``second`` s after BASE_MS, in seconds after BASE_MS."""
    base_s = BASE_MS // 1000
    return (base_s + second) // WINDOW_S * WINDOW_S - base_s


def minute_windows(seconds: list[int]) -> list[tuple[int, int]]:
    """The batch aggregation in Python: (window start s, count), in order."""
    return sorted(Counter(window_start_s(second) for second in seconds).items())


# ---------------------------------------------------------------------- the job


def aligned_events(
    spark: SparkSession, bootstrap: str, topics: list[str], control: str, **options: str
) -> DataFrame:
    """The source on ``topics``, with the valve's watermark; ``options`` by their names
    (``maxWatermarkDrift``, ``maxOffsetsPerTrigger``, ...)."""
    return read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=topics,
        control_topic=control,
        max_out_of_orderness=OUT_OF_ORDERNESS,
        options=options,
    )


def minute_counts(frame: DataFrame) -> DataFrame:
    readable = frame.filter(F.col("event_time").isNotNull())
    return readable.groupBy(F.window("event_time", f"{WINDOW_S} seconds")).count()


def start_json(
    frame: DataFrame, checkpoint: Path, output: Path, *, available_now: bool = False
) -> StreamingQuery:
    """``frame`` appended to Spark's JSON file sink (exactly once, its metadata log)."""
    writer = (
        frame.writeStream.outputMode("append")
        .format("json")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="200 milliseconds").start()


def settle(query: StreamingQuery) -> None:
    """Everything available processed, the batches markers make too."""
    query.processAllAvailable()
    assert query.exception() is None, f"query failed: {query.exception()}"


def run_to_end(query: StreamingQuery) -> None:
    """An availableNow run, to its end."""
    assert query.awaitTermination(300), "the availableNow run did not end"
    assert query.exception() is None, f"run failed: {query.exception()}"


def written_windows(output: Path) -> list[tuple[int, int]]:
    """Every (window start s, count) the sink committed, in order: a window twice shows."""
    return sorted(
        ((iso_ms(row["window"]["start"]) - BASE_MS) // 1000, int(row["count"]))
        for row in committed_rows(output)
    )


def main(argv: list[str] | None = None) -> int:
    """One availableNow run of the minute count (a process a test may SIGKILL)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    from spark_consumer.consume.job import spark_session

    spark = spark_session("skewed-backfill")
    options = dict(option.split("=", 1) for option in args.option)
    frame = aligned_events(spark, args.bootstrap, [args.topic], args.control, **options)
    run_to_end(start_json(minute_counts(frame), args.checkpoint, args.output, available_now=True))
    spark.stop()
    return 0


# ---------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class Expected:
    """What the rules say of one plan: the channels held, the largest watermark minus
    the slowest ACTIVE one's among known channels that can move (None: none), whether
    the reference fell back to the channels that can move (every one was held)."""

    held: frozenset[str]
    furthest_ahead_ms: int | None
    fell_back: bool


def watermarks_ms(offset: SourceOffset) -> dict[str, int]:
    """Each channel's watermark, where known: its newest event time read so far less
    maxOutOfOrderness (the aligner's rows: [channel, status, position, max_offset,
    newest event ms, ...])."""
    out_of_orderness_ms = int(offset.aligner["max_out_of_orderness_ms"])
    return {
        row[0]: int(row[4]) - out_of_orderness_ms
        for row in offset.aligner["partitions"]
        if row[4] is not None
    }


def positions(offset: SourceOffset) -> dict[str, int]:
    """Each channel's read position when the batch was planned (its ranges' starts)."""
    return {
        f"{t}:{p}": start for t, parts in offset.data_from.items() for p, start in parts.items()
    }


def expected_alignment(
    offset: SourceOffset,
    ends: dict[str, int],
    drift_ms: int,
    reference_statuses: tuple[str, ...] | None = None,
) -> Expected:
    """The rules at the plan that logged ``offset`` (its own state: the read positions
    and event times the plan started from), ``ends`` being every log end.
    ``reference_statuses``: a counterfactual, the reference over partitions of these
    statuses instead of those the valve waits for."""
    marks = watermarks_ms(offset)
    # Rule 2: the valve waits for a partition ACTIVE and counted in its minimum (its
    # channel rows: [channel, watermark, status, aligned]).
    waited = {
        row[0]
        for row in offset.aligner["valve"]["channels"]
        if row[2] == "ACTIVE" and row[3] and offset.statuses().get(row[0]) == "ACTIVE"
    }
    can_move = {c for c, position in positions(offset).items() if position < ends.get(c, 0)}
    # Rule 3: only partitions waited for, of known watermark, that can move are held.
    candidates = {c for c in can_move & waited if c in marks}
    if reference_statuses is not None:
        statuses = offset.statuses()
        waited_or_not = {c for c in marks if statuses.get(c) in reference_statuses}
        reference = min((marks[c] for c in waited_or_not), default=None)
    else:
        reference = min((m for c, m in marks.items() if c in waited), default=None)
    held = _above(marks, candidates, reference, drift_ms)
    # The lead the metric shows: over the slowest partition waited for (docs/metrics.md),
    # the spread that keeps windows open, whether or not the batch fell back.
    ahead = (
        None
        if reference is None or not candidates
        else max(marks[c] - reference for c in candidates)
    )
    # Rule 5: every candidate held -> the furthest behind of them is read.
    fell_back = bool(candidates) and held == candidates
    if fell_back:
        held = _above(marks, candidates, min(marks[c] for c in candidates), drift_ms)
    return Expected(frozenset(held), ahead, fell_back)


def _above(
    marks: dict[str, int], known: set[str], reference: int | None, drift_ms: int
) -> set[str]:
    if reference is None:
        return set()
    return {c for c in known if marks[c] - reference > drift_ms}


def _source_offset(checkpoint: Path, batch_id: int) -> dict[str, Any]:
    """The source's offset in offsets/N: a join of two topics reads the one source on
    both sides, which Spark logs once per side, one plan."""
    sources = planned_batch(checkpoint, batch_id).sources
    offsets: list[dict[str, Any]] = [s for s in sources if isinstance(s, dict) and "aligner" in s]
    assert offsets and all(o == offsets[0] for o in offsets), f"batch {batch_id}: {offsets}"
    return offsets[0]


@dataclass(frozen=True)
class Batch:
    """One plan the query logged (offsets/N), and what the rules say of it."""

    batch_id: int
    raw: dict[str, Any]
    offset: SourceOffset
    expected: Expected
    planned: dict[str, int]  # records planned per channel (every channel, 0 too)
    can_move: frozenset[str]


def logged_batches(
    checkpoint: Path, ends: dict[str, int], drift_ms: int, after: int = -1
) -> list[Batch]:
    """Every plan in the checkpoint's offset log after batch ``after``, once (a no-data
    batch logs its predecessor's offset again), with the rules' verdict on each."""
    batches: list[Batch] = []
    for batch_id in sorted(b for b in batch_ids(checkpoint, "offsets") if b > after):
        raw = _source_offset(checkpoint, batch_id)
        if batches and batches[-1].raw["plan_id"] == raw["plan_id"]:
            continue
        offset = SourceOffset.decode(raw)
        planned = dict.fromkeys(positions(offset), 0)
        for topic, partition, start, end in offset.ranges():
            planned[f"{topic}:{partition}"] = end - start
        at = positions(offset)
        can_move = frozenset(c for c, position in at.items() if position < ends.get(c, 0))
        expected = expected_alignment(offset, ends, drift_ms)
        batches.append(Batch(batch_id, raw, offset, expected, planned, can_move))
    return batches


def check_alignment(
    checkpoint: Path, ends: dict[str, int], drift_ms: int, budget: int, after: int = -1
) -> list[Batch]:
    """Every plan the query logged (after batch ``after``) against the rules, ``ends``
    being the log ends while they were planned; the plans, for more checks.

    Per plan: the offset carries "alignment"; how many it says it held and how far
    ahead are the rules'; no channel the rules hold has records planned; the budget
    goes to the channels not held; and it never stalls: while a channel can move,
    records are planned, the furthest behind among them too."""
    batches = logged_batches(checkpoint, ends, drift_ms, after)
    assert batches, "no batch was logged"
    ahead: list[str] = []  # the plans whose furthest_ahead_ms is not the rules' (said last)
    for batch in batches:
        where = f"batch {batch.batch_id} ({batch.raw.get('alignment')}, {batch.planned})"
        alignment = batch.raw.get("alignment")
        assert isinstance(alignment, dict), f"{where}: no alignment in the offset"
        assert alignment["held"] == len(batch.expected.held), where  # how many
        assert not [c for c in batch.expected.held if batch.planned[c]], where
        _check_budget(batch, ends, budget, where)
        if alignment["furthest_ahead_ms"] != batch.expected.furthest_ahead_ms:
            ahead.append(f"{where}: the rules say {batch.expected}")
    assert not ahead, "furthest_ahead_ms:\n" + "\n".join(ahead)
    return batches


def _check_budget(batch: Batch, ends: dict[str, int], budget: int, where: str) -> None:
    """The budget goes to the channels not held (rounded down per channel), and the
    channel furthest behind that can move is read."""
    at = positions(batch.offset)
    free = {c: ends[c] - at[c] for c in batch.can_move - batch.expected.held}
    total = sum(batch.planned.values())
    if not batch.can_move:
        assert total == 0, where
        return
    assert free, f"{where}: every channel that can move is held"
    assert total <= budget + len(free), where
    assert total >= min(budget, sum(free.values())) - len(free), where
    marks = watermarks_ms(batch.offset)
    if all(c in marks for c in batch.can_move):
        behind = min(batch.can_move, key=lambda c: marks[c])
        assert batch.planned[behind] > 0, f"{where}: {behind}, furthest behind, not read"


def batches_bound(records: int, budget: int, channels: int) -> int:
    """Plans enough to read ``records`` when every plan spends its budget (rounded down
    per channel) on channels not held, and a few without records (markers, the last
    watermark)."""
    return math.ceil(records / (budget - channels)) + 4


if __name__ == "__main__":
    sys.exit(main())
