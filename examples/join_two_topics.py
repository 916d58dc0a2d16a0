"""Orders joined with their payments within 10 seconds of event time, on the valve's
watermark: an order without a payment comes out (with a null payment) once the
watermark has passed it by 10 seconds, even while a partition of either topic is quiet.

    python examples/join_two_topics.py --bootstrap-servers localhost:9092 \\
        --orders orders --payments payments --control-topic slackwater.control

Both topics go through one source, so through one valve whose channels are the
partitions of both: a quiet partition marked IDLE, of either topic, leaves the minimum
as Flink's two-input operators leave an idle input out. (Two sources would be two
valves combined by Spark's min policy over watermarks that never go down: a topic gone
quiet would hold the join back for ever, docs/decisions.md.)
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.source import read_stream


def orders_with_payments(
    spark: SparkSession, bootstrap: str, orders: str, payments: str, control: str
) -> DataFrame:
    """order_id, order_time, amount, paid_at (null when no payment came within 10 s)."""
    events = read_stream(
        spark,
        bootstrap_servers=bootstrap,
        topics=[orders, payments],
        control_topic=control,
        max_out_of_orderness="1s",
        event_time_field="ts",
    )
    return orders_joined_with_payments(events, orders, payments)


def orders_joined_with_payments(events: DataFrame, orders: str, payments: str) -> DataFrame:
    """The join itself, on the source's rows of both topics (the valve's watermark applied)."""
    events = events.filter(F.col("event_time").isNotNull())
    value = F.col("value").cast("string")
    order_rows = events.filter(F.col("topic") == orders).select(
        F.get_json_object(value, "$.order").alias("order_id"),
        F.col("event_time").alias("order_time"),
        F.get_json_object(value, "$.amount").cast("double").alias("amount"),
    )
    payment_rows = events.filter(F.col("topic") == payments).select(
        F.get_json_object(value, "$.order").alias("paid_order"),
        F.col("event_time").alias("paid_at"),
    )
    return order_rows.join(
        payment_rows,
        F.expr(
            "paid_order = order_id AND paid_at >= order_time "
            "AND paid_at <= order_time + interval 10 seconds"
        ),
        "leftOuter",
    ).select("order_id", "order_time", "amount", "paid_at")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--orders", required=True)
    parser.add_argument("--payments", required=True)
    parser.add_argument("--control-topic", required=True)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("join-two-topics").getOrCreate()
    query = (
        orders_with_payments(
            spark, args.bootstrap_servers, args.orders, args.payments, args.control_topic
        )
        .writeStream.outputMode("append")
        .format("console")
        .option("truncate", "false")
        .start()
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
