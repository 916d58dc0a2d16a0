"""Topics and leaders on the three-node test cluster (tests/conftest.py ``cluster``)."""

from __future__ import annotations

import uuid

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic, PartitionMetadata, TopicMetadata

from slackwater.kafka_cluster import KafkaCluster
from tests.harness.factories import wait_until

# Bounds for waits that span a node's death and return (fenced after 3 s here, then a
# new leader, then clients' metadata refreshed): never what a test asserts.
FAULT_DEADLINE_S = 120.0


def replicated_topic(admin: AdminClient, partitions: int = 1) -> str:
    """A fresh topic with the cluster's default replication, every replica in sync."""
    name = f"c-{uuid.uuid4().hex[:12]}"
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(30)
    wait_until(lambda: in_sync(admin, name) == {3}, 60, f"{name} to have 3 replicas in sync")
    return name


def in_sync(admin: AdminClient, topic: str) -> set[int]:
    """The sizes of the topic's partitions' in-sync replica sets (empty: not listed)."""
    listed = _listed(admin, topic)
    return set() if listed is None else {len(p.isrs) for p in listed.partitions.values()}


def described(admin: AdminClient, topic: str, partition: int = 0) -> PartitionMetadata | None:
    """The partition as the broker asked knows it; None while that broker does not yet
    (a node just started again learns new topics from the controller a moment later)."""
    try:
        listed = _listed(admin, topic)
    except KafkaException:
        return None  # no answer in time on a busy machine: asked again
    return None if listed is None else listed.partitions.get(partition)


def _listed(admin: AdminClient, topic: str) -> TopicMetadata | None:
    """The topic as the broker asked lists it, without an error; None otherwise."""
    found = admin.list_topics(topic, timeout=10).topics.get(topic)
    return None if found is None or found.error is not None else found


def leader_now(admin: AdminClient, topic: str, partition: int = 0) -> int:
    """The partition's leader, -1 while none is known."""
    found = described(admin, topic, partition)
    return -1 if found is None else int(found.leader)


def leader_of(admin: AdminClient, topic: str, partition: int = 0) -> int:
    """The partition's leader, once one is known."""

    def known() -> tuple[int] | None:
        leader = leader_now(admin, topic, partition)
        return (leader,) if leader >= 0 else None

    found: tuple[int] = wait_until(known, FAULT_DEADLINE_S, f"a leader for {topic}[{partition}]")
    return found[0]


def kill_leader(
    cluster: KafkaCluster, admin: AdminClient, topic: str, timeout_s: float = FAULT_DEADLINE_S
) -> int:
    """SIGKILLs the leader of ``topic``'s partition 0 and waits for another; returns the
    killed node's id."""
    leader = leader_of(admin, topic)
    cluster.node(leader).kill()
    wait_until(
        lambda: leader_now(admin, topic) not in (leader, -1),
        timeout_s,
        f"a new leader for {topic}[0] after node {leader} was killed",
    )
    return leader
