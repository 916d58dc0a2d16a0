"""The source as a job uses it (semantics.md §6): the DataSource Spark instantiates by
its name, and ``read_stream``, the source with the valve's watermark as Spark's own.

    events = read_stream(spark, bootstrap_servers="host:9092", topics=["orders"],
                         control_topic="slackwater.control", max_out_of_orderness="2s")
    events.groupBy(F.window("event_time", "10 seconds"), "key").count()

or, as a two-line change to an existing job:

    frame = spark.readStream.format("slackwater-kafka").option(...).load()
    events = with_valve_watermark(frame)

How the valve's watermark V becomes Spark's: every micro-batch carries one synthetic
row whose event time is V + D, D being the ``withWatermark`` delay (36,500 days). Real
rows give ``max(event time) - D``, far below V, so Spark's watermark is exactly V.
``with_valve_watermark`` removes the row again, with a predicate on the event-time
column (one without it would be pushed below the watermark node). Spark applies
batch N's watermark from batch N+1 on:

    batch        N-1              N                  N+1
    planned      V(N-1)           V(N)               V(N+1)   (latestOffset, driver side)
    applied      ...              V(N-1)             V(N)     (Spark's watermark)
    late rows    event < ...      event < V(N-1)     event < V(N)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Required, TypedDict, Unpack

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructField, StructType, TimestampType

from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.shared.options import (
    EVENT_TIME,
    SCHEMA,
    SOURCE_NAME,
    WATERMARK_DELAY_METADATA,
    WATERMARK_DELAY_MS,
    SourceOptions,
)


class SlackwaterKafkaSource(DataSource):
    """``spark.readStream.format("slackwater-kafka")``: Kafka records plus the valve."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        # The event-time column carries D, so that with_valve_watermark applies the
        # delay the synthetic row was planned with and the two cannot disagree.
        delay_ms = SourceOptions.parse(dict(self.options)).watermark_delay_ms
        return StructType(
            [
                StructField(f.name, f.dataType, f.nullable)
                if f.name != EVENT_TIME
                else StructField(
                    EVENT_TIME, TimestampType(), True, {WATERMARK_DELAY_METADATA: delay_ms}
                )
                for f in SCHEMA.fields
            ]
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return SlackwaterStreamReader(SourceOptions.parse(dict(self.options)))


def _not_synthetic() -> Column:
    """True for every real row.

    It references the event-time column, so Spark does not push it below the watermark
    node. And it is not deterministic (``spark_partition_id() < 0``, never true, one
    lookup per row; Spark folds ``rand() < 0`` away, and rejects
    ``monotonically_increasing_id()`` in streaming), so Spark pushes no later filter of
    the user's below it either: a filter on ``topic`` or ``key`` would otherwise drop
    the synthetic row before the watermark node sees it, and the valve's watermark
    with it.
    """
    synthetic = F.col("topic").isNull() & F.col(EVENT_TIME).isNotNull()
    return ~synthetic | (F.spark_partition_id() < 0)


def with_valve_watermark(frame: DataFrame) -> DataFrame:
    """The valve's watermark as Spark's: ``withWatermark`` on ``event_time`` with the
    delay the source planned its synthetic row with (from the column's metadata), then
    the synthetic row removed."""
    delay_ms = frame.schema[EVENT_TIME].metadata.get(WATERMARK_DELAY_METADATA, WATERMARK_DELAY_MS)
    return frame.withWatermark(EVENT_TIME, f"{int(delay_ms)} milliseconds").filter(_not_synthetic())


class StreamKeywords(TypedDict, total=False):
    """``read_stream``'s keywords, each one of the source's options (docs/source.md);
    one left out, or None, leaves its option at the default."""

    bootstrap_servers: Required[str]  # kafka.bootstrap.servers
    topics: Sequence[str] | None  # subscribe
    topic_pattern: str | None  # subscribePattern
    control_topic: str | None  # controlTopic
    max_out_of_orderness: str  # maxOutOfOrderness, "0s" by default
    event_time_field: str | None  # eventTimeField
    starting_offsets: str  # startingOffsets, "earliest" by default
    kafka_config: Mapping[str, str] | None  # kafka.*
    watermark_delay: str | None  # watermarkDelay
    late_output: str | None  # lateOutput
    late_rule: str | None  # lateRule
    fail_on_data_loss: bool | None  # failOnDataLoss
    max_event_time_ahead: str | None  # maxEventTimeAhead
    consumer_idle_timeout: str | None  # consumerIdleTimeout
    ending_offsets: str | None  # endingOffsets: a bounded run (availableNow)
    max_offsets_per_trigger: int | None  # maxOffsetsPerTrigger
    max_watermark_drift: str | None  # maxWatermarkDrift: watermark alignment


def read_stream(
    spark: SparkSession,
    *,
    options: Mapping[str, str] | None = None,
    **keywords: Unpack[StreamKeywords],
) -> DataFrame:
    """The source with its watermark applied: what a job reads (semantics.md §6). Each
    keyword is one of the source's options (``StreamKeywords``, docs/source.md);
    ``options`` are any others by name, e.g. ``{"readTimeoutMs": "300000"}``.

    ``watermark_delay`` (e.g. ``"1h"``) is for ``dropDuplicatesWithinWatermark``, whose
    state lives for the delay: Spark's watermark then becomes max(V, newest - delay),
    the valve's only while no partition lags the newest record by more than the delay.
    """
    spark.dataSource.register(SlackwaterKafkaSource)
    reader = spark.readStream.format(SOURCE_NAME).options(**stream_options(**keywords))
    reader = reader.options(**(options or {}))
    return with_valve_watermark(reader.options(**task_options(spark)).load())


def stream_options(**keywords: Unpack[StreamKeywords]) -> dict[str, str]:
    """``read_stream``'s keywords as the source's options, by their names (a keyword it
    does not know is an error, as for any Python function)."""
    known = StreamKeywords.__annotations__.keys()
    unknown = sorted(keywords.keys() - known)
    if unknown or "bootstrap_servers" not in keywords:
        wrong = f"unknown keyword(s) {', '.join(unknown)}" if unknown else "no bootstrap_servers"
        raise TypeError(f"read_stream(): {wrong}")
    given = {
        "kafka.bootstrap.servers": keywords["bootstrap_servers"],
        "maxOutOfOrderness": _or_default(keywords.get("max_out_of_orderness"), "0s"),
        "startingOffsets": _or_default(keywords.get("starting_offsets"), "earliest"),
    }
    topics = keywords.get("topics")
    fail_on_data_loss = keywords.get("fail_on_data_loss")
    max_offsets = keywords.get("max_offsets_per_trigger")
    optional = {
        "subscribe": None if topics is None else ",".join(topics),
        "subscribePattern": keywords.get("topic_pattern"),
        "controlTopic": keywords.get("control_topic"),
        "eventTimeField": keywords.get("event_time_field"),
        "watermarkDelay": keywords.get("watermark_delay"),
        "lateOutput": keywords.get("late_output"),
        "lateRule": keywords.get("late_rule"),
        "failOnDataLoss": None if fail_on_data_loss is None else str(fail_on_data_loss).lower(),
        "maxEventTimeAhead": keywords.get("max_event_time_ahead"),
        "consumerIdleTimeout": keywords.get("consumer_idle_timeout"),
        "endingOffsets": keywords.get("ending_offsets"),
        "maxOffsetsPerTrigger": None if max_offsets is None else str(max_offsets),
        "maxWatermarkDrift": keywords.get("max_watermark_drift"),
    }
    given.update({name: value for name, value in optional.items() if value is not None})
    kafka_config = keywords.get("kafka_config") or {}
    given.update({f"kafka.{key}": value for key, value in kafka_config.items()})
    return given


def _or_default(value: str | None, default: str) -> str:
    """None is the default; anything else, an empty string too, goes to the source to
    judge (which names the option it cannot read)."""
    return default if value is None else value


def task_options(spark: SparkSession) -> dict[str, str]:
    """``tasksPerBatch`` from Spark's default parallelism (the planner, in a Python process
    of its own, cannot ask Spark); nothing where Spark does not say (Spark Connect)."""
    try:
        parallelism = spark.sparkContext.defaultParallelism
    except Exception:  # Spark Connect has no SparkContext
        return {}
    return {"tasksPerBatch": str(parallelism)}
