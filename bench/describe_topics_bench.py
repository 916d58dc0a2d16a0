"""The CPU one DescribeTopics costs this process, beside a metadata request of the same
topic, by partitions: the price of asking a topic's id (kafka_evidence rule 6) with
confluent-kafka, which carries the id only in DescribeTopics' answer.

    .venv/bin/python -m bench.describe_topics_bench [--partitions 300 1000] [--calls 50]

One topic per size on the launcher's single node. Each call is timed alone, wall and
CPU (``time.process_time``: every thread of this process, the client's own included,
where the answer becomes Python objects); median of ``--calls`` after one not counted.
A plan with records at 1,000 partitions pays one DescribeTopics (docs/performance.md,
"Planning above the Kafka requests (issue 44, item 2)").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from bench.topics import MAX_PARTITIONS_PER_TOPIC, create_led
from slackwater.kafka_broker import KafkaBroker


def timed(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``call`` (the first call not counted)."""
    call()
    walls, cpus = [], []
    for _ in range(calls):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[300, 1_000])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    if not all(1 <= p <= MAX_PARTITIONS_PER_TOPIC for p in args.partitions):
        parser.error(f"--partitions: one topic, of 1 to {MAX_PARTITIONS_PER_TOPIC:,}")
    if args.calls < 1:
        parser.error("--calls: at least 1")
    print("| partitions | request | wall ms | CPU ms |\n|---:|---|---:|---:|", flush=True)
    with KafkaBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for partitions in args.partitions:
            [topic], _ = create_led(admin, "described", partitions)

            def described(topic: str = topic) -> Any:
                return admin.describe_topics(TopicCollection([topic]))[topic].result()

            def listed(topic: str = topic) -> Any:
                return admin.list_topics(topic, timeout=30)

            requests = {"DescribeTopics": described, "metadata (list_topics)": listed}
            for name, call in requests.items():
                wall_ms, cpu_ms = timed(call, args.calls)
                print(f"| {partitions:,} | {name} | {wall_ms:.1f} | {cpu_ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
