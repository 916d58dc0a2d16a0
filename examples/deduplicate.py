"""Drop duplicate events (same ``id``) with ``dropDuplicatesWithinWatermark`` on the
valve's watermark, then count per 10-second window.

    python examples/deduplicate.py --bootstrap-servers localhost:9092 --topic events \\
        --control-topic slackwater.control

A producer that retries writes the same event twice; only the first copy counts. The
watermark is the valve's: a quiet partition marked IDLE does not hold the windows back.
Spark keeps a deduplication key until the watermark passes its event time plus the
``withWatermark`` delay, so the job sets that delay (``--dedup-window``, the source's
``watermarkDelay``): Spark's watermark is then max(valve, newest - window), the valve's
as long as no partition lags the newest record by more than the window.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.source import read_stream


def unique_counts(
    spark: SparkSession, bootstrap: str, topic: str, control: str, dedup_window: str = "1h"
) -> DataFrame:
    """window_start, events: distinct event ids per 10-second window; copies further
    apart in event time than ``dedup_window`` are not recognised."""
    events = read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=[topic],
        control_topic=control,
        max_out_of_orderness="1s",
        event_time_field="ts",
        watermark_delay=dedup_window,
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
    parser.add_argument("--dedup-window", default="1h", help="e.g. 10m, 1h (default 1h)")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("deduplicate").getOrCreate()
    query = (
        unique_counts(
            spark, args.bootstrap_servers, args.topic, args.control_topic, args.dedup_window
        )
        .writeStream.outputMode("append")
        .format("console")
        .start()
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
