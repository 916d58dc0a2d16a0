"""A scheduled backfill: one availableNow run of a 10-second window count, then exit.

    python examples/backfill.py --bootstrap-servers localhost:9092 --topic orders \\
        --control-topic slackwater.control --output out/ --checkpoint ckpt/

Counts the records of ``--topic`` per 10-second window of their event time (the Kafka
timestamp, or ``--event-time-field``) and appends each window once it closes to JSON
files under ``--output`` (Spark's file sink: exactly once through its metadata log).
Under ``trigger(availableNow=True)`` a run reads every partition to the log end it sees
when it starts, in batches of ``--max-offsets-per-trigger``, writes every window the
emitter's markers let the valve close, and ends; a scheduler (cron, Airflow) starts it
again, every hour say, on the same ``--checkpoint``, and the next run goes on where this
one stopped. A partition the emitter marked IDLE does not hold the windows back, nor
one it marked FINISHED; a busy partition holds the newest windows until the next run
reads past them. ``--ending-offsets latest`` makes a bounded run instead: every
partition counts as FINISHED at its end and every window is written (that checkpoint
can then only run again to the same ends). Prints one line at the end: the windows this
run wrote and Spark's watermark.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer.source import read_stream


def window_counts(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """window_start, window_end, records: each window once the valve has closed it."""
    options = {
        "maxOffsetsPerTrigger": args.max_offsets_per_trigger,
        "endingOffsets": args.ending_offsets,
    }
    events = read_stream(  # format("slackwater-kafka") and the valve's watermark
        spark,
        bootstrap_servers=args.bootstrap_servers,
        topics=[args.topic],
        control_topic=args.control_topic,
        max_out_of_orderness=args.max_out_of_orderness,
        event_time_field=args.event_time_field,
        options={name: str(value) for name, value in options.items() if value is not None},
    )
    return (
        events.filter(F.col("event_time").isNotNull())
        .groupBy(F.window("event_time", args.window))
        .agg(F.count(F.lit(1)).alias("records"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "records",
        )
    )


def summary(progress: Sequence[Mapping[str, Any]]) -> str:
    """The windows the run wrote and the watermark its last batch ran with."""
    # Append mode: a window leaves the aggregation's state as it is written (the file
    # sink reports no row count of its own).
    written = sum(int(p["stateOperators"][0]["numRowsRemoved"]) for p in progress)
    watermark = progress[-1]["eventTime"].get("watermark", "none") if progress else "none"
    return f"backfill: the run wrote {written} windows; Spark's watermark is {watermark}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--control-topic", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--window", default="10 seconds")
    parser.add_argument("--max-out-of-orderness", default="1s")
    parser.add_argument("--event-time-field", help="a JSON field (default: the timestamp)")
    parser.add_argument("--max-offsets-per-trigger", type=int, help="records per batch")
    parser.add_argument("--ending-offsets", help="latest, or Spark's JSON: a bounded run")
    parser.add_argument("--master", help="e.g. local[2] (default: spark-submit's)")
    args = parser.parse_args(argv)

    # Every batch's progress is kept for the summary line (Spark keeps 100 by default).
    builder = SparkSession.builder.appName("backfill").config(
        "spark.sql.streaming.numRecentProgressUpdates", "100000"
    )
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    query = (
        window_counts(spark, args)
        .writeStream.outputMode("append")
        .format("json")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)  # read to the ends seen now, emit, end
        .start()
    )
    query.awaitTermination()
    failure = query.exception()
    progress = query.recentProgress
    spark.stop()
    if failure is not None:
        print(f"backfill: the run failed: {failure}", file=sys.stderr)
        return 1
    print(summary(progress))
    return 0


if __name__ == "__main__":
    sys.exit(main())
