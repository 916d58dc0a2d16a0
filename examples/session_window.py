"""Session windows per user on the valve's watermark: a session closes when the
watermark passes its last event plus the gap, even while some partitions are quiet.

    python examples/session_window.py --bootstrap-servers localhost:9092 --topic clicks \\
        --control-topic slackwater.control

Reads ``{"ts": ..., "user": "..."}`` records and prints, per closed session, the user,
its start and end and its number of clicks (append mode, console sink).
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.source import read_stream


def sessions(spark: SparkSession, bootstrap: str, topic: str, control: str, gap: str) -> DataFrame:
    """One row per closed session: user, session_start, session_end, clicks."""
    events = read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=[topic],
        control_topic=control,
        max_out_of_orderness="1s",
        event_time_field="ts",
    )
    user = F.get_json_object(F.col("value").cast("string"), "$.user").alias("user")
    return (
        events.filter(F.col("event_time").isNotNull())
        .groupBy(F.session_window("event_time", gap), user)
        .agg(F.count(F.lit(1)).alias("clicks"))
        .select(
            "user",
            F.col("session_window.start").alias("session_start"),
            F.col("session_window.end").alias("session_end"),
            "clicks",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control-topic", required=True)
    parser.add_argument("--gap", default="5 seconds")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("session-window").getOrCreate()
    query = (
        sessions(spark, args.bootstrap_servers, args.topic, args.control_topic, args.gap)
        .writeStream.outputMode("append")
        .format("console")
        .option("truncate", "false")
        .start()
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
