"""From an IDLE or FINISHED marker being written to the window it releases in the sink.

    .venv/bin/python -m bench.marker_latency_bench [--trigger-ms 500] [--runs 5]

On Apache Kafka (`slackwater broker`'s launcher) and one local[2] SparkSession: per run a
fresh 2-partition topic, partition 0 with event times 0..29 s, partition 1 with 0..4 s
and then quiet, a job on the source counting 10-second windows into a memory sink. Once
the job has processed everything (partition 1 holds the watermark at 3 s, so no window
closes), the marker is written for partition 1 and the clock runs until the window it
releases ([10 s, 20 s) for IDLE, which needs the watermark at 20 s; every window for
FINISHED of both partitions) is in the sink. Target (issue 12): at most two triggers
plus one second.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import functions as F

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus, encode
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream

BASE_MS = 1_700_000_000_000


def marker(topic: str, partition: int, status: MarkerStatus, offset: int, seq: int) -> Marker:
    return Marker(
        topic=topic,
        partition=partition,
        status=status,
        offset=offset,
        emitted_at=int(time.time() * 1000),
        emitter_id="bench",
        epoch=1,
        seq=seq,
    )


def one_run(spark: object, bootstrap: str, status: MarkerStatus, trigger_ms: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic, control = f"lat-{uuid.uuid4().hex[:8]}", f"latctl-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(topic, 2, 1), NewTopic(control, 1, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for second in range(30):
        producer.produce(topic, value=b"{}", partition=0, timestamp=BASE_MS + second * 1000)
    for second in range(5):
        producer.produce(topic, value=b"{}", partition=1, timestamp=BASE_MS + second * 1000)
    producer.flush(30)
    events = read_stream(
        spark,  # type: ignore[arg-type]
        bootstrap_servers=bootstrap,
        topics=[topic],
        control_topic=control,
        max_out_of_orderness="1s",
    )
    table = f"lat_{uuid.uuid4().hex[:8]}"
    query = (
        events.groupBy(F.window("event_time", "10 seconds"))
        .count()
        .writeStream.outputMode("append")
        .format("memory")
        .queryName(table)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="slackwater-lat-"))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        wanted = 2 if status is MarkerStatus.IDLE else 3
        markers = [marker(topic, 1, status, 5, 0)]
        if status is MarkerStatus.FINISHED:
            markers.append(marker(topic, 0, status, 30, 0))
        started = time.perf_counter()
        for one in markers:
            key, value = encode(one)
            producer.produce(control, key=key, value=value)
        producer.flush(30)
        while spark.sql(f"select * from {table}").count() < wanted:  # type: ignore[attr-defined]
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        query.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trigger-ms", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        spark = spark_session("slackwater-marker-latency")
        spark.sparkContext.setLogLevel("ERROR")
        one_run(spark, broker.bootstrap_servers, MarkerStatus.IDLE, args.trigger_ms)  # warm-up
        target_s = 2 * args.trigger_ms / 1000 + 1
        print(f"trigger {args.trigger_ms} ms; target {target_s:.1f} s (two triggers + 1 s)")
        for status in (MarkerStatus.IDLE, MarkerStatus.FINISHED):
            runs = [
                one_run(spark, broker.bootstrap_servers, status, args.trigger_ms)
                for _ in range(args.runs)
            ]
            print(
                f"{status.value:<9} median {statistics.median(runs):.2f} s, "
                f"best {min(runs):.2f} s, worst {max(runs):.2f} s over {args.runs} runs"
            )
        spark.stop()


if __name__ == "__main__":
    main()
