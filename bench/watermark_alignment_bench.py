"""Watermark alignment on a skewed backfill (issue 43): the state store's rows at their
largest, batches and wall time, with and without alignment, beside Spark's own source.

    .venv/bin/python -m bench.watermark_alignment_bench                 # 6-8 minutes here
    .venv/bin/python -m bench.watermark_alignment_bench --runs ab       # without (c)
    .venv/bin/python -m bench.watermark_alignment_bench --max-offsets 6000 --runs bc

On Apache Kafka (`slackwater broker`'s launcher), a fresh topic of 16 partitions whose
backlogs cover different event-time spans, all ending at the same instant: 4 hold the
last day, 12 only the last hour (as after a retention difference, or a producer that
started later), each --rate records a second (every 7th record 500 ms early), each
record with one of --keys keys drawn at random (seeded: the same records every run).
In one local[2] SparkSession, each on a fresh checkpoint, under
trigger(availableNow=True) with maxOffsetsPerTrigger --max-offsets (shared by backlog
in offsets: each partition reads the same fraction of its backlog a batch, so the
hour's partitions run up to 23 hours ahead of the day's in event time), a count per
(1-minute window, key) into Spark's JSON file sink:

  (a) Spark's own format("kafka") source with withWatermark("timestamp", --delay);
  (b) the slackwater source, maxOutOfOrderness --delay, endingOffsets=latest;
  (c) (b) with maxWatermarkDrift --drift (watermark alignment).

For each: the state store's rows at their largest (stateOperators.numRowsTotal over the
run's progress) and the batch that had them, batches (with records), wall seconds from
start() to the run's end, and the (window, key) counts written against Spark's batch
groupBy of the same records: groups still open (not written, their window ending after
the run's last watermark), records dropped as late (the batch's counts less the written
ones over the windows the last watermark has passed), and whether every count is equal.
Before them, each source reads the topic once into the no-op sink, so that no row
carries Spark's start-up alone. Prints a markdown table; exits 1 if (b) or (c) wrote
counts other than the batch's (a bench is not a test, but a wrong answer must show).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.backfill_bench import Run, run, slackwater, spark_kafka
from bench.topics import create_led, produce_event_times
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.consume.job import spark_session

END_MS = 1_700_000_000_000  # every partition's newest event time
WINDOW_S = 60
PARTITIONS = 16
DAY = range(0, 4)  # the last day of event time
HOUR = range(4, 16)  # the last hour
SPAN_S = {**{p: 86_400 for p in DAY}, **{p: 3_600 for p in HOUR}}
WRITTEN_SCHEMA = "window_start timestamp, window_end timestamp, key string, records long"

ROWS = {
    "a": "(a) Spark's Kafka source + withWatermark",
    "b": "(b) slackwater source",
    "c": "(c) slackwater source + maxWatermarkDrift",
}


def event_times(rate: float, span_s: int) -> list[int]:
    """One partition's event times (ms) over the span ending at END_MS, rising, every
    7th record 500 ms early."""
    count = int(rate * span_s)
    step_ms = 1000 / rate
    start_ms = END_MS - int(count * step_ms)
    return [
        start_ms + int(index * step_ms) - (500 if index % 7 == 6 else 0) for index in range(count)
    ]


def produce(bootstrap: str, topic: str, rate: float, keys: int) -> dict[int, int]:
    """Writes every partition's records; returns each partition's log end."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    plan = {p: event_times(rate, span_s) for p, span_s in SPAN_S.items()}
    chosen = {p: random.Random(p) for p in plan}  # the same keys in every run
    return produce_event_times(
        producer, bootstrap, topic, plan, lambda p, _: b"k%d" % chosen[p].randrange(keys)
    )


def counted(events: DataFrame, time_column: str) -> DataFrame:
    """Records per (1-minute window, key): the job each run does."""
    return (
        events.groupBy(F.window(time_column, f"{WINDOW_S} seconds"), F.col("key").cast("string"))
        .agg(F.count(F.lit(1)).alias("records"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("key"),
            "records",
        )
    )


def batch_counts(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """Spark's batch groupBy of every record, the answer the runs are held to (cached)."""
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    batch = counted(records, "timestamp").select(
        "window_start", "key", F.col("records").alias("expected")
    )
    return batch.cache()


@dataclass
class Outcome:
    """One run against the batch groupBy."""

    written: int  # (window, key) groups written
    still_open: int  # groups not written whose window ends after the last watermark
    dropped: int  # records the batch counts and the run did not, in passed windows
    wrong: int  # groups whose written count is not the batch's

    @property
    def equal(self) -> bool:
        return self.wrong == 0 and self.still_open == 0


def compare(spark: SparkSession, batch: DataFrame, output: Path, watermark_ms: int) -> Outcome:
    """The written counts against the batch's, in Spark (some 10^5 groups)."""
    written = spark.read.schema(WRITTEN_SCHEMA).json(str(output)).drop("window_end")
    joined = batch.join(written, ["window_start", "key"], "full_outer")
    passed = (F.col("window_start").cast("long") + WINDOW_S) * 1000 <= watermark_ms
    expected, got = F.coalesce("expected", F.lit(0)), F.coalesce("records", F.lit(0))
    row = joined.agg(
        F.count("records").alias("written"),
        F.sum(F.when(F.col("records").isNull() & ~passed, 1).otherwise(0)).alias("open"),
        F.sum(F.when(passed, expected - got).otherwise(0)).alias("dropped"),
        F.sum(F.when(expected != got, 1).otherwise(0)).alias("wrong"),
        F.sum(F.when(got > expected, 1).otherwise(0)).alias("over"),
    ).first()
    assert row is not None
    assert row["over"] == 0, f"{output.name}: a group written with more than its records"
    distinct = written.select("window_start", "key").distinct().count()
    assert distinct == row["written"], f"{output.name}: a group written twice"
    return Outcome(int(row["written"]), int(row["open"]), int(row["dropped"]), int(row["wrong"]))


def state_rows(result: Run) -> list[int]:
    """numRowsTotal after each batch (the aggregation is the one state operator)."""
    return [
        sum(int(operator["numRowsTotal"]) for operator in progress["stateOperators"])
        for progress in result.progress
    ]


def timeline(rows: list[int], points: int = 12) -> str:
    """About ``points`` (batch: rows) samples, the largest among them."""
    step = max(1, len(rows) // points)
    marks = set(range(0, len(rows), step)) | {rows.index(max(rows))} if rows else set()
    return ", ".join(f"{b}: {rows[b]:,}" for b in sorted(marks))


def table(runs: dict[str, Run], outcomes: dict[str, Outcome], groups: int) -> str:
    lines = [
        "| run | max numRowsTotal (batch) | batches (with records) | wall s "
        "| groups written / in the batch groupBy | still open | records dropped as late "
        "| numRowsDroppedByWatermark | counts equal the batch groupBy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, result in runs.items():
        rows, outcome = state_rows(result), outcomes[key]
        with_records = sum(1 for p in result.progress if p["numInputRows"] > 0)
        lines.append(
            f"| {ROWS[key]} | {max(rows):,} ({rows.index(max(rows))}) "
            f"| {len(result.progress)} ({with_records}) | {result.seconds:.1f} "
            f"| {outcome.written:,} / {groups:,} | {outcome.still_open:,} "
            f"| {outcome.dropped:,} | {result.dropped_by_watermark():,} "
            f"| {'yes' if outcome.equal else f'no: {outcome.wrong:,} groups differ'} |"
        )
    for key, result in runs.items():
        lines.append(f"\n{ROWS[key]}, numRowsTotal by batch: {timeline(state_rows(result))}")
    if "b" in runs and "c" in runs:
        rows_b, rows_c = max(state_rows(runs["b"])), max(state_rows(runs["c"]))
        seconds = runs["c"].seconds / runs["b"].seconds
        lines.append(
            f"\nmax numRowsTotal (c) / (b) = {rows_c / rows_b:.3f} (target at most 0.2); "
            f"wall (c) / (b) = {seconds:.2f}"
        )
    return "\n".join(lines)


def frames(
    spark: SparkSession, bootstrap: str, topic: str, args: argparse.Namespace
) -> dict[str, DataFrame]:
    """The runs asked for, each a count per (window, key)."""
    limit = str(args.max_offsets)
    ours = {"maxOffsetsPerTrigger": limit, "endingOffsets": "latest"}
    built = {
        "a": lambda: counted(
            spark_kafka(spark, bootstrap, topic, args.max_offsets).withWatermark(
                "timestamp", f"{args.delay} seconds"
            ),
            "timestamp",
        ),
        "b": lambda: counted(
            slackwater(spark, bootstrap, topic, args.control, args.delay, **ours), "event_time"
        ),
        "c": lambda: counted(
            slackwater(
                spark,
                bootstrap,
                topic,
                args.control,
                args.delay,
                maxWatermarkDrift=args.drift,
                **ours,
            ),
            "event_time",
        ),
    }
    return {key: built[key]() for key in args.runs}


def measure(spark: SparkSession, bootstrap: str, topic: str, args: argparse.Namespace) -> int:
    """Warms both sources up, runs each variant, compares; returns the exit code."""
    tmp = Path(tempfile.mkdtemp(prefix="slackwater-alignment-"))
    batch = batch_counts(spark, bootstrap, topic)
    groups = batch.count()
    print(f"batch groupBy: {groups:,} (window, key) groups", flush=True)
    if "a" in args.runs:
        run(spark_kafka(spark, bootstrap, topic, None), "noop", tmp, "warm-up-kafka")
    run(slackwater(spark, bootstrap, topic, args.control, args.delay), "noop", tmp, "warm-up")
    runs: dict[str, Run] = {}
    outcomes: dict[str, Outcome] = {}
    for key, frame in frames(spark, bootstrap, topic, args).items():
        runs[key] = run(frame, "json", tmp, key)
        outcomes[key] = compare(spark, batch, tmp / key, runs[key].watermark_ms)
        print(f"{ROWS[key]}: {runs[key].seconds:.1f} s, {outcomes[key]}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(table(runs, outcomes, groups))
    wrong = [ROWS[key] for key in runs if key != "a" and not outcomes[key].equal]
    if wrong:
        print(f"WRONG: {', '.join(wrong)} wrote counts other than the batch groupBy's")
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1.0, help="records/s of a partition")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys")
    parser.add_argument("--max-offsets", type=int, default=3_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--delay", type=int, default=1, help="s: out-of-orderness, delay")
    parser.add_argument("--drift", default="3m", help="(c)'s maxWatermarkDrift")
    parser.add_argument("--runs", default="abc", help="which of a, b, c to run")
    args = parser.parse_args()
    # Record timestamps are from 2023: time-based retention must not delete them.
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        (topic,), _ = create_led(admin, "alignment-data", PARTITIONS)
        (args.control,), _ = create_led(admin, "alignment-control", 1)
        ends = produce(bootstrap, topic, args.rate, args.keys)
        print(f"produced {sum(ends.values()):,} records: {ends}", flush=True)
        spark = spark_session("slackwater-alignment-bench")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        code = measure(spark, bootstrap, topic, args)
        spark.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
