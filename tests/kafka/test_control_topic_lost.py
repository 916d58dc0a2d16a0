"""The control topic changed under a running emitter, on Apache Kafka (issue 42, findings
2 and 6): deleted, it is noticed, said, made again compacted and written again whole (a
new epoch claim and every partition's marker); a write of ours never makes it again by
itself, though the test broker creates topics on request (Kafka's default
``auto.create.topics.enable=true``, which tests/conftest.py keeps); with partitions
added, every record still goes to partition 0, and a second emitter's claim fences the
first."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, ResourceType

from emitter.control_topic import ControlTopicError, ControlTopicReader, ControlTopicWriter
from slackwater import kafka_clients
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import EpochClaim, Marker, MarkerStatus
from tests.conftest import TEST_BROKER_SETTINGS, EmitterFactory, TopicFactory
from tests.harness.emitter import DEADLINE_S, produce_one
from tests.harness.factories import wait_until
from tests.harness.production import delete_topic

ACTIVE, IDLE = MarkerStatus.ACTIVE, MarkerStatus.IDLE
# A marker written while the topic is gone waits for its delivery report (10 s at the
# harness's request timeout) before the poll that notices the loss: room for two.
REPAIR_DEADLINE_S = 2 * DEADLINE_S


def control_records(bootstrap: str, control: str) -> list[Marker | EpochClaim]:
    """The claims and markers on the control topic, read from its start; none while the
    broker does not list it."""
    try:
        reader = ControlTopicReader(bootstrap, control, {}, 5.0)
    except (KeyError, ControlTopicError):  # not listed (yet)
        return []
    try:
        read = reader.read_to_end().records
    finally:
        reader.close()
    return [r for r in read if isinstance(r, Marker | EpochClaim)]


def cleanup_policy(admin: AdminClient, topic: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return str(entries["cleanup.policy"].value)


def test_the_test_broker_creates_topics_on_request() -> None:
    """What the next tests rely on: Kafka's default, which any client may trigger."""
    assert "auto.create.topics.enable" not in TEST_BROKER_SETTINGS


def test_a_control_write_never_creates_the_topic(broker: KafkaBroker, admin: AdminClient) -> None:
    """Before issue 42 the write was acknowledged: the producer's metadata request made
    the topic, with the broker's defaults (cleanup.policy=delete)."""
    control = f"ctl-{uuid.uuid4().hex[:12]}"
    writer = ControlTopicWriter(broker.bootstrap_servers, control, {}, delivery_timeout_s=2.0)
    try:
        with pytest.raises(ControlTopicError, match="not delivered"):
            writer.write(EpochClaim(emitter_id="e", epoch=1, claimed_at=0))
    finally:
        writer.close(1.0)
    # The producer asked for the topic's metadata at once, two seconds before it gave up.
    assert control not in admin.list_topics(timeout=10).topics


def test_a_deleted_control_topic_is_made_again_compacted_with_every_marker(
    admin: AdminClient,
    new_topic: TopicFactory,
    emitters: EmitterFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before issue 42 the ACTIVE marker made the topic again (cleanup.policy=delete)
    holding that marker alone: the other partitions' IDLE markers were gone."""
    topic, control = new_topic(partitions=3), f"ctl-{uuid.uuid4().hex[:12]}"
    running = emitters(topics=[topic], control_topic=control)
    bootstrap = running.emitter.config.bootstrap_servers
    for partition in range(3):
        produce_one(bootstrap, topic, partition)

    def last_markers() -> dict[int, tuple[MarkerStatus, int, int]]:
        markers = [r for r in control_records(bootstrap, control) if isinstance(r, Marker)]
        return {m.partition: (m.status, m.offset, m.epoch) for m in markers}

    wait_until(
        lambda: last_markers() == {p: (IDLE, 1, 1) for p in range(3)}, DEADLINE_S, "IDLE@1 x3"
    )
    caplog.set_level(logging.INFO, logger="emitter")
    delete_topic(admin, control)
    # A record while it is gone: the emitter's ACTIVE marker is written before the loss
    # is known (before issue 42 that write made the topic again, cleanup.policy=delete).
    produce_one(bootstrap, topic, 0)

    def written_again() -> list[Marker | EpochClaim]:
        records = control_records(bootstrap, control)
        claims = [r for r in records if isinstance(r, EpochClaim)]
        final = {r.partition: (r.status, r.offset) for r in records if isinstance(r, Marker)}
        whole = final == {0: (ACTIVE, 1), 1: (IDLE, 1), 2: (IDLE, 1)}
        return records if claims and whole else []

    records = wait_until(written_again, REPAIR_DEADLINE_S, "the control topic written again")
    assert cleanup_policy(admin, control) == "compact"
    claim, *markers = records
    assert isinstance(claim, EpochClaim) and claim.epoch == 2  # above the lost topic's 1
    # Every partition's marker at the new epoch, each partition's seq still rising.
    assert [(m.partition, m.status, m.offset, m.epoch, m.seq) for m in markers] == [
        (0, IDLE, 1, 2, 1),
        (1, IDLE, 1, 2, 1),
        (2, IDLE, 1, 2, 1),
        (0, ACTIVE, 1, 2, 2),
    ]
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith(f"control topic {control} is gone") for line in said), said
    prefix = "slackwater_emitter_control_topic_"
    wait_until(lambda: running.metric(prefix + "repairs_total") == 1.0, DEADLINE_S, "repaired")
    assert running.metric(prefix + "recreations_total") == 1.0
    assert running.metric(prefix + "present") == 1.0
    assert running.metric(prefix + "compacted") == 1.0
    assert running.metric(prefix + "partitions") == 1.0
    assert running.emitter.epoch == 2


def test_partitions_added_to_the_control_topic_leave_fencing_whole(
    admin: AdminClient, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    """Raised from 1 to 6 partitions under a running emitter: a second emitter (outside
    the first one's group: another deployment, an old version) claims an epoch, and the
    first sees the claim. Before issue 42 the claim's key hashed to partition 3, which
    the first emitter never read: it went on publishing at its old epoch."""
    topic, control = new_topic(partitions=2), new_topic(prefix="ctl")
    first = emitters(topics=[topic], control_topic=control, emitter_id="first")
    bootstrap = first.emitter.config.bootstrap_servers
    produce_one(bootstrap, topic, 0)
    wait_until(lambda: first.emitter.epoch == 1, DEADLINE_S, "the first emitter's epoch")
    admin.create_partitions([NewPartitions(control, 6)])[control].result(30)
    wait_until(lambda: kafka_clients.all_partitions_led(admin, control, 6), DEADLINE_S, "6 led")
    second = emitters(
        topics=[topic],
        control_topic=control,
        emitter_id="second",
        election_group=f"other-{uuid.uuid4().hex[:8]}",
    )
    assert second.emitter.epoch == 2
    fenced = "slackwater_emitter_fenced"
    wait_until(lambda: first.metric(fenced) == 1.0, DEADLINE_S, "the first emitter fenced")
    produce_one(bootstrap, topic, 1)  # the second one publishes for it
    wait_until(
        lambda: any(
            isinstance(r, Marker) and r.emitter_id == "second"
            for r in control_records(bootstrap, control)
        ),
        DEADLINE_S,
        "a marker of the second emitter",
    )
    assert records_by_partition(bootstrap, control)[1:] == [0, 0, 0, 0, 0]
    # The partition count is a metric, not only a line at start.
    wait_until(
        lambda: second.metric("slackwater_emitter_control_topic_partitions") == 6.0,
        DEADLINE_S,
        "6 control partitions in the second emitter's metrics",
    )


def records_by_partition(bootstrap: str, control: str) -> list[int]:
    """How many records each partition of the control topic holds (its log ends)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4()}"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(control, p), timeout=10)[1]
            for p in range(6)
        ]
    finally:
        consumer.close()
