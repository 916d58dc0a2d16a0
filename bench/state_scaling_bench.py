"""Per-batch time of a windowed count on the source with 10,000 vs 1,000,000 open
(window, key) groups in the RocksDB state store.

    .venv/bin/python -m bench.state_scaling_bench [--groups 10000 1000000] [--batches 8]

On Apache Kafka and one local[2] SparkSession with Spark's RocksDB state store provider:
per size, a fresh 4-partition topic gets one record per key, all in one open 1-hour
window (so every group stays in state), and a job on the source counts per window and
key into the no-op sink. Once that load is processed, --batches batches of 2,000
records (keys spread over the existing groups, same window) are produced one at a time,
and each is timed from produce to processed. Target (issue 12): the per-batch time at
1,000,000 groups within 2x of the one at 10,000; a source that rewrote its state whole
each batch would grow with the groups.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.topics import produce_waiting
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream

BASE_MS = 1_700_000_000_000
PARTITIONS = 4
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def produce(bootstrap: str, topic: str, keys: range, *, step: int = 1) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    for index in keys[::step]:
        produce_waiting(
            producer,
            topic,
            key=b"k%d" % index,
            value=b"v",
            partition=index % PARTITIONS,
            timestamp=BASE_MS + index % 3_000_000,  # all inside [BASE, BASE + 1 h)
        )
    producer.flush(120)


def measure(spark: SparkSession, bootstrap: str, groups: int, batches: int) -> list[float]:
    topic, control = f"state-{uuid.uuid4().hex[:8]}", f"statectl-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, PARTITIONS, 1), NewTopic(control, 1, 1)]
    ).values():
        future.result(30)
    produce(bootstrap, topic, range(groups))
    events = read_stream(spark, bootstrap_servers=bootstrap, topics=[topic], control_topic=control)
    query = (
        events.groupBy(F.window("event_time", "1 hour"), "key")
        .count()
        .writeStream.outputMode("append")
        .format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="slackwater-state-"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        started = time.perf_counter()
        query.processAllAvailable()
        print(f"  {groups:,} groups loaded in {time.perf_counter() - started:.1f}s", flush=True)
        timings = []
        stride = max(1, groups // 2_000)
        for batch in range(batches):
            started = time.perf_counter()
            produce(bootstrap, topic, range(batch, groups, 1), step=stride)
            query.processAllAvailable()
            timings.append(time.perf_counter() - started)
        progress = query.lastProgress
        assert progress is not None
        state = progress["stateOperators"][0]["numRowsTotal"]
        print(f"  state rows after the batches: {state:,}", flush=True)
        return timings
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        spark = spark_session("slackwater-state-scaling")
        spark.sparkContext.setLogLevel("ERROR")
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
        medians = {}
        for groups in args.groups:
            timings = measure(spark, broker.bootstrap_servers, groups, args.batches)
            medians[groups] = statistics.median(timings)
            print(
                f"{groups:>10,} groups: median {medians[groups]:.2f}s per 2,000-record batch "
                f"(best {min(timings):.2f}s, worst {max(timings):.2f}s)",
                flush=True,
            )
        if len(medians) == 2:
            small, large = sorted(medians)
            print(f"ratio {large:,} / {small:,} groups: {medians[large] / medians[small]:.2f}")
        spark.stop()


if __name__ == "__main__":
    main()
