"""The slackwater pipeline: data and control topics through the valve into windows.

One streaming query reads the data topic and the control topic together (the
``slackwater-kafka`` source with read-position rows). Each micro-batch, in
``foreachBatch``:

1. Spark computes, per data record, its event time and key; per partition,
   the record count, newest event time and highest offset; records whose
   event time cannot be read, and records older than the valve watermark as
   it stood when the batch began, go to the late output with their reason.
2. The driver collects the small things (markers, read positions, the
   per-partition statistics), aligns the markers (:mod:`alignment`) and
   advances the valve.
3. Spark merges this batch's window counts with the open windows kept from
   the previous batch, writes the windows whose end <= the new valve
   watermark to the output, and keeps the rest open.

Exactly once: everything a batch produces is a function of its input and the
state saved by the previous batch id. Outputs are written aside and renamed
to ``batch-<id>``; the state of batch N (open windows, valve, pending
markers) is saved under the checkpoint only after its outputs. A batch that
Spark replays after a crash finds the state of N-1, computes the same
result, and leaves an already-renamed output as it is.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from emitter.markers import MalformedControlRecord, Marker, decode
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.config import ConsumerConfig
from spark_consumer.kafka_source import POSITION_ROW_TIMESTAMP_TYPE, SOURCE_NAME, KafkaDataSource
from spark_consumer.valve import MIN_WATERMARK, Watermark, WatermarkStatus

log = logging.getLogger(__name__)

STATE_DIR = "slackwater"
KEEP_STATES = 5
ISO_UTC = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


@dataclass
class BatchReport:
    """What one micro-batch did (for metrics, logs and tests)."""

    batch_id: int
    records: int = 0
    late: int = 0
    unreadable: int = 0
    windows_emitted: int = 0
    markers_read: int = 0
    control_malformed: int = 0
    watermark_before: int = MIN_WATERMARK
    watermark_after: int = MIN_WATERMARK
    valve_status: str = "ACTIVE"
    emitted: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    replayed: bool = False


def _utc_iso(column: Column) -> Column:
    """ISO 8601 in UTC whatever the session time zone."""
    return F.date_format(F.to_utc_timestamp(column, F.current_timezone()), ISO_UTC)


class SlackwaterBatch:
    """The ``foreachBatch`` function; holds paths and config, all state lives on disk."""

    def __init__(
        self,
        config: ConsumerConfig,
        on_batch: Callable[[BatchReport, MarkerAligner], None] | None = None,
        partitions_of: Callable[[], list[int]] | None = None,
    ) -> None:
        self.config = config
        self.state_root = Path(config.checkpoint) / STATE_DIR
        self.output = Path(config.output)
        self.late_output = Path(config.effective_late_output)
        self.on_batch = on_batch
        self.partitions_of = partitions_of

    # ----------------------------------------------------------------- state

    def _state_dir(self, batch_id: int) -> Path:
        # Zero-padded, so that names sort as batch ids do.
        return self.state_root / f"state-{batch_id:012d}"

    def _load(self, batch_id: int) -> tuple[MarkerAligner, Path | None]:
        """The state saved by the newest batch before ``batch_id``."""
        this = self._state_dir(batch_id).name
        earlier = sorted(p for p in self.state_root.glob("state-*") if p.name < this)
        if not earlier:
            return MarkerAligner(
                self.config.topic,
                self.config.max_out_of_orderness_ms,
                consumer_idle_timeout_ms=self.config.consumer_idle_timeout_ms,
            ), None
        path = earlier[-1]
        snapshot = json.loads((path / "driver.json").read_text())
        open_windows = path / "open"
        return MarkerAligner.restore(snapshot), open_windows if open_windows.exists() else None

    def _save(self, batch_id: int, aligner: MarkerAligner, open_windows: DataFrame) -> None:
        final = self._state_dir(batch_id)
        if final.exists():
            return  # a replayed batch: the same state was saved before the crash
        temporary = self.state_root / f".tmp-state-{batch_id:012d}"
        shutil.rmtree(temporary, ignore_errors=True)
        open_windows.write.parquet(str(temporary / "open"))
        (temporary / "driver.json").write_text(json.dumps(aligner.snapshot()))
        os.replace(temporary, final)
        states = sorted(self.state_root.glob("state-*"))
        for old in states[:-KEEP_STATES]:
            shutil.rmtree(old, ignore_errors=True)

    # ---------------------------------------------------------------- batch

    def __call__(self, frame: DataFrame, batch_id: int) -> None:  # noqa: PLR0915
        started = time.perf_counter()
        config = self.config
        spark = frame.sparkSession
        self.state_root.mkdir(parents=True, exist_ok=True)
        aligner, open_path = self._load(batch_id)
        report = BatchReport(batch_id, watermark_before=aligner.valve.watermark)
        report.replayed = self._state_dir(batch_id).exists()
        if self.partitions_of is not None:
            aligner.ensure_partitions(self.partitions_of())

        is_position = F.col("timestampType") == POSITION_ROW_TIMESTAMP_TYPE
        is_control = (F.col("topic") == config.control_topic) & ~is_position
        is_data = (F.col("topic") == config.topic) & ~is_position
        event_time, key = self._event_time_and_key()
        # One narrow projection, cached: every job below reads it instead of Kafka.
        frame = frame.select(
            "topic",
            "partition",
            "offset",
            "timestampType",
            F.when(is_control, F.col("key")).alias("control_key"),
            F.when(is_control, F.col("value")).alias("control_value"),
            F.when(is_data, event_time).alias("event_time_ms"),
            F.when(is_data, key).alias("key"),
        ).persist()
        try:
            small = (
                frame.where(is_control | ((F.col("topic") == config.topic) & is_position))
                .select("topic", "partition", "offset", "control_key", "control_value")
                .orderBy("topic", "partition", "offset")
                .collect()
            )
            control = [row for row in small if row.topic == config.control_topic]
            positions = {int(r.partition): int(r.offset) for r in small if r.topic == config.topic}
            data = frame.where(is_data).select(
                "topic", "partition", "offset", "event_time_ms", "key"
            )
            watermark_before = aligner.valve.watermark
            data = data.withColumn(
                "reason",
                F.when(F.col("event_time_ms").isNull(), F.lit("unreadable event time")).when(
                    F.col("event_time_ms") < F.lit(watermark_before), F.lit("late")
                ),
            )
            stats = {
                int(row.partition): row
                for row in data.groupBy("partition")
                .agg(
                    F.count(F.lit(1)).alias("records"),
                    F.max("event_time_ms").alias("max_event_time_ms"),
                    F.max("offset").alias("max_offset"),
                    F.sum(F.when(F.col("reason") == "late", 1).otherwise(0)).alias("late"),
                    F.sum(F.when(F.col("reason") == "unreadable event time", 1).otherwise(0)).alias(
                        "unreadable"
                    ),
                )
                .collect()
            }
            for row in control:
                try:
                    record = decode(row.control_key, row.control_value)
                except MalformedControlRecord as error:
                    report.control_malformed += 1
                    log.warning("skipping malformed control record: %s", error)
                    continue
                if isinstance(record, Marker):
                    report.markers_read += 1
                    aligner.offer(record)
            batch = {
                partition: PartitionBatch(
                    records=int(row.records) if row is not None else 0,
                    max_event_time_ms=(
                        int(row.max_event_time_ms)
                        if row is not None and row.max_event_time_ms is not None
                        else None
                    ),
                    max_offset=int(row.max_offset) if row is not None else -1,
                    read_position=positions.get(partition),
                )
                for partition in sorted(set(stats) | set(positions))
                for row in [stats.get(partition)]
            }
            emitted = aligner.advance(batch, now_ms=time.time_ns() // 1_000_000)
            report.emitted = [describe(element) for element in emitted]
            watermark_after = aligner.valve.watermark
            report.records = sum(int(r.records) for r in stats.values())
            report.late = sum(int(r.late) for r in stats.values())
            report.unreadable = sum(int(r.unreadable) for r in stats.values())

            if report.late or report.unreadable:
                late = (
                    data.where(F.col("reason").isNotNull())
                    .select(
                        "topic",
                        "partition",
                        "offset",
                        F.col("event_time_ms"),
                        F.when(
                            F.col("event_time_ms").isNotNull(),
                            _utc_iso(F.timestamp_millis(F.col("event_time_ms"))),
                        ).alias("event_time"),
                        "reason",
                    )
                    .orderBy("partition", "offset")
                )
                self._publish(late, self.late_output, batch_id, "json")

            on_time = data.where(F.col("reason").isNull())
            merged = self._merge_windows(spark, on_time, open_path).persist()
            try:
                closed = merged.where(F.col("window_end_ms") <= F.lit(watermark_after))
                report.windows_emitted = closed.count()
                if report.windows_emitted:
                    self._publish(
                        closed.orderBy("window_start_ms", "key").select(
                            _utc_iso(F.timestamp_millis("window_start_ms")).alias("window_start"),
                            _utc_iso(F.timestamp_millis("window_end_ms")).alias("window_end"),
                            "key",
                            "count",
                        ),
                        self.output,
                        batch_id,
                        config.output_format,
                    )
                self._save(
                    batch_id, aligner, merged.where(F.col("window_end_ms") > F.lit(watermark_after))
                )
            finally:
                merged.unpersist()
        finally:
            frame.unpersist()
        report.watermark_after = aligner.valve.watermark
        report.valve_status = aligner.valve.status.value
        report.duration_s = time.perf_counter() - started
        log.info(
            "batch %d: %d records, %d late, %d unreadable, %d windows, watermark %s, %s",
            batch_id,
            report.records,
            report.late,
            report.unreadable,
            report.windows_emitted,
            report.watermark_after,
            report.valve_status,
        )
        if self.on_batch is not None:
            self.on_batch(report, aligner)

    # --------------------------------------------------------------- pieces

    def _event_time_and_key(self) -> tuple[Column, Column]:
        """Event time (ms; null if unreadable) and key of a data record, as Spark columns."""
        config = self.config
        text = F.col("value").cast("string")
        if config.event_time_field is None:
            event_time = F.unix_millis(F.col("timestamp"))
        else:
            raw = F.get_json_object(text, f"$.{config.event_time_field}")
            event_time = F.when(raw.rlike(r"^-?[0-9]+$"), raw.try_cast("long")).otherwise(
                F.unix_millis(F.try_to_timestamp(raw))
            )
        if config.key_field is None:
            key = F.col("key").cast("string")
        else:
            key = F.get_json_object(text, f"$.{config.key_field}")
        return event_time, key

    def _merge_windows(
        self, spark: SparkSession, on_time: DataFrame, open_path: Path | None
    ) -> DataFrame:
        window_ms, slide_ms = self.config.window_ms, self.config.effective_slide_ms
        # Every window [start, start + window) with start a multiple of slide
        # that contains the event time (Spark's window() without its offset).
        last_start = F.floor(F.col("event_time_ms") / slide_ms) * slide_ms
        starts = F.sequence(last_start - (window_ms - slide_ms), last_start, F.lit(slide_ms))
        partial = (
            on_time.select(F.explode(starts).alias("window_start_ms"), "key")
            .withColumn("window_end_ms", F.col("window_start_ms") + F.lit(window_ms))
            .groupBy("window_start_ms", "window_end_ms", "key")
            .agg(F.count(F.lit(1)).alias("count"))
        )
        if open_path is not None:
            partial = partial.unionByName(spark.read.parquet(str(open_path)))
        return partial.groupBy("window_start_ms", "window_end_ms", "key").agg(
            F.sum("count").cast("long").alias("count")
        )

    @staticmethod
    def _publish(rows: DataFrame, root: Path, batch_id: int, output_format: str) -> None:
        """Writes aside, then renames to ``batch-<id>``: readers see whole batches only."""
        final = root / f"batch-{batch_id:012d}"
        if final.exists():
            return  # a replayed batch: this output was complete before the crash
        temporary = root / f".tmp-batch-{batch_id:012d}"
        shutil.rmtree(temporary, ignore_errors=True)
        writer = rows.coalesce(1).write.mode("overwrite")
        if output_format == "parquet":
            writer.parquet(str(temporary))
        else:
            writer.json(str(temporary))
        root.mkdir(parents=True, exist_ok=True)
        os.replace(temporary, final)


def spark_session(app_name: str = "slackwater", cores: int = 2) -> SparkSession:
    """A local SparkSession set up for slackwater (the Python workers use this interpreter),
    with Spark's own Kafka source on its classpath."""
    import sys

    from emitter.jars import SPARK_KAFKA, fetched_jar_files

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        # Spark's own format("kafka") (the baseline), fetched at set-up: only the jars
        # pyspark lacks (deploy/jars/spark-kafka/pom.xml), never a second copy of Spark's.
        # Optional: slackwater's own source does not need them (a container image).
        .config("spark.jars", ",".join(str(jar) for jar in fetched_jar_files(SPARK_KAFKA)))
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def start(
    spark: SparkSession,
    config: ConsumerConfig,
    on_batch: Callable[[BatchReport, MarkerAligner], None] | None = None,
) -> StreamingQuery:
    """Starts the pipeline in your own SparkSession; returns the running query."""
    spark.dataSource.register(KafkaDataSource)
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("subscribe", f"{config.topic},{config.control_topic}")
        .option("startingOffsets", config.starting_offsets)
        .option("includeReadPositions", "true")
    )
    for key, value in config.kafka_config.items():
        reader = reader.option(f"kafka.{key}", value)
    batch = SlackwaterBatch(config, on_batch, partitions_of=_partition_lister(config))
    return (
        reader.load()
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(Path(config.checkpoint) / "spark"))
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
        .queryName(f"slackwater-{config.topic}")
        .start()
    )


def _partition_lister(config: ConsumerConfig) -> Callable[[], list[int]]:
    """Every partition of the data topic, so that one without data yet holds the watermark.

    A short-lived Admin client per call: one metadata request per micro-batch, and no
    client that outlives the query.
    """
    from confluent_kafka.admin import AdminClient

    settings: dict[str, str | int | float | bool] = {
        **config.kafka_config,
        "bootstrap.servers": config.bootstrap_servers,
    }

    def partitions() -> list[int]:
        try:
            metadata = AdminClient(settings).list_topics(topic=config.topic, timeout=10)
        except Exception as error:
            log.warning("cannot list partitions of %s: %s", config.topic, error)
            return []
        topic = metadata.topics.get(config.topic)
        return sorted(topic.partitions) if topic is not None and topic.error is None else []

    return partitions


def describe(element: Watermark | WatermarkStatus) -> str:
    """A valve element in a log line or report: ``W<ms>`` or the status name."""
    if isinstance(element, WatermarkStatus):
        return element.value
    return f"W{element.timestamp}"


def load_report_lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of every complete batch under ``path`` (for tests and the demo)."""
    rows: list[dict[str, Any]] = []
    for batch_dir in sorted(path.glob("batch-*")):
        for part in sorted(batch_dir.glob("part-*")):
            rows += [json.loads(line) for line in part.read_text().splitlines() if line]
    return rows
