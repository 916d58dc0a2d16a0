"""The Admin API observer on the real broker: one view per poll, exact log ends."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from emitter.observer import BrokerObserver
from slackwater import list_offsets
from slackwater.kafka_broker import KafkaBroker
from tests.conftest import TopicFactory
from tests.harness.emitter import commit, produce_one


def test_log_ends_and_group_offsets_across_batches(
    broker: KafkaBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(partitions=5)
    for partition in range(5):
        produce_one(broker.bootstrap_servers, topic, partition, count=partition)
    group = f"{topic}-group"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    commit(consumer, [TopicPartition(topic, 3, 1)])
    consumer.close()
    observer = BrokerObserver(admin, 5.0, metadata_interval_s=10.0, batch_partitions=2)
    view = observer.observe([topic, "no-such-topic"], group)
    assert view.reachable and view.errors == {}
    assert view.topics == {topic: 5}
    assert view.log_end_offsets == {(topic, p): p for p in range(5)}
    assert view.committed_offsets == {(topic, 3): 1}
    # The public per-partition-future API gives the same answer as the batched C call.
    monkeypatch.setitem(list_offsets.C_METHODS, "list_offsets", None)
    assert observer.observe([topic], None).log_end_offsets == view.log_end_offsets


def test_metadata_is_reread_only_every_interval(
    broker: KafkaBroker, admin: AdminClient, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=1)
    clock = [0.0]
    observer = BrokerObserver(admin, 5.0, metadata_interval_s=10.0, monotonic_s=lambda: clock[0])
    assert observer.observe([topic], None).topics == {topic: 1}
    clock[0] = 5.0
    cached = observer.observe([topic], None)
    assert cached.topics is None and cached.reachable  # offsets read, metadata not
    assert cached.log_end_offsets == {(topic, 0): 0}
    clock[0] = 10.0
    assert observer.observe([topic], None).topics == {topic: 1}
