"""A batch's ranges grouped into tasks (spark_consumer/source/wire/splits.py): each task
reads its ranges with one pooled consumer and writes one progress record."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from hypothesis import given
from hypothesis import strategies as st

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source.executor import reader_clients
from spark_consumer.source.shared.options import SourceError, SourceOptions
from spark_consumer.source.wire.progress import Progress, Range
from spark_consumer.source.wire.splits import MAX_RANGES_PER_TASK, TaskPartition, group_ranges
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.production import setup
from tests.harness.source_driver import Driven, options, real

ranges_strategy = st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(1, 5_000)), max_size=300
).map(lambda spans: [("t", p, start, start + size) for p, (start, size) in enumerate(spans)])


@given(ranges_strategy, st.integers(1, 64))
def test_grouping_keeps_every_range_once_in_order_in_about_the_tasks_asked(
    ranges: list[Range], tasks: int
) -> None:
    groups = group_ranges(ranges, tasks)
    assert [r for group in groups for r in group] == ranges
    assert all(0 < len(group) <= MAX_RANGES_PER_TASK for group in groups)
    total = sum(end - start for _, _, start, end in ranges)
    share = max(1, -(-total // tasks))
    for group in groups:
        records = sum(end - start for _, _, start, end in group)
        assert records <= share or len(group) == 1  # a range is never split
    # Greedy: two tasks in a row hold more than a share, so at most about twice as many.
    assert len(groups) <= 2 * tasks + 1


def test_without_a_task_count_every_range_is_a_task_of_its_own() -> None:
    ranges = [("t", 0, 0, 5), ("t", 1, 3, 4)]
    assert group_ranges(ranges, None) == [(ranges[0],), (ranges[1],)]


def test_many_small_ranges_make_few_tasks_and_a_task_holds_at_most_the_cap() -> None:
    ranges = [("t", p, 0, 3) for p in range(10_000)]
    groups = group_ranges(ranges, 2)
    assert len(groups) == 10_000 // MAX_RANGES_PER_TASK
    assert group_ranges([("t", 0, 0, 10**6), ("t", 1, 0, 1)], 8) == [
        (("t", 0, 0, 10**6),),
        (("t", 1, 0, 1),),
    ]


def _progress(records: int, newest: int | None) -> Progress:
    return Progress(records, newest, records - 1, late=1, unreadable=0, dropped=1, lost=2)


def test_a_tasks_progress_record_holds_each_ranges_progress() -> None:
    task = TaskPartition((("a", 0, 0, 3), ("b", 4, 7, 9)), late_threshold_ms=5)
    value = task.encode_progress([_progress(3, 10), _progress(2, None)], batch_id=4)
    decoded = task.decode_progress(value)
    assert decoded == [
        (("a", 0), Progress(3, 10, 2, 1, 0, dropped=1, batch_id=4, lost=2)),
        (("b", 4), Progress(2, None, 1, 1, 0, dropped=1, batch_id=4, lost=2)),
    ]
    other = TaskPartition((("a", 0, 0, 3),), late_threshold_ms=5)
    with pytest.raises(ValueError, match="other than 1 ranges"):
        other.decode_progress(value)
    with pytest.raises(ValueError, match="not a task's progress record"):
        task.decode_progress(_progress(3, 10).encode())


def test_a_legacy_task_writes_what_version_1_readers_wrote() -> None:
    """A batch an offset of version 1 planned: the next plan waits for version 1's key
    and record of each range."""
    task = TaskPartition((("a", 0, 0, 3),), 5, query="q", legacy=True)
    assert task.progress_key("ts") == "q/a:0:0-3:5:ts"
    value = task.encode_progress([_progress(3, 10)], batch_id=4)
    assert json.loads(value)["records"] == 3
    assert task.decode_progress(value) == [
        (("a", 0), Progress(3, 10, 2, 1, 0, dropped=1, batch_id=4, lost=2))
    ]


def test_task_keys_name_the_ranges_threshold_and_event_time() -> None:
    ranges = (("a", 0, 0, 3), ("a", 1, 0, 4))
    key = TaskPartition(ranges, 5, query="q").progress_key("ts")
    assert key.startswith("q/task:a:0:0-3+1:5:ts:")
    assert key == TaskPartition(ranges, 5, query="q").progress_key("ts")  # retries, replays
    for other in (
        TaskPartition((("a", 0, 0, 3), ("a", 1, 0, 5)), 5, query="q"),
        TaskPartition(ranges, 6, query="q"),
        TaskPartition(ranges, 5, query="r"),
    ):
        assert other.progress_key("ts") != key
    assert TaskPartition(ranges, 5, query="q").progress_key("other") != key


def test_task_options_are_positive_integers_named_in_one_line() -> None:
    given_options = options("b:9092", "t", None)
    parsed = SourceOptions.parse({**given_options, "tasksPerBatch": "3"})
    assert parsed.tasks_for(10) == 3
    parsed = SourceOptions.parse({**given_options, "maxRecordsPerTask": "100"})
    assert parsed.tasks_for(10_001) == max(parsed.tasks_per_batch, 101)
    for name in ("tasksPerBatch", "maxRecordsPerTask"):
        for bad in ("0", "-1", "x"):
            with pytest.raises(SourceError, match=f"option '{name}' must be a positive integer"):
                SourceOptions.parse({**given_options, name: bad})


# ------------------------------------------------------------------ on Apache Kafka


def _progress_records(admin: AdminClient, topic: str) -> int:
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})  # type: ignore[no-untyped-call]
    return int(next(iter(futures.values())).result(10).offset)


def test_three_hundred_partitions_are_read_in_few_tasks_one_progress_record_each(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    partitions = 300
    topic, control = new_topic(partitions=partitions), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for partition in range(partitions):
        write.data(partition, *range(partition % 3 + 1))  # 1 to 3 records each
    given_options = options(broker.bootstrap_servers, topic, control, tasksPerBatch="2")
    driven = Driven.start(given_options)
    progress_topic = f"{control}.progress"
    try:
        end = driven.plan()
        tasks: list[Any] = [
            t for t in driven.reader.partitions(driven.offset, end) if isinstance(t, TaskPartition)
        ]
        assert 2 <= len(tasks) <= 5
        assert sum(len(t.ranges) for t in tasks) == partitions
        before = _progress_records(admin, progress_topic)
        reader_clients.close_all()
        rows = real(driven.run(end))
        # One pooled consumer and one producer served every task of this process.
        assert reader_clients.idle_clients() == 2
        # Every record once, nothing else.
        read = sorted((r["partition"], r["offset"]) for r in rows)
        assert read == [(p, o) for p in range(partitions) for o in range(p % 3 + 1)]
        assert _progress_records(admin, progress_topic) - before == len(tasks)
        driven.step()  # the plan takes every range's progress from the tasks' records
        assert driven.counter("records") == len(read)
        # The partitions with one record (at 0 s) hold the minimum: 0 s - 1 s.
        assert driven.offset["watermark"] == BASE_MS - 1_000
    finally:
        driven.stop()


def test_a_pooled_consumer_reads_a_partition_again_in_the_next_task(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """A task pauses each range it has read whole; the next task on the same consumer
    reads the same partitions again."""
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    driven = Driven.start(options(broker.bootstrap_servers, topic, control, readTimeoutMs="5000"))
    try:
        reader_clients.close_all()
        for batch in range(3):
            write.data(0, batch)
            write.data(1, batch)
            rows = real(driven.step())
            assert sorted((r["partition"], r["offset"]) for r in rows) == [(0, batch), (1, batch)]
            assert reader_clients.idle_clients() == 2  # the same consumer and producer
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_gone_from_one_range_of_a_task_leave_its_other_ranges_whole(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """One task reads both partitions; retention takes p0's first records after the batch
    was planned: failOnDataLoss names them, or they are counted and p1 is read whole."""
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    write.data(0, *range(10))
    write.data(1, *range(10))
    given_options = options(
        broker.bootstrap_servers,
        topic,
        control,
        tasksPerBatch="1",
        failOnDataLoss=str(fail_on_data_loss).lower(),
    )
    driven = Driven.start(given_options)
    try:
        end = driven.plan()
        tasks = [
            t for t in driven.reader.partitions(driven.offset, end) if isinstance(t, TaskPartition)
        ]
        assert [len(t.ranges) for t in tasks] == [2]
        for future in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
            future.result(30)  # what time retention does: p0's log starts at 5
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\] offsets 0 to 4 \(5 records, planned in a batch\) "
                "are gone .*: retention",
            ):
                driven.run(end)
            return
        rows = real(driven.run(end))
        read = sorted((r["partition"], r["offset"]) for r in rows)
        assert read == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(10)]
        driven.step()
        assert (driven.counter("records_lost"), driven.counter("records")) == (5, 15)
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_an_error_for_a_range_read_whole_loses_nothing_and_fails_nothing(
    fail_on_data_loss: bool,
) -> None:
    """A consume call can bring a range's last records and then an error event for its
    partition: the range is complete, so nothing of it is gone and no broker is asked
    (the consumer here has no broker at all)."""
    from confluent_kafka import KafkaError

    from spark_consumer.source.executor.reader_ranges import Reading, follow_gone

    given = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
        }
    )
    whole = Reading("t", 0, 0, 5)
    whole.move_to(5)
    error = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    assert follow_gone(None, given, {("t", 0): whole}, {("t", 0): error}) is False
    assert (whole.position, whole.lost) == (5, 0)


class _QuietThenLowOnce:
    """A reader's real consumer that brings nothing until it has answered one watermark
    query, which it answers with the log ending at 0: what a leader moving may answer
    (issue 31, finding 1). Everything else is the real consumer's."""

    def __init__(self, consumer: Any) -> None:
        self.real = consumer
        self.answered_low = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if not self.answered_low:
            time.sleep(min(timeout, 0.5))  # quiet, as the reader's own wait would be
            return []
        return list(self.real.consume(num_messages=num_messages, timeout=timeout))

    def get_watermark_offsets(self, partition: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.answered_low:
            self.answered_low = True
            return 0, 0
        return self.real.get_watermark_offsets(partition, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_reader_never_believes_one_low_log_end(
    broker: KafkaBroker,
    new_topic: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
    fail_on_data_loss: bool,
) -> None:
    """A range that stays quiet, then one watermark answer below its position: the same
    topic (its id unchanged) and no fetch out of range, so nothing is gone (kafka_evidence
    rules 6 and 7). Once, the rest of the range was declared gone at once."""
    topic, control = new_topic(partitions=1), new_topic(partitions=1, prefix="ctl")
    Writer(broker.bootstrap_servers, topic, control).data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=str(fail_on_data_loss).lower()
    )
    wrapped: list[_QuietThenLowOnce] = []
    real_borrowed = reader_clients.borrowed_consumer

    @contextlib.contextmanager
    def borrowed(config: dict[str, Any]) -> Iterator[reader_clients.Lease]:
        with real_borrowed(config) as lease:
            consumer = lease.consumer
            wrapped.append(_QuietThenLowOnce(consumer))
            lease.consumer = wrapped[-1]
            try:
                yield lease
            finally:
                lease.consumer = consumer  # the pool keeps the real one

    monkeypatch.setattr(reader_clients, "borrowed_consumer", borrowed)
    driven = Driven.start(given)
    try:
        rows = real(driven.step())
        assert [w.answered_low for w in wrapped] == [True]  # it was asked, and answered low
        assert [row["offset"] for row in rows] == list(range(10))
        driven.step()
        assert (driven.counter("records_lost"), driven.counter("records")) == (0, 10)
    finally:
        driven.stop()


@pytest.mark.parametrize("epochs_ahead", [1, 0])
def test_a_range_beyond_a_log_truncated_in_a_newer_epoch_is_gone(
    broker: KafkaBroker, new_topic: TopicFactory, epochs_ahead: int
) -> None:
    """kafka_evidence rule 3 on a reader: its range was planned past where the log now
    ends (what an unclean election leaves), so no fetch can say out of range. The log's
    leader epoch newer than the one planned is the evidence: the rest is gone. The same
    epoch is a stale answer's: the range waits, here until its short read timeout."""
    topic, control = new_topic(partitions=1), new_topic(partitions=1, prefix="ctl")
    Writer(broker.bootstrap_servers, topic, control).data(0, *range(10))
    given = options(broker.bootstrap_servers, topic, control, readTimeoutMs="8000")
    driven = Driven.start(given)
    try:
        end = driven.plan()
        [task] = [
            t for t in driven.reader.partitions(driven.offset, end) if isinstance(t, TaskPartition)
        ]
        [(_, partition, planned_epoch)] = task.leader_epochs
        # Planned on a log that ended at 20, in an epoch before the one the log has now.
        beyond = dataclasses.replace(
            task,
            ranges=((topic, partition, 10, 20),),
            leader_epochs=((topic, partition, planned_epoch - epochs_ahead),),
        )
        expected = (
            rf"data loss: {topic}\[0\] offsets 10 to 19 \(10 records, planned in a batch\) "
            "are gone .*: the log was truncated"
            if epochs_ahead
            else rf"timed out reading 1 range\(s\) .*{topic}\[0\] at 10 of 20"
        )
        with pytest.raises(SourceError, match=expected):
            list(driven.reader.read(beyond))
    finally:
        driven.stop()


# Progress that cannot be written (issue 21, 11): the reader's task fails at once.


def test_progress_the_broker_refuses_fails_the_task_at_once_saying_why(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
    progress = new_topic(partitions=1, prefix="progress", **{"max.message.bytes": "64"})
    write.data(0, 1, 2)
    given = options(broker.bootstrap_servers, topic, control, progressTopic=progress)
    driven = Driven.start(given)
    try:
        end = driven.plan()
        # Before, the task succeeded and the next plan failed after the progress timeout.
        with pytest.raises(SourceError, match=rf"not written to {progress}: .*too large"):
            driven.run(end)
    finally:
        driven.stop()
