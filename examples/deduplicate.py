"""Drop duplicate events (same ``id``) with ``dropDuplicatesWithinWatermark`` on the
valve's watermark, then count per 10-second window.

    python examples/deduplicate.py --bootstrap-servers localhost:9092 --topic events \\
        --control-topic slackwater.control

A producer that retries writes the same event twice; only the first copy counts. The
watermark is the valve's: a quiet partition marked IDLE does not hold the windows back.
Known limit (docs/source.md): Spark keeps a deduplication key until the watermark passes
its event time plus the ``withWatermark`` delay, and the source's delay is 36,500 days,
so the keys are never evicted: correct results, unbounded state.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.source import read_stream


def unique_counts(spark: SparkSession, bootstrap: str, topic: str, control: str) -> DataFrame:
    """window_start, events: distinct event ids per 10-second window."""
    events = read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=[topic],
        control_topic=control,
        max_out_of_orderness="1s",
        event_time_field="ts",
    ).filter(F.col("event_time").isNotNull())
    with_id = events.withColumn("id", F.get_json_object(F.col("value").cast("string"), "$.id"))
    return (
        with_id.dropDuplicatesWithinWatermark(["id"])
        .groupBy(F.window("event_time", "10 seconds"))
        .agg(F.count(F.lit(1)).alias("events"))
        .select(F.col("window.start").alias("window_start"), "events")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control-topic", required=True)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("deduplicate").getOrCreate()
    query = (
        unique_counts(spark, args.bootstrap_servers, args.topic, args.control_topic)
        .writeStream.outputMode("append")
        .format("console")
        .start()
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
