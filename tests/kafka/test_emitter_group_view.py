"""The watched group as the emitter's /status shows it on a loaded machine (issue 42,
finding 7): a group request answered after the request timeout's worth of a poll is
still taken (emitter/observer.py: carried into the next polls, never abandoned), so
the owners of a group's partitions show up however slowly the coordinator answers.
Run under ``../shared/tools/make-test-under-load``'s busy loops it must pass too."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from confluent_kafka import Consumer

from slackwater.kafka_broker import KafkaBroker
from tests.conftest import EmitterFactory, TopicFactory
from tests.harness.emitter import DEADLINE_S
from tests.harness.factories import wait_until


class GroupMember:
    """A consumer in the group, polling in a thread so that it stays a member."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic])
        self.assigned: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.1)
            self.assigned = sorted(tp.partition for tp in self.consumer.assignment())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def test_every_partition_a_consumer_owns_shows_as_owned_in_status(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    """FAST settings (a request timeout of 1 s): the consumer's assignment, once the
    consumer has it, reaches /status; ``unowned_partitions`` empties and every row names
    the one member as its owner."""
    topic, group = new_topic(partitions=3), f"g-{uuid.uuid4().hex[:8]}"
    running = emitters(topics=[topic], control_topic=f"ctl-{uuid.uuid4().hex[:12]}", group=group)
    member = GroupMember(broker.bootstrap_servers, group, topic)
    try:
        # The consumer's own join is the broker's business, not the emitter's: bounded
        # apart, so that a failure below is the emitter's view of an assignment made.
        wait_until(lambda: member.assigned == [0, 1, 2], 4 * DEADLINE_S, "the consumer's join")

        def all_owned() -> dict[str, Any] | None:
            status = running.status()
            owners = {row["owner"] for row in status["partitions"]}
            done = len(status["partitions"]) == 3 and status["unowned_partitions"] == []
            return status if done and None not in owners else None

        status = wait_until(all_owned, DEADLINE_S, "/status to show every partition owned")
        (member_id,) = status["members"]
        assert {row["owner"] for row in status["partitions"]} == {member_id}
        assert status["members"][member_id] == [f"{topic}:{p}" for p in range(3)]
    finally:
        member.close()
