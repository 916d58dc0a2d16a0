"""CPU of the emitter's two per-partition requests alone, by batch size and partitions.

ListOffsets (through slackwater.list_offsets, as the emitter sends it) and OffsetFetch
(the group's committed offsets, public API) for every partition, in batches, all
submitted before any is awaited, as one poll does; the mean CPU ms of the whole process
(librdkafka's threads included) over --rounds rounds. On Apache Kafka (the launcher's
single node), topics of 1,000 partitions with a record and a committed offset each.
Why the emitter's batches are 250 partitions, and where its cost grows faster than the
partitions (docs/performance.md).

    .venv/bin/python -m bench.emitter_requests_bench [--rounds 20]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from bench.emitter_bench import _fill
from bench.topics import create_led
from slackwater import list_offsets
from slackwater.kafka_broker import KafkaBroker


def _cpu_ms(call: Callable[[], int], expected: int, rounds: int) -> float:
    assert call() == expected  # warm-up, and every partition answered
    started = time.process_time()
    for _ in range(rounds):
        call()
    return (time.process_time() - started) * 1000 / rounds


def measure(
    admin: AdminClient, partitions: list[tuple[str, int]], group: str, batch: int, rounds: int
) -> tuple[float, float]:
    batches = [partitions[i : i + batch] for i in range(0, len(partitions), batch)]
    requests = [list_offsets.Request(b, OffsetSpec.latest()) for b in batches]  # type: ignore[no-untyped-call]
    committed = [[TopicPartition(t, p) for t, p in b] for b in batches]

    def log_ends() -> int:
        futures = [list_offsets.submit(admin, r, timeout_s=30) for r in requests]
        return sum(len(f.result(30)) for f in futures)

    def offsets() -> int:
        futures = [
            admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, b)], request_timeout=30
            )
            for b in committed
        ]
        return sum(len(f[group].result(30).topic_partitions) for f in futures)

    count = len(partitions)
    return _cpu_ms(log_ends, count, rounds), _cpu_ms(offsets, count, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"{'partitions':>10} {'batch':>6} {'ListOffsets CPU ms':>19} {'OffsetFetch CPU ms':>19}")
    with KafkaBroker() as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for count, batches in ((1_000, (250,)), (10_000, (100, 250, 500, 1_000, 2_000))):
            topics, per_topic = create_led(admin, "bench", count)
            group = f"bench-{uuid.uuid4().hex[:8]}"
            _fill(broker.bootstrap_servers, topics, per_topic, group)
            partitions = [(t, p) for t in topics for p in range(per_topic)]
            for batch in batches:
                log_ends_ms, offsets_ms = measure(admin, partitions, group, batch, args.rounds)
                print(f"{count:>10,} {batch:>6} {log_ends_ms:>19.1f} {offsets_ms:>19.1f}")


if __name__ == "__main__":
    main()
