"""Broker actions and stand-ins for the production cases of the source (semantics.md §6,
"What production brings"; issue 21): topics made, deleted and re-created, records sent
and deleted, plans stepped until a change shows, and a planner client whose answers
put a partition's log end below the read position.

Each case stalled, crash-looped or lost data in silence before (issue 21). Most drive the
stream reader as Spark does, in the test's process (tests/harness/source_driver.py),
because each needs a window that must be certain: between planning and reading, between
a stop and a restart, inside the planner's wait; what broke Spark's own watermark runs
in Spark."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from typing import Any

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.shared.options import SourceOptions
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import Writer
from tests.harness.source_driver import Driven, real


def setup(
    broker: KafkaBroker, new_topic: TopicFactory, partitions: int, **config: str
) -> tuple[str, str, Writer]:
    topic = new_topic(partitions=partitions, **config)
    control = new_topic(partitions=1, prefix="ctl")
    return topic, control, Writer(broker.bootstrap_servers, topic, control)


def send(broker: KafkaBroker, topic: str, *values: bytes, timestamp: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for value in values:
        if timestamp is None:
            producer.produce(topic, value=value, partition=0)
        else:
            producer.produce(topic, value=value, partition=0, timestamp=timestamp)
        assert producer.flush(10) == 0


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Deletes a topic and waits until the broker no longer lists it."""
    admin.delete_topics([topic])[topic].result(30)
    wait_until(
        lambda: topic not in admin.list_topics(timeout=10).topics, 30, f"{topic} to be deleted"
    )


def assert_never_listed(admin: AdminClient, topic: str, seconds: float) -> None:
    """A thing that must not happen can only be watched for a while."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert topic not in admin.list_topics(timeout=10).topics, f"{topic} was created again"
        time.sleep(0.2)


def delete_records_before(admin: AdminClient, topic: str, partition: int, offset: int) -> None:
    """What time retention does: the log starts at ``offset`` from now on."""
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for future in futures.values():
        future.result(30)


def latest() -> Any:
    from confluent_kafka.admin import OffsetSpec

    return OffsetSpec.latest()  # type: ignore[no-untyped-call]


def created(admin: AdminClient, topic: str, partitions: int = 1) -> bool:
    """Creates the topic again once the broker lets it (deletion finishes a moment later)."""
    from confluent_kafka import KafkaException

    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[
            topic
        ].result(30)
    except KafkaException:
        return False
    wait_until(
        lambda: all(
            p.leader >= 0
            for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()
        ),
        30,
        f"{topic} to have a leader",
    )
    return True


def text(flag: bool) -> str:
    return str(flag).lower()


def marker(topic: str, status: MarkerStatus, offset: int, *, epoch: int, seq: int) -> Marker:
    return Marker(
        topic=topic,
        partition=0,
        status=status,
        offset=offset,
        emitted_at=0,
        emitter_id="test",
        epoch=epoch,
        seq=seq,
    )


def step_until(driven: Driven, done: Any, what: str) -> list[dict[str, Any]]:
    """Triggers until ``done()``: the broker shows a new partition a moment after
    CreatePartitions answers. Returns the data rows read meanwhile."""
    rows: list[dict[str, Any]] = []

    def stepped() -> bool:
        rows.extend(real(driven.step()))
        return bool(done())

    wait_until(stepped, 60, what)
    return rows


class LowBroker(PlannerClient):
    """The real broker's answers, but while ``low`` the plans see ``topic``'s partition
    0 end at 0, answered in the leader epoch ``epoch_ahead`` past the real answer's: what
    a leader that lost its place answers (the same epoch or an older one), or a new
    leader after an unclean election truncated the log (a newer one)."""

    def __init__(self, options: SourceOptions, topic: str, epoch_ahead: int = 0) -> None:
        super().__init__(options)
        self.key = (topic, 0)
        self.epoch_ahead = epoch_ahead
        self.low = True
        self.lowered = 0
        # After ``low``: the real ends, answered in the epoch ``epoch_ahead`` past the
        # real one still (the new leader's, not the deposed one's).
        self.stays_ahead = False

    def observe(self, planned: Collection[str]) -> PlanAnswers:
        now = super().observe(planned)
        if not self.low:
            if not self.stays_ahead or self.key not in now.leader_epochs:
                return now
            ahead = now.leader_epochs[self.key] + self.epoch_ahead
            return dataclasses.replace(now, leader_epochs={**now.leader_epochs, self.key: ahead})
        self.lowered += 1
        epochs = dict(now.leader_epochs)
        epochs[self.key] = now.leader_epochs[self.key] + self.epoch_ahead
        latest = {**now.latest, self.key: 0}
        control_ends = {**now.control_ends}
        if self.key[0] == self.options.control_topic:
            control_ends["0"] = 0
        return dataclasses.replace(
            now, latest=latest, control_ends=control_ends, leader_epochs=epochs
        )
