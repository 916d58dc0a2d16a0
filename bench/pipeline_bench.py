"""Records per second through five readers of the same input, in one run.

    .venv/bin/python -m bench.pipeline_bench [--records 2000000] [--partitions 16]

On Apache Kafka (`slackwater broker`'s launcher): --records JSON-less records over
--partitions partitions (event times rising, a little out of order). Then, one after
the other, in one local[2] SparkSession where Spark is involved:

  (a) raw confluent-kafka: one consumer reads every partition to its end;
  (b) the slackwater-kafka data source alone into Spark's no-op sink;
  (e) Spark's own format("kafka") source alone into the no-op sink;
  (c) plain Spark as users run it: Spark's Kafka source, withWatermark +
      groupBy(window).count();
  (d) `slackwater consume` end to end: the source, the valve, the late output,
      groupBy(window, key).count() on RocksDB into Spark's JSON file sink;
  (g) (d)'s own window count (``job.windows``) and sink through the slackwater source
      with a plain withWatermark instead of the valve, and no late output, on (d)'s trigger
      (100 ms, until all is processed); (g) and (d) run --repeats times each, in turn,
      and their medians are reported (single runs vary by a third here);
  (f) the slackwater source through the valve (read_stream) + Spark's own
      groupBy(window).count() into the no-op sink.

Each row is records / wall seconds from query start to all input processed,
so Spark's per-query start-up counts against (b)-(e). The ratios the targets
name are b/e (our source against Spark's, target >= 0.5), b/a, f/c and d/g (what the
valve and the late output cost `consume`, target >= 0.9); d/c is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.readwriter import DataStreamWriter

from bench.topics import produce_waiting
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.consume.config import ConsumerConfig
from spark_consumer.consume.job import spark_session, start, windows
from spark_consumer.source import SlackwaterKafkaSource, read_stream

BASE_MS = 1_700_000_000_000
CONSUME_TRIGGER_MS = 100  # (d)'s --trigger, and (g)'s


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    per_partition = records // partitions
    for index in range(per_partition - 1):
        event_ms = BASE_MS + index * 10 - (500 if index % 7 == 0 else 0)
        for partition in range(partitions):
            produce_waiting(
                producer,
                topic,
                key=b"k%d" % (index % 100),
                value=b"v",
                partition=partition,
                timestamp=event_ms,
            )
        producer.poll(0)
    last_ms = BASE_MS + per_partition * 10
    for partition in range(partitions):  # every partition's newest event time, last
        producer.produce(topic, key=b"k0", value=b"v", partition=partition, timestamp=last_ms)
    producer.flush(120)


def raw_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            # As the source's readers: librdkafka's 1 s fetch backoff otherwise makes this
            # row bimodal (180k or 1M+ records/s from one run to the next).
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    started, count = time.perf_counter(), 0
    while count < expected:
        count += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def consume_config(bootstrap: str, topic: str, control: str, tmp: Path) -> ConsumerConfig:
    """The settings of (d), whose window count (g) runs too."""
    return ConsumerConfig(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        control_topic=control,
        window_ms=10_000,
        max_out_of_orderness_ms=2_000,
        output=str(tmp / "out"),
        checkpoint=str(tmp / "checkpoint"),
        trigger_ms=CONSUME_TRIGGER_MS,
        metrics_port=None,
    )


def consume_job(spark: SparkSession, config: ConsumerConfig, *, total: int) -> float:
    """(d): ``slackwater consume`` until it has read all ``total`` records, in seconds."""
    started = time.perf_counter()
    job = start(spark, config)
    job.query.processAllAvailable()
    elapsed = time.perf_counter() - started
    progress = job.query.lastProgress
    assert progress is not None
    read = int(json.loads(progress["sources"][0]["endOffset"])["counters"]["records"])
    job.stop()
    assert read == total, f"slackwater consume read {read} of {total}"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="runs of (g) and (d) each")
    args = parser.parse_args()
    total = (args.records // args.partitions) * args.partitions
    tmp = Path(tempfile.mkdtemp(prefix="slackwater-bench-"))
    # Record timestamps are from 2023: time-based retention must not delete them.
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic, control = "bench-data", "bench-control"
        for future in admin.create_topics(
            [
                NewTopic(topic, num_partitions=args.partitions, replication_factor=1),
                NewTopic(control, num_partitions=1, replication_factor=1),
            ]
        ).values():
            future.result(30)
        started = time.perf_counter()
        produce(bootstrap, topic, total, args.partitions)
        print(f"produced {total:,} records in {time.perf_counter() - started:.1f}s", flush=True)

        seconds = {"a": raw_consume(bootstrap, topic, args.partitions, total)}
        spark = spark_session("slackwater-bench")
        spark.dataSource.register(SlackwaterKafkaSource)

        def source() -> DataFrame:
            return (
                spark.readStream.format("slackwater-kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("controlTopic", control)
                .load()
            )

        def timed(query_builder: DataStreamWriter) -> float:
            started = time.perf_counter()
            query = query_builder.trigger(availableNow=True).start()
            query.awaitTermination()
            return time.perf_counter() - started

        def spark_kafka_source() -> DataFrame:
            return (
                spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load()
            )

        # The session's first query pays Spark's and the Python workers' start-up: (b)
        # runs twice and keeps the second, so that no row carries that cost alone.
        for attempt in ("b-warmup", "b"):
            seconds["b"] = timed(
                source().writeStream.format("noop").option("checkpointLocation", str(tmp / attempt))
            )
        seconds["e"] = timed(
            spark_kafka_source()
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp / "e"))
        )
        seconds["c"] = timed(
            spark_kafka_source()
            .withWatermark("timestamp", "2 seconds")
            .groupBy(F.window("timestamp", "10 seconds"), "key")
            .count()
            .writeStream.format("noop")
            .outputMode("append")
            .option("checkpointLocation", str(tmp / "c"))
        )
        seconds["f"] = timed(
            read_stream(
                spark,
                bootstrap_servers=bootstrap,
                topics=[topic],
                control_topic=control,
                max_out_of_orderness="2s",
            )
            .groupBy(F.window("event_time", "10 seconds"), "key")
            .count()
            .writeStream.format("noop")
            .outputMode("append")
            .option("checkpointLocation", str(tmp / "f"))
        )
        # consume's own window count (job.windows), on a plain watermark.
        window_count = windows(
            source()
            .filter(F.col("topic").isNotNull())  # no synthetic row: a plain watermark
            .withWatermark("event_time", "2 seconds"),
            consume_config(bootstrap, topic, control, tmp),
        )
        spark.conf.set(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )

        def plain_job(run: str) -> float:
            """(g): ``consume``'s job with a plain watermark, on ``consume``'s trigger."""
            started = time.perf_counter()
            query = (
                window_count.writeStream.format("json")
                .outputMode("append")
                .option("path", str(tmp / f"{run}-out"))
                .option("checkpointLocation", str(tmp / run))
                .trigger(processingTime=f"{CONSUME_TRIGGER_MS} milliseconds")
                .start()
            )
            query.processAllAvailable()
            elapsed = time.perf_counter() - started
            query.stop()
            return elapsed

        # d/g is the ratio of two runs of about 7 s whose single runs vary by a third on
        # this machine: --repeats of each, in turn, and their medians.
        runs: dict[str, list[float]] = {"g": [], "d": []}
        for repeat in range(args.repeats):
            runs["g"].append(plain_job(f"g{repeat}"))
            config = consume_config(bootstrap, topic, control, tmp / f"d{repeat}")
            runs["d"].append(consume_job(spark, config, total=total))
        seconds["g"], seconds["d"] = (statistics.median(runs[k]) for k in ("g", "d"))
        spark.stop()
        print("runs of (g) s:", *(f"{s:.1f}" for s in runs["g"]))
        print("runs of (d) s:", *(f"{s:.1f}" for s in runs["d"]))
    names = {
        "a": "raw confluent-kafka consume",
        "b": "slackwater-kafka source -> noop sink",
        "e": "Spark's Kafka source -> noop sink",
        "c": "Spark's Kafka source + withWatermark + window count",
        "f": "slackwater source + valve + window count",
        "g": "slackwater source + plain withWatermark + count -> JSON",
        "d": "slackwater consume (valve, late output) -> JSON",
    }
    print(f"{'':3} {'reader':<52} {'seconds':>8} {'records/s':>11}")
    for key, name in names.items():
        print(f"({key}) {name:<52} {seconds[key]:>8.1f} {total / seconds[key]:>11,.0f}")
    print(
        f"b/a = {seconds['a'] / seconds['b']:.2f}   b/e = {seconds['e'] / seconds['b']:.2f}"
        f"   f/c = {seconds['c'] / seconds['f']:.2f}   d/g = {seconds['g'] / seconds['d']:.2f}"
        f"   d/c = {seconds['c'] / seconds['d']:.2f}"
    )


if __name__ == "__main__":
    main()
