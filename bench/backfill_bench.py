"""Backfill under availableNow (issue 32): windows emitted, records dropped, time.

    .venv/bin/python -m bench.backfill_bench                      # about 40,000 records
    .venv/bin/python -m bench.backfill_bench --minutes 60 --rate 20 --max-offsets 50000

On Apache Kafka (`slackwater broker`'s launcher), a fresh topic of 16 partitions:
13 busy ones with --rate records a second each over --minutes of event time (every 7th
record 500 ms early), 2 idle ones whose records end at 20 s of event time and that the
emitter has marked IDLE at their log ends, and 1 finished one whose records end at 60 s,
marked FINISHED at its log end (markers written as the emitter writes them, with the
project's marker encoding). Then, in one local[2] SparkSession, each on a fresh
checkpoint, under trigger(availableNow=True) with maxOffsetsPerTrigger --max-offsets,
a count per 10-second window into Spark's JSON file sink:

  (a) Spark's own format("kafka") source with withWatermark("timestamp", --delay);
  (b) the slackwater source with maxOutOfOrderness --delay (the valve's watermark);
  (c) the slackwater source with endingOffsets=latest (a bounded run).

For each: the windows written, the windows Spark's batch groupBy(window) of the same
records has, those still open (not written, ending after the run's last watermark: the
next run writes them), the records dropped as late (the batch's counts minus the
written ones, over the windows the watermark has passed; and Spark's own
numRowsDroppedByWatermark, which counts an aggregation's partially aggregated rows),
batches (with records), and wall seconds from start() to the run's end. Before them,
each source reads the topic once into the no-op sink, so that no row carries Spark's
start-up alone. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.topics import create_led, produce_event_times
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus, encode
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream

BASE_MS = 1_700_000_000_000
WINDOW_S = 10
BUSY = range(0, 13)
IDLE = (13, 14)  # records over the first 20 s of event time, then IDLE
IDLE_UNTIL_S, IDLE_RATE = 20, 5
FINISHED = 15  # records over the first 60 s at --rate, then FINISHED
FINISHED_UNTIL_S = 60
PARTITIONS = 16


def event_times(rate: int, seconds: int) -> list[int]:
    """One partition's event times (ms), rising, every 7th record 500 ms early."""
    step = 1000 / rate
    return [
        BASE_MS + int(index * step) - (500 if index % 7 == 6 else 0)
        for index in range(rate * seconds)
    ]


def produce(bootstrap: str, topic: str, minutes: int, rate: int) -> dict[int, int]:
    """Writes every partition's records; returns each partition's log end."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000}
    )
    plan = {p: event_times(rate, minutes * 60) for p in BUSY}
    plan |= {p: event_times(IDLE_RATE, IDLE_UNTIL_S) for p in IDLE}
    plan[FINISHED] = event_times(rate, FINISHED_UNTIL_S)
    return produce_event_times(
        producer, bootstrap, topic, plan, lambda _, index: b"k%d" % (index % 10)
    )


def write_markers(bootstrap: str, control: str, topic: str, ends: dict[int, int]) -> None:
    """IDLE at the idle partitions' log ends, FINISHED at the finished one's, as the
    emitter writes them (semantics.md §3)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    statuses = {p: MarkerStatus.IDLE for p in IDLE} | {FINISHED: MarkerStatus.FINISHED}
    for partition, status in statuses.items():
        marker = Marker(
            topic=topic,
            partition=partition,
            status=status,
            offset=ends[partition],
            emitted_at=int(time.time() * 1000),
            emitter_id="backfill-bench",
            epoch=1,
            seq=0,
        )
        key, value = encode(marker)
        producer.produce(control, key=key, value=value)
    assert producer.flush(30) == 0


def _ms(stamp: Any) -> int:
    if isinstance(stamp, str):
        try:
            stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:  # past year 9999: FINISHED's watermark, every window passed
            return 2**62
    return int(stamp.timestamp() * 1000)


def batch_windows(spark: SparkSession, bootstrap: str, topic: str) -> dict[int, int]:
    """{window start ms: records}: Spark's batch groupBy(window) of every record."""
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    rows = records.groupBy(F.window("timestamp", f"{WINDOW_S} seconds")).count().collect()
    return {_ms(row["window"]["start"]): int(row["count"]) for row in rows}


def written_windows(spark: SparkSession, output: Path) -> dict[int, int]:
    """{window start ms: records} the file sink committed; a window written twice fails."""
    schema = "window_start timestamp, window_end timestamp, records long"
    rows = spark.read.schema(schema).json(str(output)).collect()
    written = {_ms(row["window_start"]): int(row["records"]) for row in rows}
    assert len(written) == len(rows), "a window was written twice"
    return written


def counted(events: DataFrame, time_column: str) -> DataFrame:
    return (
        events.groupBy(F.window(time_column, f"{WINDOW_S} seconds"))
        .agg(F.count(F.lit(1)).alias("records"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "records",
        )
    )


@dataclass
class Run:
    """What one availableNow run did."""

    seconds: float
    progress: list[dict[str, Any]]

    @property
    def watermark_ms(self) -> int:
        stamp = self.progress[-1]["eventTime"].get("watermark") if self.progress else None
        return _ms(stamp) if stamp else 0

    def dropped_by_watermark(self) -> int:
        return sum(
            int(operator.get("numRowsDroppedByWatermark", 0))
            for p in self.progress
            for operator in p["stateOperators"]
        )


def run(frame: DataFrame, sink: str, tmp: Path, name: str) -> Run:
    """One run under availableNow on a fresh checkpoint, timed from start() to its end."""
    writer = frame.writeStream.option("checkpointLocation", str(tmp / f"{name}-checkpoint"))
    if sink == "json":
        writer = writer.format("json").outputMode("append").option("path", str(tmp / name))
    else:
        writer = writer.format("noop")
    started = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    failure = query.exception()
    assert failure is None, f"{name} failed: {failure}"
    return Run(seconds, list(query.recentProgress))


def spark_kafka(spark: SparkSession, bootstrap: str, topic: str, limit: int | None) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if limit is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(limit))
    return reader.load()


def slackwater(
    spark: SparkSession, bootstrap: str, topic: str, control: str, delay_s: int, **options: str
) -> DataFrame:
    events = read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=[topic],
        control_topic=control,
        max_out_of_orderness=f"{delay_s}s",
        options=options,
    )
    return events.filter(F.col("event_time").isNotNull())


ROWS = {
    "a": "(a) Spark's Kafka source + withWatermark",
    "b": "(b) slackwater source, availableNow",
    "c": "(c) slackwater source, endingOffsets=latest",
}


def losses(result: Run, written: dict[int, int], batch: dict[int, int]) -> str:
    """Records missing from each written or passed window, by its start (s of event time)."""
    lost = {
        start: count - written.get(start, 0)
        for start, count in sorted(batch.items())
        if start + WINDOW_S * 1000 <= result.watermark_ms
    }
    where = [f"{(start - BASE_MS) // 1000} s: {n}" for start, n in lost.items() if n]
    return ", ".join(where) or "none"


def table(runs: dict[str, Run], written: dict[str, dict[int, int]], batch: dict[int, int]) -> str:
    lines = [
        "| run | windows written | windows in the batch groupBy | still open "
        "| records dropped as late | numRowsDroppedByWatermark | last watermark "
        "| batches (with records) | wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, name in ROWS.items():
        result, out = runs[key], written[key]
        assert all(out[start] <= batch[start] for start in out), "more than the records"
        passed = [s for s in batch if s + WINDOW_S * 1000 <= result.watermark_ms]
        still_open = [s for s in batch if s not in out and s not in passed]
        dropped = sum(batch[s] - out.get(s, 0) for s in passed)
        with_records = sum(1 for p in result.progress if p["numInputRows"] > 0)
        last = result.watermark_ms
        watermark = "the end" if last >= 2**62 else f"{(last - BASE_MS) / 1000:.1f} s"
        lines.append(
            f"| {name} | {len(out)} | {len(batch)} | {len(still_open)} | {dropped:,} "
            f"| {result.dropped_by_watermark():,} | {watermark} "
            f"| {len(result.progress)} ({with_records}) "
            f"| {result.seconds:.1f} |"
        )
    for key, name in ROWS.items():
        lines.append(
            f"\n{name}, records dropped by window: {losses(runs[key], written[key], batch)}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=5, help="busy partitions' event time")
    parser.add_argument("--rate", type=int, default=10, help="records/s of a busy partition")
    parser.add_argument("--max-offsets", type=int, default=4_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--delay", type=int, default=2, help="seconds: withWatermark's delay")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="slackwater-backfill-"))
    # Record timestamps are from 2023: time-based retention must not delete them.
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        (topic,), _ = create_led(admin, "backfill-data", PARTITIONS)
        (control,), _ = create_led(admin, "backfill-control", 1)
        ends = produce(bootstrap, topic, args.minutes, args.rate)
        write_markers(bootstrap, control, topic, ends)
        print(f"produced {sum(ends.values()):,} records: {ends}", flush=True)
        spark = spark_session("slackwater-backfill-bench")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
        batch = batch_windows(spark, bootstrap, topic)
        limit = str(args.max_offsets)
        run(spark_kafka(spark, bootstrap, topic, None), "noop", tmp, "warm-up-kafka")
        run(slackwater(spark, bootstrap, topic, control, args.delay), "noop", tmp, "warm-up")
        watermarked = spark_kafka(spark, bootstrap, topic, args.max_offsets).withWatermark(
            "timestamp", f"{args.delay} seconds"
        )
        frames = {
            "a": counted(watermarked, "timestamp"),
            "b": counted(
                slackwater(
                    spark, bootstrap, topic, control, args.delay, maxOffsetsPerTrigger=limit
                ),
                "event_time",
            ),
            "c": counted(
                slackwater(
                    spark,
                    bootstrap,
                    topic,
                    control,
                    args.delay,
                    maxOffsetsPerTrigger=limit,
                    endingOffsets="latest",
                ),
                "event_time",
            ),
        }
        runs: dict[str, Run] = {}
        written: dict[str, dict[int, int]] = {}
        for key, frame in frames.items():
            runs[key] = run(frame, "json", tmp, key)
            written[key] = written_windows(spark, tmp / key)
            print(f"{ROWS[key]}: {runs[key].seconds:.1f} s", flush=True)
        spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    print(table(runs, written, batch))


if __name__ == "__main__":
    main()
