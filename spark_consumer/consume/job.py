"""``slackwater consume`` as a Structured Streaming job on the slackwater source.

    Kafka data topics --> slackwater-kafka source (valve watermark as Spark's)
        --> groupBy(window | session_window, key).agg(count, --agg ...)   [RocksDB state]
        --> Spark's file sink (JSON lines or Parquet, exactly once via its metadata log)
    the readers --> late output: rows the aggregation drops, unreadable rows
                    (one file per source range, exactly once: late_rows.py)

Nothing here keeps state of its own: the window state is Spark's state store, the
valve's is in the source's checkpointed offsets.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from spark_consumer.consume.config import ConsumerConfig
from spark_consumer.source import StreamKeywords, read_stream, stream_options

log = logging.getLogger(__name__)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
QUIET_LOG4J = Path(__file__).parent / "resources" / "log4j2-quiet.properties"
# The driver's threads' stack. Stopping a query stops its foreachBatch function's own Spark
# job, whose py4j error carries the JVM's stack trace (about 8,000 characters); Spark tells
# a stop from a failure by a regex over it (StreamExecution.isInterruptionException) that
# recurses once per character, and overflows Java's default 1 MB stack: the stream thread
# then died of a StackOverflowError instead of stopping (docs/decisions.md, issue 31,
# finding 12). 16 MB holds the regex over 16,000 characters even interpreted.
THREAD_STACK = "-Xss16m"


@dataclass
class ConsumeJob:
    """The running job: the window query, and the plain-Spark query beside it (compare)."""

    query: StreamingQuery
    plain_spark: StreamingQuery | None = None

    def queries(self) -> list[StreamingQuery]:
        return [q for q in (self.query, self.plain_spark) if q is not None]

    def stop(self) -> None:
        """Stops the queries; quietly if Spark is already going down (a Ctrl-C or a
        SIGTERM to the whole process group reaches the JVM too, and its shutdown hook
        stops the SparkContext first)."""
        for query in self.queries():
            try:
                if query.isActive:
                    query.stop()
            except Exception as error:  # py4j errors of a JVM going away
                log.debug("query stop: %s", error)


def spark_session(
    app_name: str = "slackwater", master: str = "local[2]", *, verbose: bool = False
) -> SparkSession:
    """A SparkSession for slackwater's jobs: Python workers on this interpreter, UTC,
    no UI or progress bars, Spark's own Kafka source on the classpath if set-up fetched
    it (only ``--compare`` and the demo's comparison use it)."""
    from slackwater.jars import SPARK_KAFKA, fetched_jar_files

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    cores = int(master[len("local[") : -1]) if master.startswith("local[") else 2
    # Before the JVM starts (pyspark passes these to spark-submit): the threads' stack,
    # and no screen of WARN lines at start-up, which setLogLevel would only silence later.
    java_options = [THREAD_STACK]
    if not verbose:
        java_options.append(f"-Dlog4j2.configurationFile={QUIET_LOG4J}")
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", " ".join(java_options))
        .config("spark.jars", ",".join(str(jar) for jar in fetched_jar_files(SPARK_KAFKA)))
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("INFO" if verbose else "ERROR")
    return spark


def _json_field(field: str) -> Column:
    return F.get_json_object(F.col("value").cast("string"), f"$.{field}")


def _aggregations(config: ConsumerConfig) -> list[Column]:
    """count, then one column per --agg, named <function>_<field>."""
    columns = [F.count(F.lit(1)).alias("count")]
    for aggregation in config.aggregations:
        function, _, field = aggregation.partition(":")
        name = aggregation_column(aggregation)
        value = _json_field(field)
        if function == "approx_distinct":
            columns.append(F.approx_count_distinct(value).alias(name))
        else:
            numeric = value.cast("double")
            columns.append(getattr(F, function)(numeric).alias(name))
    return columns


def late_rule(config: ConsumerConfig) -> str:
    """The source's lateRule for this job's windows (late_rows.py)."""
    if config.session_gap_ms is not None:
        return f"session:{config.session_gap_ms}"
    slide = config.slide_ms or config.window_ms
    return f"window:{config.window_ms}:{slide}"


def source_keywords(config: ConsumerConfig) -> StreamKeywords:
    """``read_stream``'s keywords for this job's settings."""
    return {
        "bootstrap_servers": config.bootstrap_servers,
        "topics": config.topics or None,
        "topic_pattern": config.topic_pattern,
        "control_topic": config.control_topic,
        "max_out_of_orderness": f"{config.max_out_of_orderness_ms}ms",
        "event_time_field": config.event_time_field,
        "starting_offsets": config.starting_offsets,
        "kafka_config": config.kafka_config,
        "late_output": config.effective_late_output,
        "late_rule": late_rule(config),
        "fail_on_data_loss": config.fail_on_data_loss,
        "max_event_time_ahead": _duration_or_off(config.max_event_time_ahead_ms),
        "consumer_idle_timeout": None
        if config.consumer_idle_timeout_ms is None
        else f"{config.consumer_idle_timeout_ms}ms",
        "ending_offsets": "latest" if config.backfill else None,
        "max_offsets_per_trigger": config.max_offsets_per_trigger,
        "max_watermark_drift": None
        if config.max_watermark_drift_ms is None
        else f"{config.max_watermark_drift_ms}ms",
    }


def _duration_or_off(duration_ms: int | None) -> str:
    return "off" if duration_ms is None else f"{duration_ms}ms"


def source_options(config: ConsumerConfig) -> dict[str, str]:
    """The slackwater source's options for this job's settings."""
    return stream_options(**source_keywords(config))


def events(spark: SparkSession, config: ConsumerConfig) -> DataFrame:
    """The data topics through the source, with the valve's watermark applied."""
    return read_stream(spark, **source_keywords(config))


def windows(frame: DataFrame, config: ConsumerConfig) -> DataFrame:
    """window_start, window_end, key, count and one column per --agg."""
    key = (
        _json_field(config.key_field)
        if config.key_field is not None
        else F.col("key").cast("string")
    )
    if config.session_gap_ms is not None:
        window = F.session_window("event_time", f"{config.session_gap_ms} milliseconds")
    elif config.slide_ms is not None:
        window = F.window(
            "event_time", f"{config.window_ms} milliseconds", f"{config.slide_ms} milliseconds"
        )
    else:
        window = F.window("event_time", f"{config.window_ms} milliseconds")
    # Rows without an event time have no window: they are in the late output.
    readable = frame.filter(F.col("event_time").isNotNull()).withColumn("key", key)
    return (
        readable.groupBy(window.alias("window"), "key")
        .agg(*_aggregations(config))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "key",
            "count",
            *[aggregation_column(a) for a in config.aggregations],
        )
    )


def aggregation_column(aggregation: str) -> str:
    """``sum:amount`` -> ``sum_amount`` (a nested field's dots become underscores)."""
    function, _, field = aggregation.partition(":")
    return f"{function}_{field.replace('.', '_')}"


def start(
    spark: SparkSession, config: ConsumerConfig, *, plain_max_offsets_per_trigger: int | None = None
) -> ConsumeJob:
    """Starts the job in ``spark``; the state store is chosen before the first batch.
    ``plain_max_offsets_per_trigger`` caps the plain-Spark query's batches (compare)."""
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        ROCKSDB if config.state_store == "rocksdb" else HDFS,
    )
    query = (
        windows(events(spark, config), config)
        .writeStream.outputMode("append")
        .format(config.output_format)
        .option("path", config.output)
        .option("checkpointLocation", _child(config.checkpoint, "windows"))
        .queryName("slackwater_windows")
        .trigger(**_trigger(config))
        .start()
    )
    plain = (
        start_plain_spark(spark, config, max_offsets_per_trigger=plain_max_offsets_per_trigger)
        if config.compare
        else None
    )
    return ConsumeJob(query, plain)


def start_plain_spark(
    spark: SparkSession, config: ConsumerConfig, *, max_offsets_per_trigger: int | None = None
) -> StreamingQuery:
    """The same count as a Spark user writes it today: Spark's own Kafka source and its
    watermark (newest event time over all partitions - delay), into ``<output>-plain-spark``;
    with ``max_offsets_per_trigger``, that option of Spark's source caps each batch."""
    from slackwater.jars import SPARK_KAFKA, jar_files

    jar_files(SPARK_KAFKA)  # one clear line if set-up did not fetch Spark's Kafka source
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.bootstrap_servers)
        .option("startingOffsets", config.starting_offsets)
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    # Spark's Kafka source names its subscription as slackwater's does.
    ours = source_options(config)
    reader = reader.options(**{k: ours[k] for k in ("subscribe", "subscribePattern") if k in ours})
    frame = reader.load()
    if config.event_time_field is not None:
        event_time = F.timestamp_millis(_json_field(config.event_time_field).cast("long"))
    else:
        event_time = F.col("timestamp")
    frame = frame.withColumn("event_time", event_time).withWatermark(
        "event_time", f"{config.max_out_of_orderness_ms} milliseconds"
    )
    return (
        windows(frame, config)
        .writeStream.outputMode("append")
        .format(config.output_format)
        .option("path", plain_spark_output(config))
        .option("checkpointLocation", _child(config.checkpoint, "plain-spark"))
        .queryName("plain_spark")
        .trigger(**_trigger(config))
        .start()
    )


def _trigger(config: ConsumerConfig) -> dict[str, Any]:
    """A backfill runs under availableNow (and ends); the job otherwise every --trigger."""
    if config.backfill:
        return {"availableNow": True}
    return {"processingTime": f"{config.trigger_ms} milliseconds"}


def windows_emitted(progress: Any) -> int:
    """Window rows a micro-batch wrote: the sink's count where it reports one, else (the
    file sink reports -1) the rows the aggregation evicted from its state, which in
    append mode are exactly the rows it emitted."""
    written = int(progress.sink.numOutputRows)
    if written >= 0:
        return written
    return sum(max(0, int(operator.numRowsRemoved)) for operator in progress.stateOperators)


def _child(path: str, name: str) -> str:
    """A path under a local path or a URI (``s3a://b/ck``), which pathlib would mangle."""
    return f"{path.rstrip('/')}/{name}"


def plain_spark_output(config: ConsumerConfig) -> str:
    return config.output.rstrip("/") + "-plain-spark"


def committed_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a local JSON file-sink output that Spark committed: the files its
    metadata log (``_spark_metadata``) lists, never a file a crashed batch left behind.
    For the demo's summary and for tests; any other reader should use Spark's own."""
    log = Path(path) / "_spark_metadata"
    if not log.is_dir():
        return []
    files: set[str] = set()
    for entry in sorted(log.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # line 1 is the log's version
            record = json.loads(line)
            if record.get("action", "add") == "add":
                files.add(record["path"])
            else:
                files.discard(record["path"])
    rows: list[dict[str, Any]] = []
    for file in sorted(files):
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(file).path))
        rows += [json.loads(line) for line in local.read_text().splitlines() if line]
    return rows
