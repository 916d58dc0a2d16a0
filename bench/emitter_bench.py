"""Wall and CPU milliseconds per emitter poll at 100, 1,000 and 10,000 watched partitions.

On Apache Kafka (`slackwater broker`'s launcher), in one process: topics of 1,000 partitions
each (one topic for 100), a record on every partition, then --polls polls of
a connected emitter with a consumer group (so metadata, ListOffsets, group
offsets and the group description are all requested; metadata every 10th
poll, as at the default 1 s poll and 10 s metadata intervals). CPU is the
whole process's (librdkafka's threads included), via time.process_time():
the mean per poll, so the metadata polls count at their real share.

    .venv/bin/python -m bench.emitter_bench [--polls 20]

Also prints the time to render /metrics once (Prometheus scrape) at each size.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from emitter.config import EmitterConfig
from emitter.http_server import exposition
from emitter.kafka_broker import KafkaBroker
from emitter.service import Emitter


def _create(admin: AdminClient, partitions: int) -> list[str]:
    per_topic = min(partitions, 1_000)
    names = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(partitions // per_topic)]
    # One topic per request: KRaft refuses one request that creates 10,000 partitions
    # ("excessively large batch operation").
    for name in names:
        admin.create_topics(
            [NewTopic(name, num_partitions=per_topic, replication_factor=1)], request_timeout=120
        )[name].result(120)
    return names


def _fill(bootstrap: str, topics: list[str], per_topic: int, group: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for topic in topics:
        for partition in range(per_topic):
            producer.produce(topic, value=b"{}", partition=partition)
    producer.flush(120)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(
        offsets=[TopicPartition(t, p, 0) for t in topics for p in range(per_topic)],
        asynchronous=False,
    )
    consumer.close()


def measure(broker: KafkaBroker, partitions: int, polls: int) -> tuple[float, float, float, float]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    topics = _create(admin, partitions)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    _fill(broker.bootstrap_servers, topics, min(partitions, 1_000), group)
    config = EmitterConfig(
        bootstrap_servers=broker.bootstrap_servers,
        topics=topics,
        control_topic=f"bench-ctl-{uuid.uuid4().hex[:8]}",
        group=group,
        idle_timeout_ms=3_600_000,
        request_timeout_ms=30_000,
    )
    # The emitter's clock advances one poll interval (1 s) per poll, so metadata
    # is re-read every 10th poll, as in a real run at the default settings.
    clock = [0.0]
    emitter = Emitter(config, monotonic_s=lambda: clock[0])
    assert emitter.connect(threading.Event())
    emitter.poll_once()  # warm-up: first sight of every partition
    walls, cpus = [], []
    for _ in range(polls):
        clock[0] += config.poll_interval_ms / 1000
        wall, cpu = time.perf_counter(), time.process_time()
        emitter.poll_once()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    watched = len(emitter.detector.partitions)
    assert watched == partitions, f"watched {watched}, expected {partitions}"
    started = time.perf_counter()
    exposition(emitter.metrics.registry, "", emitter.metrics.partition_text)  # a scrape
    scrape_ms = (time.perf_counter() - started) * 1000
    emitter.close()
    return statistics.median(walls), max(walls), statistics.mean(cpus), scrape_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=20)
    args = parser.parse_args()
    print(
        f"{'partitions':>10} {'median wall ms':>15} {'max wall ms':>12} "
        f"{'mean CPU ms':>12} {'CPU % at 1s':>12} {'/metrics ms':>12}"
    )
    with KafkaBroker() as broker:
        for partitions in (100, 1_000, 10_000):
            wall, worst, cpu, scrape = measure(broker, partitions, args.polls)
            print(
                f"{partitions:>10,} {wall:>15.1f} {worst:>12.1f} {cpu:>12.1f} "
                f"{cpu / 10:>11.1f}% {scrape:>12.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
