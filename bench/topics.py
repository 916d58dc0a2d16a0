"""Topics for the benches on the launcher's node: many partitions as topics of at most
1,000 each (KRaft refuses one CreateTopics request for more: POLICY_VIOLATION,
"Excessively large number of partitions per request"), returned once every partition
has a leader (a record sent before fails with UNKNOWN_TOPIC_OR_PART); and records
written to them as fast as the producer takes them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater import kafka_clients

MAX_PARTITIONS_PER_TOPIC = 1_000


def create_led(
    admin: AdminClient, prefix: str, partitions: int, timeout_s: float = 300
) -> tuple[list[str], int]:
    """Fresh topics holding ``partitions`` partitions (a multiple of 1,000 above it), one
    request each; returns their names and the partitions of each."""
    per_topic = min(partitions, MAX_PARTITIONS_PER_TOPIC)
    names = [f"{prefix}-{uuid.uuid4().hex[:8]}" for _ in range(partitions // per_topic)]
    for name in names:
        kafka_clients.create_topic(admin, NewTopic(name, per_topic, 1), timeout_s)
    deadline = time.monotonic() + timeout_s
    while not all(kafka_clients.all_partitions_led(admin, name, per_topic) for name in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"created partitions without a leader after {timeout_s:.0f} s")
        time.sleep(0.5)
    return names, per_topic


def produce_waiting(producer: Producer, topic: str, **record: Any) -> None:
    """One record, waiting while the producer's queue is full (BufferError) instead of
    failing: a bench writes faster than one broker on two cores takes them."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


def produce_event_times(
    producer: Producer,
    bootstrap: str,
    topic: str,
    plan: dict[int, list[int]],
    key_of: Callable[[int, int], bytes],
) -> dict[int, int]:
    """Writes ``plan``'s records (partition -> event times, ms, as Kafka timestamps) with
    the keys ``key_of(partition, index)`` gives, in order; returns each partition's log
    end, checked to hold them all."""
    for partition, times in plan.items():
        for index, event_ms in enumerate(times):
            produce_waiting(
                producer,
                topic,
                key=key_of(partition, index),
                value=b"{}",
                partition=partition,
                timestamp=event_ms,
            )
        producer.poll(0)
    assert producer.flush(120) == 0, "records left unsent"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}"})
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in plan
    }
    consumer.close()
    assert ends == {p: len(times) for p, times in plan.items()}, ends
    return ends
