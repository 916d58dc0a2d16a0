"""The Admin API observer on the real broker: one view per poll, exact log ends, a slow
answer stamped and carried (issue 42)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from emitter.observer import BrokerObserver, PollAnswers
from slackwater import list_offsets
from slackwater.kafka_broker import KafkaBroker
from tests.conftest import TopicFactory
from tests.harness.emitter import commit, produce_one
from tests.harness.factories import wait_until
from tests.harness.process import stopped_node


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


# Issue 42: a slow answer, on the real broker stopped in its tracks (SIGSTOP: its
# connections stay open, its answers do not come).


class CountingAdmin:
    """The real Admin client, with the group's DescribeGroups requests counted."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin
        self.described = 0

    def describe_consumer_groups(self, *args: Any, **kwargs: Any) -> Any:
        self.described += 1
        return self._admin.describe_consumer_groups(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._admin, name)


def test_a_group_answer_slower_than_the_request_timeout_is_carried_and_taken(
    broker: KafkaBroker, admin: AdminClient, new_topic: TopicFactory
) -> None:
    """Finding 7: the broker stopped past the request timeout (1 s) while DescribeGroups
    is in flight. The poll that sent it and the polls after show no view of the group and
    send no other; once the broker answers, the carried request's view is taken (before
    the fix every poll gave its request up and sent a new one, which a broker slower than
    the timeout never answered in time)."""
    topic, group = new_topic(partitions=2), f"g-{uuid.uuid4().hex[:8]}"
    member = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    member.subscribe([topic])
    try:
        wait_until(lambda: member.poll(0.1) is None and member.assignment(), 60, "the join")
        counting = CountingAdmin(admin)
        observer = BrokerObserver(
            counting,  # type: ignore[arg-type]
            1.0,
            metadata_interval_s=3_600.0,
        )
        assert observer.observe([topic], group).assignment is not None
        with stopped_node(broker):
            first = observer.observe([topic], group)  # sends one, waits 1 s, carries it
            assert first.assignment is None and counting.described == 2
            assert first.log_end_offsets == {}  # (ListOffsets unanswered: not a log end)
            second = observer.observe([topic], group)  # past the request timeout
            assert second.assignment is None and counting.described == 2

        def taken() -> PollAnswers | None:
            answers = observer.observe([topic], group)
            return answers if answers.assignment is not None else None

        answers: PollAnswers = wait_until(taken, 60, "the carried DescribeGroups' answer")
        assert counting.described == 2  # the one sent while the broker was stopped
        (owned,) = answers.assignment.values() if answers.assignment else [[]]
        assert sorted(owned) == [(topic, 0), (topic, 1)]
    finally:
        member.close()


def test_log_ends_are_stamped_when_asked_and_when_answered(
    admin: AdminClient, new_topic: TopicFactory
) -> None:
    """The times the detector counts stillness from (detector.py): ListOffsets is sent
    after the first stamp and answered before the second; what the poll waits for after
    (DescribeTopics, asked on the first poll) is after both."""
    topic = new_topic(partitions=1)
    clock = iter(range(100))
    observer = BrokerObserver(
        admin, 5.0, metadata_interval_s=3_600.0, monotonic_s=lambda: float(next(clock))
    )
    answers = observer.observe([topic], None)
    # The clock's readings: 0 when the metadata was read, 1 the request, 2 the answer.
    assert (answers.requested_s, answers.answered_s) == (1.0, 2.0)
    assert answers.log_end_offsets == {(topic, 0): 0}
    quiet = observer.observe([topic], None)
    assert (quiet.requested_s, quiet.answered_s) == (4.0, 5.0)  # (3: is metadata due?)
