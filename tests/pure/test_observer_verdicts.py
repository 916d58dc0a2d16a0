"""The observer's round of requests without a broker (emitter/observer.py, issue 41):
topic ids asked only where the log ends call for it (a topic whose id is not known yet,
or with an answer other than what was seen), in one DescribeTopics after ListOffsets; a
re-created topic found whatever its length, and seen from its next answer; offsets Kafka
did not give left out (rule 5); the group tracker's lag of a new log dated by the new
log alone. An Admin client stand-in answers as confluent-kafka's does."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ListOffsetsResultInfo

from emitter.group_tracker import GroupTracker
from emitter.known_ends import NO_NEW_LOG, NewLogs
from emitter.observer import BrokerObserver, PollAnswers
from slackwater import list_offsets


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
    return future


class Admin:
    """Answers a poll's requests from its fields, and keeps the order they were sent in."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions
        self.ids: dict[str, str | KafkaException] = {t: f"{t}-1" for t in partitions}
        self.ends: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.sent: list[tuple[str, list[str]]] = []

    def list_topics(self, timeout: float) -> Any:
        topics = {
            name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
            for name, count in self.partitions.items()
        }
        return SimpleNamespace(topics=topics)

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Future[Any]]:
        names = list(topics.topic_names)
        self.sent.append(("describe_topics", names))
        return {
            n: _done(i if isinstance(i, BaseException) else SimpleNamespace(topic_id=i))
            for n, i in self.ids.items()
            if n in names
        }

    def list_offsets(self, specs: dict[TopicPartition, Any], **_: Any) -> dict[Any, Future[Any]]:
        self.sent.append(("list_offsets", sorted({tp.topic for tp in specs})))
        return {
            tp: _done(ListOffsetsResultInfo(self.ends.get((tp.topic, tp.partition), 0), -1, 0))
            for tp in specs
        }

    def list_consumer_group_offsets(self, requests: list[Any], **_: Any) -> dict[str, Any]:
        (request,) = requests
        answered = []
        for tp in request.topic_partitions:
            one = TopicPartition(
                tp.topic, tp.partition, self.committed.get((tp.topic, tp.partition), -1)
            )
            answered.append(one)
        return {request.group_id: _done(SimpleNamespace(topic_partitions=answered))}

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Any]:
        return {group: _done(SimpleNamespace(members=[])) for group in groups}


@pytest.fixture(autouse=True)
def public_list_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in answers the public API (the C method takes a real client)."""
    monkeypatch.setitem(list_offsets.C_METHODS, "list_offsets", None)


def _observer(stand_in: Admin) -> BrokerObserver:
    clock = iter(range(0, 10_000))
    return BrokerObserver(
        stand_in,  # type: ignore[arg-type]
        1.0,
        metadata_interval_s=1_000.0,
        monotonic_s=lambda: float(next(clock)),
    )


def test_ids_are_asked_after_the_log_ends_and_only_where_they_call_for_it() -> None:
    """The first poll asks every topic's (none known yet); a quiet poll asks none; a
    poll where a log end moved asks its topic's only."""
    admin = Admin({"t": 2, "u": 1})
    observer = _observer(admin)
    for _ in range(3):  # metadata is read once (its interval)
        observer.observe(["t", "u"], None)
    admin.ends[("u", 0)] = 4
    observer.observe(["t", "u"], None)
    assert admin.sent == [
        ("list_offsets", ["t", "u"]),
        ("describe_topics", ["t", "u"]),
        ("list_offsets", ["t", "u"]),
        ("list_offsets", ["t", "u"]),
        ("list_offsets", ["t", "u"]),
        ("describe_topics", ["u"]),
    ]


def test_a_topic_recreated_past_the_old_end_is_found_at_the_poll_that_sees_it() -> None:
    """Issue 41, finding 1: the new log is already past the old end (9 > 5). Its log ends
    are taken from the next poll (this one's may be the old log's)."""
    admin = Admin({"t": 2})
    admin.ends = {("t", 0): 5, ("t", 1): 5}
    observer = _observer(admin)
    assert observer.observe(["t"], None).new_logs == NO_NEW_LOG
    admin.ids["t"], admin.ends = "t-2", {("t", 0): 9, ("t", 1): 0}
    seen = observer.observe(["t"], None)
    assert (seen.log_end_offsets, seen.new_logs) == ({}, NewLogs(recreated=frozenset({"t"})))
    seen = observer.observe(["t"], None)
    assert (seen.log_end_offsets, seen.new_logs) == ({("t", 0): 9, ("t", 1): 0}, NO_NEW_LOG)


def test_a_topic_not_described_this_poll_stands_still_and_is_asked_again() -> None:
    """Its changed log ends wait for its id (higher or lower: either may be a new
    log's); its unchanged ones are taken; the error is counted."""
    admin = Admin({"t": 2})
    admin.ends = {("t", 0): 5, ("t", 1): 3}
    observer = _observer(admin)
    observer.observe(["t"], None)
    refused = KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT, "no answer"))
    admin.ids["t"], admin.ends = refused, {("t", 0): 8, ("t", 1): 3}
    seen = observer.observe(["t"], None)
    assert (seen.log_end_offsets, seen.new_logs) == ({("t", 1): 3}, NO_NEW_LOG)
    assert seen.errors == {"describe_topics": "no topic id answered for t"}
    admin.ends = {("t", 0): 2, ("t", 1): 3}
    seen = observer.observe(["t"], None)
    assert (seen.log_end_offsets, seen.new_logs) == ({("t", 1): 3}, NO_NEW_LOG)
    admin.ids["t"] = "t-2"
    seen = observer.observe(["t"], None)  # still below what was seen: asked again
    assert (seen.log_end_offsets, seen.new_logs, seen.errors) == (
        {},
        NewLogs(recreated=frozenset({"t"})),
        {},
    )
    assert observer.observe(["t"], None).log_end_offsets == {("t", 0): 2, ("t", 1): 3}


@pytest.mark.parametrize("sentinel", [-1, -1001])
def test_committed_offsets_kafka_did_not_give_are_left_out(sentinel: int) -> None:
    """Rule 5 (kafka_evidence.known_offset): -1 (nothing committed) and librdkafka's
    -1001 are no offsets, never a lag of the whole log."""
    admin = Admin({"t": 3})
    admin.committed = {("t", 0): 4, ("t", 1): sentinel, ("t", 2): 0}
    assert _observer(admin).observe(["t"], "g").committed_offsets == {("t", 0): 4, ("t", 2): 0}


# What the group tracker does with a poll's new logs (emitter/group_tracker.py): the lag
# in seconds of a partition on a new log is dated by the new log's answers only.

T0, U0 = ("t", 0), ("u", 0)


def _poll(
    wall_ms: int, ends: dict[tuple[str, int], int], new: NewLogs = NO_NEW_LOG
) -> tuple[int, PollAnswers]:
    """One poll's answers, the group's offsets at 20."""
    return wall_ms, PollAnswers(
        log_end_offsets=ends, committed_offsets={T0: 20, U0: 20}, new_logs=new
    )


def test_a_recreated_topics_lag_is_not_dated_by_the_old_logs_timeline() -> None:
    """Re-created past the old end (150 > 100): the group's offset 20 is of the new log.
    Dated by the old log's points it would have passed 20 at 200 ms (lag 13.8 s); the
    new log was first answered at 13,000 ms, so its lag is known only from then: 1 s, as
    for a partition first seen (a lower bound). Another topic keeps its timeline."""
    tracker = GroupTracker()
    recreated = NewLogs(recreated=frozenset({"t"}))
    for wall_ms, answers in (
        _poll(0, {T0: 0, U0: 0}),
        _poll(1_000, {T0: 100, U0: 100}),
        _poll(12_000, {U0: 100}, recreated),  # its answer not taken (known_ends.py)
        _poll(13_000, {T0: 150, U0: 100}),
    ):
        tracker.record(answers, [T0, U0], wall_ms)
    assert tracker.lags(T0, 150, 14_000) == (130, 1.0)
    assert tracker.lags(U0, 100, 14_000) == (80, 13.8)
    assert tracker.timelines.timelines[T0].offsets == [150]


def test_a_truncated_logs_timeline_starts_again_from_its_new_end() -> None:
    tracker = GroupTracker()
    truncated = NewLogs(truncated=frozenset({T0}))
    for wall_ms, answers in (
        _poll(0, {T0: 0, U0: 0}),
        _poll(1_000, {T0: 100, U0: 100}),
        _poll(5_000, {T0: 90, U0: 100}, truncated),
    ):
        tracker.record(answers, [T0, U0], wall_ms)
    timeline = tracker.timelines.timelines[T0]
    assert (timeline.wall_ms, timeline.offsets) == ([5_000], [90])
    assert tracker.lags(T0, 90, 6_000) == (70, 1.0)
