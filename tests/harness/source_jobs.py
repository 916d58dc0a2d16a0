"""Running a user's Structured Streaming job on the slackwater source, for integration tests."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark_consumer.source import read_stream
from tests.harness.kafka_writer import BASE_MS


@dataclass
class WindowJob:
    """``groupBy(window(event_time), ...).count()`` in append mode into a memory table."""

    spark: SparkSession
    query: StreamingQuery
    table: str

    def settle(self) -> None:
        """Everything available processed, including the batches markers make."""
        self.query.processAllAvailable()
        failure = self.query.exception()
        assert failure is None, f"query failed: {failure}"

    def windows(self) -> dict[tuple[int, int], int]:
        """{(start s, end s): count} over all keys, in seconds after BASE_MS."""
        counts: dict[tuple[int, int], int] = {}
        for row in self.spark.sql(f"select window, count from {self.table}").collect():
            start = int(row["window"]["start"].timestamp() * 1000)
            end = int(row["window"]["end"].timestamp() * 1000)
            key = ((start - BASE_MS) // 1000, (end - BASE_MS) // 1000)
            counts[key] = counts.get(key, 0) + int(row["count"])
        return counts

    def rows(self) -> list[tuple[int, int]]:
        """Every (window start s, count) row, for exactly-once checks."""
        return sorted(
            (int(row["window"]["start"].timestamp() * 1000 - BASE_MS) // 1000, int(row["count"]))
            for row in self.spark.sql(f"select window, count from {self.table}").collect()
        )

    def watermark_ms(self) -> int | None:
        """The watermark Spark reports for the last batch (its own, the valve's)."""
        progress = self.query.lastProgress
        if not progress or "watermark" not in progress.get("eventTime", {}):
            return None
        from datetime import datetime

        stamp = progress["eventTime"]["watermark"]
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)

    def source_offset(self) -> dict[str, Any]:
        """The source's last planned offset (the valve's state is in it)."""
        import json

        progress = self.query.lastProgress
        assert progress is not None
        end = progress["sources"][0]["endOffset"]
        offset: dict[str, Any] = json.loads(end) if isinstance(end, str) else end
        return offset

    def stop(self) -> None:
        if self.query.isActive:
            self.query.stop()


def events(
    spark: SparkSession, bootstrap: str, topics: list[str], control: str | None, **options: Any
) -> DataFrame:
    return read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=topics,
        control_topic=control,
        max_out_of_orderness=options.pop("max_out_of_orderness", "1s"),
        **options,
    )


def window_job(
    spark: SparkSession,
    frame: DataFrame,
    tmp: Path,
    window: str = "5 seconds",
    trigger: str = "200 milliseconds",
) -> WindowJob:
    table = f"w_{uuid.uuid4().hex[:10]}"
    # Spark's own aggregation: it drops the rows whose windows have ended by the
    # watermark, and nothing else; rows without an event time have no window.
    readable = frame.filter(F.col("event_time").isNotNull())
    counted = readable.groupBy(F.window("event_time", window)).count()
    query = (
        counted.writeStream.outputMode("append")
        .format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp / f"checkpoint-{table}"))
        .trigger(processingTime=trigger)
        .start()
    )
    return WindowJob(spark, query, table)


def iso_ms(iso: str) -> int:
    """Epoch milliseconds of an ISO 8601 time as Spark's JSON sink writes it."""
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def late_output_rows(path: Path) -> list[dict[str, Any]]:
    """Every line of a late output directory (one JSON-lines file per source range)."""
    import json

    return [json.loads(line) for f in sorted(path.glob("*.json")) for line in f.open()]


WINDOW_S = 10
OUT_OF_ORDERNESS_S = 1


# The scheduled runs' job (tests/spark/test_source_available_now.py, test_source_connect.py).


class ScheduledJob:
    """A 10-second window count written to Spark's JSON file sink, run under
    availableNow on one checkpoint, once per ``run``."""

    def __init__(self, spark: SparkSession, bootstrap: str, topic: str, control: str, tmp: Path):
        self.spark, self.bootstrap, self.topic, self.control = spark, bootstrap, topic, control
        self.output = tmp / f"out-{uuid.uuid4().hex[:8]}"
        self.checkpoint = tmp / f"checkpoint-{uuid.uuid4().hex[:8]}"

    def run(self, **options: Any) -> list[dict[str, Any]]:
        """One run to its end; the progress of each batch it ran."""
        frame = events(
            self.spark,
            self.bootstrap,
            [self.topic],
            self.control,
            max_out_of_orderness=f"{OUT_OF_ORDERNESS_S}s",
            options={k: str(v) for k, v in options.items()},
        )
        counted = (
            frame.filter(F.col("event_time").isNotNull())
            .groupBy(F.window("event_time", f"{WINDOW_S} seconds"))
            .count()
        )
        query = (
            counted.writeStream.outputMode("append")
            .format("json")
            .option("path", str(self.output))
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        ended = query.awaitTermination(300)
        assert ended, "the availableNow run did not end"
        assert query.exception() is None, f"run failed: {query.exception()}"
        return list(query.recentProgress)

    def rows(self) -> list[tuple[int, int]]:
        """Every (window start s, count) row written, in order: a window twice shows."""
        if not self.output.exists():
            return []
        return sorted(
            ((iso_ms(row["window"]["start"]) - BASE_MS) // 1000, int(row["count"]))
            for part in self.output.glob("part-*.json")
            for row in map(json.loads, part.read_text().splitlines())
        )


def batch_windows(
    spark: SparkSession, bootstrap: str, topic: str, closed_by_ms: int
) -> list[tuple[int, int]]:
    """Spark's batch aggregation of the topic's records, read back by Spark's own Kafka
    reader: the (window start s, count) of every window that ends by ``closed_by_ms``."""
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    counted = records.groupBy(F.window("timestamp", f"{WINDOW_S} seconds")).count().collect()
    return sorted(
        ((int(row["window"]["start"].timestamp() * 1000) - BASE_MS) // 1000, int(row["count"]))
        for row in counted
        if int(row["window"]["end"].timestamp() * 1000) <= closed_by_ms
    )
