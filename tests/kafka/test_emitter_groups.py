"""Every kind of consumer group the emitter watches (issue 42, finding 8): a group of
Kafka 4's consumer protocol (KIP-848, ``group.protocol=consumer``: the broker assigns,
``ConsumerGroupDescribe`` describes it) gives the emitter's ``/status`` and ``/metrics``
the same owners, lag and markers as a classic group (``JoinGroup``/``SyncGroup``,
``DescribeGroups``). Streams and share groups: docs/emitter.md, "Kinds of consumer group"."""

from __future__ import annotations

import queue
import threading
import uuid
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from tests.conftest import EmitterFactory, TopicFactory
from tests.harness.emitter import DEADLINE_S, RunningEmitter, commit, control_markers, produce_one
from tests.harness.factories import wait_until

ACTIVE, IDLE = MarkerStatus.ACTIVE, MarkerStatus.IDLE


class GroupMember:
    """One consumer of the group, polling in a thread: a KIP-848 member takes the
    assignment the broker hands it only inside ``poll`` (and a classic one joins there).
    Every call on the consumer is made by that thread: another thread's call (a
    synchronous commit, ``memberid``) waited while the loop polled, up to minutes
    (confluent-kafka 2.16.1)."""

    def __init__(self, bootstrap: str, group: str, topic: str, group_protocol: str) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": group_protocol,
            "enable.auto.commit": False,  # the test commits the offsets the lag is read from
            "auto.offset.reset": "earliest",
        }
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic])
        self.assigned: list[int] = []
        self.member_id: str | None = None
        self._commits: queue.Queue[tuple[list[TopicPartition], Future[None]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.1)
            self.assigned = sorted(tp.partition for tp in self.consumer.assignment())
            self.member_id = self.consumer.memberid()
            self._commit_asked()

    def commit(self, offsets: list[TopicPartition]) -> None:
        """The group's offsets committed by the polling thread, between two polls."""
        done: Future[None] = Future()
        self._commits.put((offsets, done))
        done.result(timeout=2 * DEADLINE_S)  # commit() retries for DEADLINE_S at most

    def _commit_asked(self) -> None:
        while not self._commits.empty():
            offsets, done = self._commits.get()
            try:
                commit(self.consumer, offsets)
                done.set_result(None)
            except Exception as error:  # handed to the test's thread, which raises it
                done.set_exception(error)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def _markers_of(bootstrap: str, control: str, partition: int) -> list[tuple[MarkerStatus, int]]:
    return [
        (m.status, m.offset)
        for m in control_markers(bootstrap, control)
        if m.partition == partition
    ]


def _lag(running: RunningEmitter, group: str, topic: str, partition: int) -> float | None:
    return running.metric(
        "slackwater_emitter_group_lag_offsets", group=group, topic=topic, partition=str(partition)
    )


def _owned_by_one_member(running: RunningEmitter) -> dict[str, Any] | None:
    """/status once its group has one member that owns every watched partition."""
    status = running.status()
    members = status["members"] or {}
    owned = len(members) == 1 and status["unowned_partitions"] == []
    return status if owned else None


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_either_group_protocol_gives_the_emitter_owners_lag_and_markers(
    group_protocol: str, broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    """One member owns both partitions; the group's commits (2 behind on partition 0,
    caught up on 1) are the lag; partition 1 goes quiet (IDLE@2), resumes (ACTIVE@2) and
    goes quiet again (IDLE@3), while the group falls one behind on it."""
    bootstrap = broker.bootstrap_servers
    topic, group = new_topic(partitions=2), f"g-{group_protocol}-{uuid.uuid4().hex[:8]}"
    control = f"ctl-{uuid.uuid4().hex[:12]}"
    produce_one(bootstrap, topic, 0, count=3)
    produce_one(bootstrap, topic, 1, count=2)
    member = GroupMember(bootstrap, group, topic, group_protocol)
    try:
        # The join is the broker's business: bounded apart from the emitter's view of it.
        wait_until(lambda: member.assigned == [0, 1], DEADLINE_S, "the consumer's assignment")
        member.commit([TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 2)])
        running = emitters(topics=[topic], control_topic=control, group=group)
        status = wait_until(
            lambda: _owned_by_one_member(running), DEADLINE_S, "one member owning both"
        )
        # Its owner by the id the group coordinator gave the member (a KIP-848 member
        # id is the client's own UUID; a classic one the coordinator's name).
        member_id = member.member_id
        assert status["members"] == {member_id: [f"{topic}:0", f"{topic}:1"]}
        assert [row["owner"] for row in status["partitions"]] == [member_id, member_id]
        assert running.metric("slackwater_emitter_group_members", group=group) == 1
        assert running.metric("slackwater_emitter_partitions_without_owner", group=group) == 0
        wait_until(lambda: _lag(running, group, topic, 0) == 2, DEADLINE_S, "lag 2 on 0")
        assert _lag(running, group, topic, 1) == 0

        wait_until(lambda: _markers_of(bootstrap, control, 1), DEADLINE_S, "IDLE on 1")
        assert _markers_of(bootstrap, control, 1) == [(IDLE, 2)]
        produce_one(bootstrap, topic, 1)  # partition 1 resumes
        wait_until(
            lambda: len(_markers_of(bootstrap, control, 1)) >= 3,
            DEADLINE_S,
            "ACTIVE then IDLE on 1",
        )
        assert _markers_of(bootstrap, control, 1) == [(IDLE, 2), (ACTIVE, 2), (IDLE, 3)]
        wait_until(lambda: _lag(running, group, topic, 1) == 1, DEADLINE_S, "lag 1 on 1")
        member.commit([TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 3)])
        wait_until(
            lambda: _lag(running, group, topic, 0) == 0 and _lag(running, group, topic, 1) == 0,
            DEADLINE_S,
            "caught up on both",
        )
    finally:
        member.close()
