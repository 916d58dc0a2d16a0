"""What production brings to the source (semantics.md §6, "What production brings"), on
Apache Kafka: each case stalled, crash-looped or lost data in silence before (issue 21).

Most tests drive the stream reader as Spark does, in this process (tests/harness/source_driver.py),
because each needs a window that must be certain: between planning and reading, between
a stop and a restart, inside the planner's wait. The far-future event time runs in Spark,
since what it broke was Spark's own watermark.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus, encode
from spark_consumer.source import SourceError
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.driver.progress_collector import ProgressCollector
from spark_consumer.source.shared.options import PROGRESS_RETENTION_MS, SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TEST_BROKER_SETTINGS, TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_driver import Driven, options, real
from tests.harness.source_jobs import events, late_output_rows, window_job

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


def _setup(
    broker: KafkaBroker, new_topic: TopicFactory, partitions: int, **config: str
) -> tuple[str, str, Writer]:
    topic = new_topic(partitions=partitions, **config)
    control = new_topic(partitions=1, prefix="ctl")
    return topic, control, Writer(broker.bootstrap_servers, topic, control)


def _send(broker: KafkaBroker, topic: str, *values: bytes, timestamp: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for value in values:
        if timestamp is None:
            producer.produce(topic, value=value, partition=0)
        else:
            producer.produce(topic, value=value, partition=0, timestamp=timestamp)
        assert producer.flush(10) == 0


def _delete_topic(admin: AdminClient, topic: str) -> None:
    """Deletes a topic and waits until the broker no longer lists it."""
    admin.delete_topics([topic])[topic].result(30)
    wait_until(
        lambda: topic not in admin.list_topics(timeout=10).topics, 30, f"{topic} to be deleted"
    )


def _assert_never_listed(admin: AdminClient, topic: str, seconds: float) -> None:
    """A thing that must not happen can only be watched for a while."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert topic not in admin.list_topics(timeout=10).topics, f"{topic} was created again"
        time.sleep(0.2)


def _delete_records_before(admin: AdminClient, topic: str, partition: int, offset: int) -> None:
    """What time retention does: the log starts at ``offset`` from now on."""
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for future in futures.values():
        future.result(30)


# ------------------------------------------------------------ 1. no marker skipped


class _WriteDuringWait(ProgressCollector):
    """A wait for the readers' progress that sees a marker written meanwhile: after the
    planner read the control topic's ends, before it reads the markers up to them."""

    write_during_wait: Any = None

    def wait_for_progress(self, start: Any, plan: Any, now: Any = None) -> Any:
        found = super().wait_for_progress(start, plan, now)
        if self.write_during_wait is not None:
            self.write_during_wait()
            self.write_during_wait = None
        return found


class _MarkerDuringWait(SlackwaterStreamReader):
    """A planner whose progress collector is ``_WriteDuringWait``."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self.progress = _WriteDuringWait(options, self.kafka)


def test_a_marker_written_while_the_planner_waits_is_read_by_the_next_plan(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    # A low fetch wait (a latency setting users pass through) brings the end-of-partition
    # event within the same consume call as the records: the marker written past the ends
    # and the event after it arrive together, the case where the position once passed
    # the ends and the marker was skipped for good.
    given = options(broker.bootstrap_servers, topic, control, **{"kafka.fetch.wait.max.ms": "10"})
    driven = Driven.start(given, _MarkerDuringWait)
    try:
        driven.step()  # reads [0, 10)
        write.marker(0, ACTIVE)  # control offset 0: this plan reads it (before its ends)

        def idle_marker() -> None:
            write.marker(0, IDLE)  # control offset 1: past the ends this plan looked at
            ends = admin.list_offsets({TopicPartition(control, 0): _latest()})
            assert next(iter(ends.values())).result(10).offset == 2

        assert isinstance(driven.reader.progress, _WriteDuringWait)
        driven.reader.progress.write_during_wait = idle_marker
        driven.step()
        # The plan read up to the ends it looked at, never past them.
        assert driven.offset["control"] == {"0": 1}
        assert driven.statuses() == {f"{topic}:0": "ACTIVE"}
        driven.step()  # the next plan reads the IDLE marker and applies it
        assert driven.offset["control"] == {"0": 2}
        assert driven.statuses() == {f"{topic}:0": "IDLE"}
        assert driven.offset["status"] == "IDLE"
    finally:
        driven.stop()


def _latest() -> Any:
    from confluent_kafka.admin import OffsetSpec

    return OffsetSpec.latest()  # type: ignore[no-untyped-call]


# ------------------------------------------------------------ 2, 4. poison records


# Each value, and why the event time cannot be read (None: it can).
POISON_VALUES: list[tuple[bytes, str | None]] = [
    (b'{"ts": ' + b"9" * 5000 + b"}", "a number too long to parse"),
    (b'{"ts": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"ts": 9223372036854775807}', "out of range"),
    (b'{"ts": NaN}', "not a finite number"),
    (b'{"ts": 1e400}', "not a finite number"),
    (b"\xff\xfe not even UTF-8", "not JSON"),
    (b'{"ts": "2023-11-14T22:13:22.500Z"}', None),  # BASE_MS + 2.5 s
    # Epoch milliseconds as time.time() * 1000 writes them: a float, cut to the ms.
    (b'{"ts": %r}' % (BASE_MS + 3_000.75), None),
]


def test_poison_data_records_give_rows_with_reasons_and_counts_never_a_failed_read(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    _send(broker, topic, *(value for value, _ in POISON_VALUES))
    # The same poison on the control topic: skipped and counted, the plan goes on.
    write.raw_control(f"{topic}:0".encode(), b'{"v": ' + b"1" * 5000 + b"}")
    write.raw_control(f"{topic}:0".encode(), b"[" * 100_000)
    late = tmp_path / "late"
    given = options(
        broker.bootstrap_servers, topic, control, eventTimeField="ts", lateOutput=str(late)
    )
    driven = Driven.start(given)
    try:
        rows = real(driven.step())
        # Every record is a row: none lost, none failed the read.
        assert [row["offset"] for row in rows] == list(range(len(POISON_VALUES)))
        readable = [row["event_time"] for row in rows if row["event_time"] is not None]
        assert readable == [BASE_MS + 2_500, BASE_MS + 3_000]
        driven.step()  # the progress of that batch reaches the planner
        assert driven.counter("records") == len(POISON_VALUES)
        assert driven.counter("records_unreadable") == 6
        assert driven.counter("control_malformed") == 2
        reasons = {row["offset"]: row["reason"] for row in late_output_rows(late)}
        for offset, (_, why) in enumerate(POISON_VALUES):
            if why is None:
                assert offset not in reasons
            else:
                assert why in reasons[offset], (offset, reasons[offset])
    finally:
        driven.stop()


def test_a_kafka_timestamp_no_spark_timestamp_holds_is_an_unreadable_row(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Kafka takes any int64 timestamp where the topic allows it; Spark's microseconds do not."""
    topic, control, _ = _setup(
        broker, new_topic, 1, **{"message.timestamp.after.max.ms": str(2**63 - 1)}
    )
    _send(broker, topic, b"{}", timestamp=9_300_000_000_000_000)  # over int64 microseconds
    _send(broker, topic, b"{}", timestamp=BASE_MS)
    late = tmp_path / "late"
    driven = Driven.start(options(broker.bootstrap_servers, topic, control, lateOutput=str(late)))
    try:
        rows = real(driven.step())
        first = rows[0]
        assert (first["offset"], first["timestamp"], first["event_time"]) == (0, None, None)
        assert rows[1]["event_time"] == BASE_MS
        assert [row["reason"] for row in late_output_rows(late)] == [
            "unreadable: timestamp is out of range: 9300000000000000"
        ]
    finally:
        driven.stop()


# ------------------------------------------------------------ 3. far-future event time


def test_one_far_future_event_time_is_unreadable_and_moves_no_watermark(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """A record's event time in microseconds read as milliseconds (year ~55,800): past
    maxEventTimeAhead (Kafka's one hour by default), so it reaches neither the valve's
    watermark nor Spark's, and every later window is still emitted."""
    topic, control, _ = _setup(broker, new_topic, 1)
    _send(broker, topic, *(b'{"ts": %d}' % (BASE_MS + s * 1000) for s in range(0, 8)))
    _send(broker, topic, b'{"ts": %d}' % (BASE_MS * 1000))
    _send(broker, topic, *(b'{"ts": %d}' % (BASE_MS + s * 1000) for s in range(8, 23)))
    frame = events(spark, broker.bootstrap_servers, [topic], control, event_time_field="ts")
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        offset = job.source_offset()
        assert offset["watermark"] == BASE_MS + 21_000
        assert job.watermark_ms() == BASE_MS + 21_000  # Spark's own: not year 55,800
        assert offset["counters"]["records_unreadable"] == 1
        assert offset["counters"]["records_late"] == 0
        # Every window up to the watermark, each record counted once.
        assert job.windows() == {(0, 5): 5, (5, 10): 5, (10, 15): 5, (15, 20): 5}
    finally:
        job.stop()


def test_far_future_event_times_go_to_the_late_output_with_their_reason(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, _ = _setup(broker, new_topic, 1)
    now_ms = time.time_ns() // 1_000_000
    _send(broker, topic, b'{"ts": %d}' % (now_ms + 30 * 60_000))  # 30 min ahead: readable
    _send(broker, topic, b'{"ts": %d}' % (now_ms + 3 * 3_600_000))  # 3 h ahead: not
    late = tmp_path / "late"
    given = options(
        broker.bootstrap_servers, topic, control, eventTimeField="ts", lateOutput=str(late)
    )
    driven = Driven.start(given)
    try:
        rows = real(driven.step())
        assert [row["event_time"] is None for row in rows] == [False, True]
        driven.step()
        # The valve's watermark: the readable record's, not the far one's.
        assert driven.offset["watermark"] == now_ms + 30 * 60_000 - 1_000
        [dropped] = late_output_rows(late)
        assert dropped["offset"] == 1
        assert "more than maxEventTimeAhead" in dropped["reason"]
    finally:
        driven.stop()


# ------------------------------------------------------------ 5. progress gone at a restart


def test_a_restart_after_the_progress_records_are_gone_plans_at_once(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(broker.bootstrap_servers, topic, control, progressTimeoutMs="120000")
    driven = Driven.start(given)
    progress_topic = f"{control}.progress"
    try:
        # The source made its progress topic with a time retention of its own.
        resource = ConfigResource("topic", progress_topic)
        described = admin.describe_configs([resource])[resource].result(30)
        assert described["retention.ms"].value == str(PROGRESS_RETENTION_MS)
        assert described["cleanup.policy"].value == "delete"
        driven.step()  # batch 1 reads [0, 10); its progress is on the progress topic
        checkpoint = driven.offset
    finally:
        driven.stop()
    # The query is down for longer than the progress topic keeps records.
    ends = admin.list_offsets({TopicPartition(progress_topic, 0): _latest()})
    _delete_records_before(admin, progress_topic, 0, next(iter(ends.values())).result(10).offset)
    restarted = Driven.restart(given, checkpoint)
    try:
        restarted.step()  # before: waited 120 s for records that were gone, then failed
        # The lost batch counts as unknown: its records do not advance the watermark.
        assert restarted.counter("progress_lost") == 1  # batch 1's one range
        assert restarted.offset["watermark"] == checkpoint["watermark"]
        write.data(0, 20)
        restarted.step()
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 19_000  # new records move it again
    finally:
        restarted.stop()


def test_a_restart_after_the_progress_topic_was_deleted_reads_the_new_one_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    """The progress topic deleted while the query was down (an operator's clean-up, a
    topic retention policy): it is made again, and the next batch's progress, written
    at offsets below the old position, is read, not waited for until the query fails."""
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(broker.bootstrap_servers, topic, control)
    driven = Driven.start(given)
    try:
        driven.step()  # batch 1 reads [0, 10): its progress is at offsets 0-1
        write.data(0, *range(10, 15))
        driven.step()  # batch 2 reads [10, 15): the plan read the progress topic to 2-3
        checkpoint = driven.offset
    finally:
        driven.stop()
    _delete_topic(admin, f"{control}.progress")
    restarted = Driven.restart(given, checkpoint)
    try:
        restarted.step()  # batch 2's progress is gone: unknown; the topic is made again
        assert restarted.counter("progress_lost") >= 1
        write.data(0, 20)
        restarted.step()  # batch 4's progress is at offset 0 of the new topic
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 19_000
    finally:
        restarted.stop()


# ------------------------------------------------------------ 6, 7. deleted topics, lost data


def test_a_deleted_topic_leaves_the_valve_as_finished(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    behind, ahead = new_topic(partitions=1), new_topic(partitions=1)
    control = new_topic(partitions=1, prefix="ctl")
    Writer(broker.bootstrap_servers, behind, control).data(0, 0, 1, 2)
    Writer(broker.bootstrap_servers, ahead, control).data(0, *range(20))
    driven = Driven.start(options(broker.bootstrap_servers, f"{behind},{ahead}", control))
    try:
        driven.step()
        driven.step()
        assert driven.offset["watermark"] == BASE_MS + 1_000  # `behind` holds the minimum
        _delete_topic(admin, behind)
        # Missing from one metadata answer is not enough (a lost DESCRIBE, a broker behind):
        # it leaves once missing for a while and a request for it says it does not exist.
        _step_until(driven, lambda: driven.counter("partitions_deleted") == 1, "the deletion")
        assert driven.statuses()[f"{behind}:0"] == "FINISHED"
        assert sorted(SourceOffset.decode(driven.offset).data) == [ahead]
        assert driven.offset["watermark"] == BASE_MS + 18_000
        # Asking the broker about the deleted topic did not make it again: Kafka creates
        # a topic a request asks for (auto.create.topics.enable, true by default) unless
        # the client says not to. The broker answers before it creates, so: a while.
        driven.step()
        _assert_never_listed(admin, behind, seconds=3.0)
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_batch_planned_over_a_topic_deleted_before_it_is_read(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=_text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        end = driven.plan()  # [0, 10) planned
        _delete_topic(admin, topic)
        if fail_on_data_loss:
            with pytest.raises(SourceError, match=rf"data loss: {topic}\[0\] offsets 0 to 9 are"):
                driven.run(end)
            return
        assert real(driven.run(end)) == []
        _step_until(driven, lambda: driven.offset["status"] == "FINISHED", "the deletion")
        assert driven.counter("records_lost") == 10
        assert driven.counter("records_after_finished") == 0
        assert driven.statuses() == {f"{topic}:0": "FINISHED"}
        assert driven.offset["status"] == "FINISHED"
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_batch_planned_over_a_topic_recreated_empty_before_it_is_read(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    # Its log now ends at the range's position: the planned records are not coming
    # (they were the old topic's), which the reader tells at its first check, not by
    # waiting readTimeoutMs for them.
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers,
        topic,
        control,
        failOnDataLoss=_text(fail_on_data_loss),
        readTimeoutMs="120000",
    )
    driven = Driven.start(given)
    try:
        end = driven.plan()  # [0, 10) planned
        _delete_topic(admin, topic)
        wait_until(lambda: _created(admin, topic), 60, f"{topic} created again")
        if fail_on_data_loss:
            with pytest.raises(SourceError, match=rf"data loss: {topic}\[0\] offsets 0 to 9 are"):
                driven.run(end)
            return
        assert real(driven.run(end)) == []
        driven.step()
        assert driven.counter("records_lost") == 10
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_deleted_by_retention_before_they_are_read(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(4))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=_text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        driven.step()  # [0, 4) read
        write.data(0, *range(4, 12))
        end = driven.plan()  # [4, 12) planned
        _delete_records_before(admin, topic, 0, 7)  # 4, 5, 6 go before they are read
        if fail_on_data_loss:
            with pytest.raises(SourceError, match=rf"data loss: {topic}\[0\] offsets 4 to 6 are"):
                driven.run(end)
            return
        assert [row["offset"] for row in real(driven.run(end))] == [7, 8, 9, 10, 11]
        driven.step()
        assert driven.counter("records_lost") == 3
        assert driven.counter("records") == 4 + 5
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_recreated_topic_starts_again_or_stops_the_query(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=_text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        driven.step()  # [0, 10) read
        _delete_topic(admin, topic)
        wait_until(lambda: _created(admin, topic), 60, f"{topic} created again")
        Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
        # Only a log end that stays below the position counts (WENT_BACK_AFTER_S).
        if fail_on_data_loss:
            with pytest.raises(
                SourceError, match=rf"{topic}\[0\]'s log end went back from 10 to 3"
            ):
                _step_until(driven, lambda: False, "the query to stop")
            return
        rows = _step_until(
            driven, lambda: driven.counter("offsets_went_back") == 1, "offsets gone back"
        )
        rows += real(driven.step())
        assert [row["offset"] for row in rows] == [0, 1, 2]  # the new topic's records
        assert driven.counter("offsets_went_back") == 1
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_recreated_while_the_query_was_down_is_known_by_its_id(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """kafka_evidence rule 6 across a restart: the offset keeps the topic's id (and its
    leader epochs), so the restarted planner knows the new topic for another one.
    Without it, the new log ending below the position stood still: its records were
    skipped once it passed the position."""
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=_text(fail_on_data_loss)
    )
    first = Driven.start(given)
    try:
        first.step()  # [0, 10) read
        first.step()
    finally:
        first.stop()
    kept = first.offset["kafka"]
    assert set(kept["ids"]) == {topic, control} and kept["epochs"][topic] == 0
    _delete_topic(admin, topic)
    wait_until(lambda: _created(admin, topic), 60, f"{topic} created again")
    Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
    restarted = Driven(SlackwaterStreamReader(SourceOptions.parse(given)), first.offset)
    try:
        if fail_on_data_loss:
            with pytest.raises(
                SourceError, match=rf"{topic}\[0\]'s log end went back .* re-created"
            ):
                restarted.step()
            return
        rows = real(restarted.step())
        assert restarted.counter("offsets_went_back") == 1
        rows += _step_until(restarted, lambda: restarted.counter("records") == 13, "3 records")
        assert [row["offset"] for row in rows] == [0, 1, 2]  # the new topic's, from its start
    finally:
        restarted.stop()


class _LowBroker(PlannerClient):
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

    def observe(self, planned: Collection[str]) -> PlanAnswers:
        now = super().observe(planned)
        if not self.low:
            return now
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


def _read_then_low(
    broker: KafkaBroker, new_topic: TopicFactory, **settings: str
) -> tuple[str, str, Writer, Driven]:
    """Ten records read by one query; returns its next plans' driver, on no broker yet."""
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    first = Driven.start(options(broker.bootstrap_servers, topic, control, **settings))
    try:
        assert [row["offset"] for row in real(first.step())] == list(range(10))
    finally:
        first.stop()
    return topic, control, write, first


def test_one_log_end_below_the_read_position_is_no_data_loss(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, _, write, first = _read_then_low(broker, new_topic)
    given = first.reader.options
    low = _LowBroker(given, topic)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        assert real(driven.step()) == []  # below the position: it stands still
        low.low = False
        write.data(0, 10, 11)
        rows = _step_until(driven, lambda: driven.counter("records") == 12, "12 records read")
        assert [row["offset"] for row in rows] == [10, 11]  # nothing read twice, none lost
        assert driven.counter("offsets_went_back") == 0
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_stale_leaders_low_log_end_stands_still_for_as_long_as_it_lasts(
    broker: KafkaBroker, new_topic: TopicFactory, fail_on_data_loss: bool
) -> None:
    """kafka_evidence rule 3: the same topic id and no newer leader epoch, so no plan
    takes it for offsets gone back, however long it lasts (once, 5 s of it did: the
    whole partition read again, or the query stopped)."""
    topic, _, write, first = _read_then_low(
        broker, new_topic, failOnDataLoss=_text(fail_on_data_loss)
    )
    given = first.reader.options
    low = _LowBroker(given, topic)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        began = time.monotonic()
        # Plans for longer than the old timer (5 s): the outcome holds at any speed.
        while time.monotonic() - began < 7.0 or low.lowered < 3:
            assert real(driven.step()) == []
        assert driven.counter("offsets_went_back") == 0
        low.low = False
        write.data(0, 10, 11)
        rows = _step_until(driven, lambda: driven.counter("records") == 12, "12 records read")
        assert [row["offset"] for row in rows] == [10, 11]
        assert driven.counter("offsets_went_back") == 0
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_lower_log_end_in_a_newer_leader_epoch_went_back(
    broker: KafkaBroker, new_topic: TopicFactory, fail_on_data_loss: bool
) -> None:
    """kafka_evidence rule 3: a new leader answering a lower end was elected uncleanly and
    truncated the log: the records past it are gone."""
    topic, _, write, first = _read_then_low(
        broker, new_topic, failOnDataLoss=_text(fail_on_data_loss)
    )
    given = first.reader.options
    low = _LowBroker(given, topic, 1)
    low.low = False
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        write.data(0, 10)
        assert [row["offset"] for row in real(driven.step())] == [10]  # its epoch is known
        low.low = True
        if fail_on_data_loss:
            with pytest.raises(SourceError, match="truncated in a newer leader epoch"):
                driven.step()
            return
        assert real(driven.step()) == []  # started again at the earliest offset, 0
        assert driven.counter("offsets_went_back") == 1
        low.low = False  # here the log was not truncated: read again from 0
        rows = _step_until(driven, lambda: driven.counter("records") == 22, "a read again")
        assert [row["offset"] for row in rows] == list(range(11))
        assert driven.counter("offsets_went_back") == 1
    finally:
        driven.stop()


def test_one_control_topic_end_below_its_position_reads_nothing_again(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """Finding 3 of issue 31: one low answer of the control topic once made the planner
    read it again from 0 and forget the emitters' epochs (markers_read 2 -> 4)."""
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    for seq in range(2):
        write.raw_control(*encode(_marker(topic, ACTIVE, 10, epoch=5, seq=seq)))
    first = Driven.start(options(broker.bootstrap_servers, topic, control))
    try:
        first.step()
        first.step()
        assert first.offset["control"] == {"0": 2}
        assert first.counter("markers_read") == 2
    finally:
        first.stop()
    given = first.reader.options
    low = _LowBroker(given, control)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        write.data(0, 10)
        _step_until(driven, lambda: low.lowered >= 2 and driven.counter("records") == 11, "a read")
        assert driven.offset["control"] == {"0": 2}
        assert (driven.counter("control_went_back"), driven.counter("markers_read")) == (0, 2)
    finally:
        driven.stop()


def _text(flag: bool) -> str:
    return str(flag).lower()


def _created(admin: AdminClient, topic: str, partitions: int = 1) -> bool:
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


def test_partitions_gone_from_a_topic_recreated_with_fewer_leave_the_valve(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(10))
    write.data(1, *range(5))
    given = options(broker.bootstrap_servers, topic, control, failOnDataLoss="false")
    driven = Driven.start(given)
    try:
        driven.step()
        _delete_topic(admin, topic)
        wait_until(lambda: _created(admin, topic, partitions=1), 60, f"{topic} created again")
        Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
        rows = _step_until(
            driven,
            lambda: (
                driven.counter("partitions_deleted") == 1
                and driven.counter("offsets_went_back") == 1
            ),
            "partition 1 to leave, and partition 0 to count as gone back",
        )
        rows += real(driven.step())
        # Partition 1 left as FINISHED; partition 0 went back and was read again from 0.
        assert driven.statuses() == {f"{topic}:0": "ACTIVE", f"{topic}:1": "FINISHED"}
        assert [(row["partition"], row["offset"]) for row in rows] == [(0, 0), (0, 1), (0, 2)]
        driven.step()
        assert driven.offset["watermark"] == BASE_MS + 31_000  # p1 no longer holds it at 3 s
    finally:
        driven.stop()


def test_a_recreated_control_topic_is_read_again_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    for seq in range(2):  # an emitter of epoch 5: the control topic's position is 2
        write.raw_control(*encode(_marker(topic, ACTIVE, 10, epoch=5, seq=seq)))
    driven = Driven.start(options(broker.bootstrap_servers, topic, control))
    try:
        driven.step()
        driven.step()
        assert driven.offset["control"] == {"0": 2}
        _delete_topic(admin, control)
        wait_until(lambda: _created(admin, control), 60, f"{control} created again")
        # A new emitter on the new topic takes epoch 1 (the highest it sees, plus one).
        Writer(broker.bootstrap_servers, topic, control).raw_control(
            *encode(_marker(topic, IDLE, 10, epoch=1, seq=0))
        )
        _step_until(driven, lambda: driven.statuses()[f"{topic}:0"] == "IDLE", "the IDLE")
        assert driven.offset["control"] == {"0": 1}
        assert driven.counter("control_went_back") == 1
        write.data(0, 10)  # a later plan: the new topic is read on, not again from 0
        _step_until(driven, lambda: driven.counter("records") == 11, "a record read")
        assert (driven.counter("control_went_back"), driven.counter("markers_read")) == (1, 3)
    finally:
        driven.stop()


def _marker(topic: str, status: MarkerStatus, offset: int, *, epoch: int, seq: int) -> Marker:
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


# ------------------------------------------------------------ 8, 12. partitions that appear


def test_a_partition_that_appears_after_every_partition_finished_is_data_after_finished(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(5))
    write.marker(0, FINISHED)
    late = tmp_path / "late"
    driven = Driven.start(options(broker.bootstrap_servers, topic, control, lateOutput=str(late)))
    try:
        driven.step()
        driven.step()
        assert driven.offset["status"] == "FINISHED"
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
        Writer(broker.bootstrap_servers, topic, control).data(1, 7, 8)
        rows = _step_until(
            driven,
            lambda: driven.offset["aligner"]["counters"]["records_after_finished"] == 2,
            "the new partition's records read and counted",
        )
        assert [(row["partition"], row["late"]) for row in rows] == [(1, True), (1, True)]
        assert driven.statuses()[f"{topic}:1"] == "FINISHED"
        assert driven.offset["aligner"]["counters"]["partitions_after_finished"] == 1
        assert driven.offset["aligner"]["counters"]["records_after_finished"] == 2
        assert [(row["partition"], row["offset"]) for row in late_output_rows(late)] == [
            (1, 0),
            (1, 1),
        ]
    finally:
        driven.stop()


def test_a_held_marker_applies_when_create_partitions_makes_its_partition(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    """A FINISHED@0 for a partition not made yet applies in the plan that sees the
    partition, not only when some other input changes: a bounded job ends."""
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(5))
    write.data(1, *range(5))
    write.marker(0, FINISHED)
    write.marker(2, FINISHED, offset=0)  # partition 2 does not exist yet
    driven = Driven.start(options(broker.bootstrap_servers, topic, control))
    try:
        driven.step()
        driven.step()
        assert len(driven.offset["held"]) == 1
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        _step_until(driven, lambda: driven.offset["held"] == [], "partition 2 to be seen")
        driven.step()  # nothing new: no batch
        assert driven.statuses() == {
            f"{topic}:0": "FINISHED",
            f"{topic}:1": "ACTIVE",
            f"{topic}:2": "FINISHED",
        }
        write.marker(1, FINISHED)
        driven.step()
        assert driven.offset["status"] == "FINISHED"  # the bounded job's end
    finally:
        driven.stop()


# ------------------------------------------------------------ 9. two queries, one progress topic


def test_two_queries_sharing_a_progress_topic_never_take_each_others_progress(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(broker.bootstrap_servers, topic, control, progressTimeoutMs="2000")
    first, second = Driven.start(given), Driven.start(given)
    try:
        assert first.offset["query"] != second.offset["query"]
        first.step()  # plans and reads [0, 10): its progress is written
        end = second.plan()  # plans the same range; its readers never run
        second.offset = end
        with pytest.raises(SourceError, match="no progress after 2s"):
            second.plan()  # the first query's record for the same range is not its own
    finally:
        first.stop()
        second.stop()


def test_a_plan_from_a_start_it_read_past_reads_that_starts_progress_again(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The progress consumer stays assigned from one plan to the next (issue 33: the
    readers' records are fetched while the batch runs, not after the plan asks). A plan
    from a start other than where the last one stopped (Spark plans from its offset log,
    which a plan it did not take never reaches) reads that start's progress again: the
    same plan, never a wait for records the consumer is past."""
    topic, control, write = _setup(broker, new_topic, 1)
    write.data(0, *range(10))
    driven = Driven.start(
        options(broker.bootstrap_servers, topic, control, progressTimeoutMs="5000")
    )
    try:
        driven.step()  # reads [0, 10); its readers write their progress
        write.data(0, *range(10, 20))
        first = driven.plan()  # takes that progress; the assignment is kept after it
        assert driven.reader.progress._assigned is not None
        again = driven.plan()  # the same start: the same progress, read again
        for planned in (first, again):
            assert SourceOffset.decode(planned).data == {topic: {"0": 20}}
            assert planned["counters"]["records"] == 10
        assert again["watermark"] == first["watermark"] > driven.offset["watermark"]
    finally:
        driven.stop()


# ------------------------------------------------------------ 10. the idle clock at a restart


def test_consumer_idle_timeout_starts_again_at_a_restart(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, *range(10))
    write.data(1, 0, 1)
    given = options(broker.bootstrap_servers, topic, None, consumerIdleTimeout="2s")
    driven = Driven.start(given)
    try:
        driven.step()
        driven.step()
        assert set(driven.statuses().values()) == {"ACTIVE"}
        checkpoint = driven.offset
    finally:
        driven.stop()
    time.sleep(3)  # the query is down for longer than the idle timeout (the case itself)
    write.data(0, 10)
    restarted = Driven.restart(given, checkpoint)
    try:
        restarted.step()
        # Partition 1 had no record in that batch: before, the downtime idled it at once
        # and the watermark jumped past its unread data's place.
        assert restarted.statuses()[f"{topic}:1"] == "ACTIVE"
        assert restarted.offset["watermark"] == BASE_MS + 0
    finally:
        restarted.stop()


def test_consumer_idle_timeout_counts_no_time_the_broker_was_away(tmp_path: Path) -> None:
    """A Kafka outage longer than the timeout is not silence: the first plan that sees
    the broker again idles nothing (before, it idled every partition at once, and the
    watermark jumped past the backlog producers had buffered); the partition idles once
    it has been seen quiet for the whole timeout."""
    own = KafkaBroker(log_dir=tmp_path / "kafka", settings=TEST_BROKER_SETTINGS).start()
    driven: Driven | None = None
    try:
        topic = "outage"
        own_admin = AdminClient({"bootstrap.servers": own.bootstrap_servers})
        own_admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        Writer(own.bootstrap_servers, topic, "unused").data(0, *range(3))
        given = options(
            own.bootstrap_servers,
            topic,
            None,
            consumerIdleTimeout="2s",
            requestTimeoutMs="5000",
            **{"kafka.reconnect.backoff.max.ms": "200"},
        )
        driven = Driven.start(given)
        assert len(real(driven.step())) == 3
        driven.step()  # its progress taken: the partition's clock runs from here
        read_at = time.monotonic()
        own.stop(remove_log_dir=False)
        # Plans while the broker is away (each refused) for longer than the timeout.
        while time.monotonic() - read_at < 3.0:
            assert driven.plan() == driven.offset  # no batch without a broker
        own.start()  # same log directory, same port

        def seen_again() -> dict[str, Any] | None:
            end = driven.plan()
            return end if end != driven.offset else None

        driven.run(wait_until(seen_again, 60, "a plan that sees the broker again"))
        assert driven.statuses() == {f"{topic}:0": "ACTIVE"}

        def idle() -> bool:
            driven.step()
            return driven.statuses()[f"{topic}:0"] == "IDLE"

        # Seen quiet for the whole timeout from then on, it idles.
        wait_until(idle, 60, "IDLE once seen quiet for the timeout")
    finally:
        if driven is not None:
            driven.stop()
        own.stop()


# ------------------------------------------------------------ 11. progress that cannot be written


def test_progress_the_broker_refuses_fails_the_task_at_once_saying_why(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)
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


def _step_until(driven: Driven, done: Any, what: str) -> list[dict[str, Any]]:
    """Triggers until ``done()``: the broker shows a new partition a moment after
    CreatePartitions answers. Returns the data rows read meanwhile."""
    rows: list[dict[str, Any]] = []

    def stepped() -> bool:
        rows.extend(real(driven.step()))
        return bool(done())

    wait_until(stepped, 60, what)
    return rows


def test_log_ends_asked_in_several_requests_are_each_partitions_own(
    broker: KafkaBroker, new_topic: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListOffsets go out REQUEST_PARTITIONS at a time (issue 33): every partition's log
    end, leader epoch and gone-back judgment is its own, whichever request asked it."""
    from spark_consumer.source.driver import planner_client

    monkeypatch.setattr(planner_client, "REQUEST_PARTITIONS", 2)
    topic = new_topic(partitions=5)
    write = Writer(broker.bootstrap_servers, topic, new_topic(prefix="ctl"))
    for partition in range(5):
        write.data(partition, *range(partition + 1))
    driven = Driven.start(options(broker.bootstrap_servers, topic, None))
    try:
        rows = driven.step()
        assert SourceOffset.decode(driven.offset).data == {topic: {str(p): p + 1 for p in range(5)}}
        assert sorted(r["partition"] for r in real(rows)) == [
            p for p in range(5) for _ in range(p + 1)
        ]
        assert driven.reader.kafka._built is not None
        built = driven.reader.kafka._built[2]
        assert [len(r.partitions) for r in built] == [2, 2, 1]  # three requests
        assert set(driven.reader.identity.leader_epochs) == {(topic, p) for p in range(5)}
    finally:
        driven.stop()
