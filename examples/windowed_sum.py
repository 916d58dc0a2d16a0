"""A windowed sum of a JSON field, on the valve's watermark: the two-line change.

    python examples/windowed_sum.py --bootstrap-servers localhost:9092 --topic payments \\
        --control-topic slackwater.control --output out/ --checkpoint ckpt/

Reads ``{"ts": <epoch ms or ISO 8601>, "account": "...", "amount": <number>}`` records,
sums ``amount`` per account per 10-second window, and appends each window once it
closes (append mode) to JSON files under ``--output`` (Spark's file sink: exactly once
through its metadata log). Runs until SIGTERM or Ctrl-C; restarts continue from
``--checkpoint``. Without slackwater this job is the same but for the two marked lines.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

from spark_consumer.source import SlackwaterKafkaSource, with_valve_watermark

VALUE = StructType([StructField("account", StringType()), StructField("amount", DoubleType())])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control-topic", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--window", default="10 seconds")
    parser.add_argument("--master", help="e.g. local-cluster[2,1,1024] (default: spark-submit's)")
    args = parser.parse_args(argv)

    builder = SparkSession.builder.appName("windowed-sum")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    spark.dataSource.register(SlackwaterKafkaSource)
    frame = (
        spark.readStream.format("slackwater-kafka")  # 1. instead of format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.topic)
        .option("controlTopic", args.control_topic)
        .option("eventTimeField", "ts")
        .option("maxOutOfOrderness", "1s")
        .load()
    )
    events = with_valve_watermark(frame)  # 2. instead of withWatermark("timestamp", ...)
    sums = (
        events.filter(F.col("event_time").isNotNull())
        .withColumn("payment", F.from_json(F.col("value").cast("string"), VALUE))
        .groupBy(F.window("event_time", args.window), F.col("payment.account").alias("account"))
        .agg(F.sum("payment.amount").alias("total"), F.count(F.lit(1)).alias("payments"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "account",
            "total",
            "payments",
        )
    )
    query = (
        sums.writeStream.outputMode("append")
        .format("json")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(0.5) and query.isActive:
        pass
    failure = query.exception()
    query.stop()
    spark.stop()
    if failure is not None:
        print(f"windowed-sum: the query failed: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
