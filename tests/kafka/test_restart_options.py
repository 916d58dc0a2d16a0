"""A restart with changed options (issue 31, finding 7; docs/source.md, "Options on
restart"): each option is applied, refused with one line that names it, or kept from the
checkpoint and logged, never silently half of each.

Each test runs a query in this process (tests/harness/source_driver.py), stops it, and restarts it
on the same offset with one option changed, as Spark restarts from its checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SourceError
from spark_consumer.source.driver import planner as planner_module
from spark_consumer.source.executor import reader_clients
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.valve import MIN_WATERMARK
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_driver import Driven, options, real

SYNTHETIC_DELAY_MS = 36_500 * 86_400_000  # the default watermarkDelay


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="spark_consumer.source")
    return caplog


def _lines(caplog: pytest.LogCaptureFixture, option: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"option {option!r}" in r.getMessage()]


def _first_run(given: dict[str, str], steps: int = 2) -> dict[str, Any]:
    """A query's first run: ``steps`` triggers, then stopped; its checkpoint's offset."""
    driven = Driven.start(given)
    try:
        for _ in range(steps):
            driven.step()
        return driven.offset
    finally:
        driven.stop()


def _channels(offset: dict[str, Any]) -> dict[str, int]:
    return SourceOffset.decode(offset).channel_watermarks()


# ------------------------------------------------------------ maxOutOfOrderness


def test_a_raised_max_out_of_orderness_applies_to_event_times_read_after_the_restart(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    """The issue's case: partition 0 read up to 20 s with a bound of 1 s (its watermark
    19 s), partition 1 not yet; late data seen, the bound raised to 30 s. Partition 1's
    record at 20 s gives -10 s, the output's new minimum: before, the checkpoint's 1 s
    was used, silently, and the watermark was 19 s."""
    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, 5, 20)
    given = options(broker.bootstrap_servers, topic, None)
    checkpoint = _first_run(given)
    assert _channels(checkpoint)[f"{topic}:0"] == BASE_MS + 19_000
    assert checkpoint["watermark"] == MIN_WATERMARK  # partition 1 holds it
    restarted = Driven.restart({**given, "maxOutOfOrderness": "30s"}, checkpoint)
    try:
        write.data(1, 20)
        restarted.step()
        restarted.step()
        # A watermark never goes back: partition 0 stays at 19 s.
        assert _channels(restarted.offset) == {
            f"{topic}:0": BASE_MS + 19_000,
            f"{topic}:1": BASE_MS - 10_000,
        }
        assert restarted.offset["watermark"] == BASE_MS - 10_000
    finally:
        restarted.stop()
    assert _lines(logged, "maxOutOfOrderness") == [
        "option 'maxOutOfOrderness' is 30000 ms, the checkpoint's 1000 ms: applied from this "
        "restart on to every event time read; a watermark never goes back, so a partition's "
        "stays where it is until its newest event time less 30000 ms passes it"
    ]


def test_a_lowered_max_out_of_orderness_raises_every_watermark_at_the_restart(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    """Both partitions read up to 20 s with a bound of 10 s (output 10 s); restarted with
    1 s and no new record, the first plan gives 19 s (before: 10 s until new records came,
    and only on their partitions)."""
    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, 5, 20)
    write.data(1, 20)
    given = options(broker.bootstrap_servers, topic, None, maxOutOfOrderness="10s")
    checkpoint = _first_run(given)
    assert checkpoint["watermark"] == BASE_MS + 10_000
    restarted = Driven.restart({**given, "maxOutOfOrderness": "1s"}, checkpoint)
    try:
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 19_000
        assert restarted.offset["aligner"]["max_out_of_orderness_ms"] == 1_000
    finally:
        restarted.stop()
    assert _lines(logged, "maxOutOfOrderness") == [
        "option 'maxOutOfOrderness' is 1000 ms, the checkpoint's 10000 ms: applied from this "
        "restart on: every partition's watermark is its newest event time read less 1000 ms "
        "(records between the old and the new watermark are late)"
    ]


# ------------------------------------------------------------ eventTimeField


def _json_records(write: Writer, partition: int, *seconds: int) -> None:
    """Records whose field ``ts`` is at ``seconds`` and ``at`` 100 s later."""
    for second in seconds:
        value = {"ts": BASE_MS + second * 1000, "at": BASE_MS + (second + 100) * 1000}
        write.producer.produce(
            write.topic, value=json.dumps(value).encode(), partition=partition, timestamp=BASE_MS
        )
        assert write.producer.flush(10) == 0


def test_a_changed_event_time_field_applies_from_the_next_batch(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    """The last batch's readers wrote their progress under the field it was planned with:
    the plan after the restart finds it (before: 'no progress after ...' at every
    restart), and the batches planned from then on read the new field."""
    topic = new_topic(partitions=1)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    _json_records(write, 0, 5, 20)
    given = options(
        broker.bootstrap_servers, topic, None, eventTimeField="ts", progressTimeoutMs="5000"
    )
    checkpoint = _first_run(given, steps=1)  # batch 1, read by "ts"; its progress not taken
    restarted = Driven.restart({**given, "eventTimeField": "at"}, checkpoint)
    try:
        _json_records(write, 0, 30)
        rows = real(restarted.step())
        assert restarted.offset["watermark"] == BASE_MS + 19_000  # batch 1's "ts"
        assert [row["event_time"] for row in rows] == [BASE_MS + 130_000]  # read by "at"
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 129_000
    finally:
        restarted.stop()
    assert _lines(logged, "eventTimeField") == [
        "option 'eventTimeField' is 'at', the checkpoint's 'ts': the batch planned before "
        "the restart is read by 'ts' (should Spark run it again), every batch planned from "
        "now on by 'at'; a watermark never goes back, so records whose event time by 'at' "
        "is below it are late"
    ]


def test_a_batch_replayed_after_the_restart_is_read_by_the_field_it_was_planned_with(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """Spark logged batch 2's offset, then the query stopped before it ran: the restart
    runs it again, with the event times it was planned with, and its progress is found."""
    topic = new_topic(partitions=1)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    _json_records(write, 0, 5)
    given = options(
        broker.bootstrap_servers, topic, None, eventTimeField="ts", progressTimeoutMs="5000"
    )
    first = Driven.start(given)
    try:
        first.step()
        _json_records(write, 0, 20)
        logged_end = first.plan()  # in Spark's offset log; the batch never ran
        checkpoint = first.offset
    finally:
        first.stop()
    restarted = Driven.restart({**given, "eventTimeField": "at"}, checkpoint)
    try:
        replayed = real(restarted.run(logged_end))
        assert [row["event_time"] for row in replayed] == [BASE_MS + 20_000]  # by "ts"
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 19_000
    finally:
        restarted.stop()


# ------------------------------------------------------------ consumerIdleTimeout


class _Clock:
    """The planner's wall clock, moved by the test (the idle timeout counts wall time)."""

    def __init__(self) -> None:
        self.ns = time.time_ns()

    def time_ns(self) -> int:
        return self.ns

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_consumer_idle_timeout_turned_on_at_a_restart_applies(
    broker: KafkaBroker,
    new_topic: TopicFactory,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, 5, 20)
    given = options(broker.bootstrap_servers, topic, None)
    checkpoint = _first_run(given)
    assert checkpoint["watermark"] == MIN_WATERMARK  # partition 1, quiet, holds it
    clock = _Clock()
    monkeypatch.setattr(planner_module, "time", clock)
    restarted = Driven.restart({**given, "consumerIdleTimeout": "5s"}, checkpoint)
    try:
        restarted.step()  # the idle clocks start (a restart starts them again)
        clock.ns += 4_000_000_000
        restarted.step()
        assert set(restarted.statuses().values()) == {"ACTIVE"}
        clock.ns += 1_000_000_000  # both partitions seen quiet for 5 s
        restarted.step()
        assert set(restarted.statuses().values()) == {"IDLE"}
        assert restarted.offset["watermark"] == BASE_MS + 19_000
    finally:
        restarted.stop()
    assert _lines(logged, "consumerIdleTimeout") == [
        "option 'consumerIdleTimeout' is 5000 ms, the checkpoint's off: applied from this "
        "restart on (its clocks start again at a restart); a partition it made IDLE stays "
        "so until its next record"
    ]


# ------------------------------------------------------------ watermarkDelay


def test_a_changed_watermark_delay_applies_to_the_synthetic_rows_from_the_restart(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(partitions=1)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, 20)
    given = options(broker.bootstrap_servers, topic, None)
    first = Driven.start(given)
    try:
        first.step()
        synthetic = [row for row in first.step() if row["topic"] is None]
        assert [row["event_time"] for row in synthetic] == [BASE_MS + 19_000 + SYNTHETIC_DELAY_MS]
        checkpoint = first.offset
    finally:
        first.stop()
    restarted = Driven.restart({**given, "watermarkDelay": "1h"}, checkpoint)
    try:
        write.data(0, 30)
        rows = restarted.step()
        synthetic = [row for row in rows if row["topic"] is None]
        assert [row["event_time"] for row in synthetic] == [BASE_MS + 19_000 + 3_600_000]
    finally:
        restarted.stop()
    assert _lines(logged, "watermarkDelay") == [
        f"option 'watermarkDelay' is 3600000 ms, the checkpoint's {SYNTHETIC_DELAY_MS} ms: "
        "applied from this restart on (every batch's synthetic row, and with_valve_watermark "
        "through the event_time column's metadata)"
    ]


# ------------------------------------------------------------ subscribe


def test_a_topic_added_to_subscribe_joins_from_its_earliest_offset(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    first_topic, added = new_topic(partitions=1), new_topic(partitions=1)
    Writer(broker.bootstrap_servers, first_topic, "unused").data(0, 20)
    Writer(broker.bootstrap_servers, added, "unused").data(0, 3, 30)
    given = options(broker.bootstrap_servers, first_topic, None)
    checkpoint = _first_run(given)
    assert checkpoint["watermark"] == BASE_MS + 19_000
    restarted = Driven.restart({**given, "subscribe": f"{first_topic},{added}"}, checkpoint)
    try:
        rows = real(restarted.step())
        assert [(row["topic"], row["offset"]) for row in rows] == [(added, 0), (added, 1)]
        # It joined unaligned below the output: its record at 3 s is late, as for any
        # partition that appears while the watermark is past it.
        assert [row["late"] for row in rows] == [True, False]
        restarted.step()
        assert restarted.statuses() == {f"{first_topic}:0": "ACTIVE", f"{added}:0": "ACTIVE"}
        assert restarted.offset["watermark"] == BASE_MS + 19_000
    finally:
        restarted.stop()
    assert _lines(logged, "subscribe") == [
        f"option 'subscribe' is '{first_topic},{added}', the checkpoint's '{first_topic}': "
        "applied from this restart on: the partitions of topics it adds join from their "
        "earliest offsets; a topic it drops is no longer read and counts as FINISHED with "
        "failOnDataLoss=false, and stops the query otherwise"
    ]


def _two_topics_read(broker: KafkaBroker, new_topic: TopicFactory) -> tuple[str, str, Writer]:
    """Topics read to 20 s and 5 s (the second holds the watermark at 4 s)."""
    kept, dropped = new_topic(partitions=1), new_topic(partitions=1)
    Writer(broker.bootstrap_servers, kept, "unused").data(0, 20)
    dropped_writer = Writer(broker.bootstrap_servers, dropped, "unused")
    dropped_writer.data(0, 5)
    return kept, dropped, dropped_writer


def test_a_topic_dropped_from_subscribe_is_refused_in_one_line_by_default(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """As Spark's Kafka source says of partitions gone (failOnDataLoss=true): a topic
    dropped by mistake is not dropped for good. Before, it stayed in the offset and held
    the watermark where it was, for good, without a word."""
    kept, dropped, _ = _two_topics_read(broker, new_topic)
    given = options(broker.bootstrap_servers, f"{kept},{dropped}", None)
    checkpoint = _first_run(given)
    restarted = Driven.restart({**given, "subscribe": kept}, checkpoint)
    try:
        with pytest.raises(SourceError) as refused:
            restarted.step()
    finally:
        restarted.stop()
    assert str(refused.value) == (
        f"option 'subscribe' no longer takes topic(s) {dropped}, which this checkpoint "
        "reads: their records not read yet would be missed; subscribe to them again, or set "
        "failOnDataLoss=false to drop them (not read any more, their partitions FINISHED)"
    )


def test_a_topic_dropped_from_subscribe_is_no_longer_read_and_leaves_the_valve(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    """With failOnDataLoss=false. Before, it stayed in the offset and held the watermark
    where it was, for good."""
    kept, dropped, dropped_writer = _two_topics_read(broker, new_topic)
    given = options(broker.bootstrap_servers, f"{kept},{dropped}", None, failOnDataLoss="false")
    checkpoint = _first_run(given)
    assert checkpoint["watermark"] == BASE_MS + 4_000  # the dropped topic holds it
    restarted = Driven.restart({**given, "subscribe": kept}, checkpoint)
    try:
        dropped_writer.data(0, 40)
        rows = real(restarted.step())
        assert rows == []  # its new record is not read
        assert restarted.statuses() == {f"{kept}:0": "ACTIVE", f"{dropped}:0": "FINISHED"}
        assert restarted.offset["watermark"] == BASE_MS + 19_000
        assert dropped not in restarted.offset["topics"] or restarted.offset["topics"][dropped][
            "end"
        ] == [None]
        assert restarted.counter("partitions_unsubscribed") == 1
        restarted.step()
        assert real(restarted.rows) == []
    finally:
        restarted.stop()
    assert (
        f"{dropped}[0] is no longer subscribed: it is not read any more and counts as FINISHED"
        in logged.text
    )


# ------------------------------------------------------------ the progress topic


def test_a_progress_topic_given_more_partitions_is_read_in_every_one(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    """Readers' progress goes to any partition of the progress topic (keyed): before, the
    planner read only the partitions it knew, and waited for the rest until it failed,
    at every restart."""
    topic = new_topic(partitions=4)
    progress = new_topic(partitions=1, prefix="progress")
    write = Writer(broker.bootstrap_servers, topic, "unused")
    for partition in range(4):
        write.data(partition, 10 + partition)
    given = options(
        broker.bootstrap_servers,
        topic,
        None,
        progressTopic=progress,
        tasksPerBatch="4",
        progressTimeoutMs="5000",
    )
    checkpoint = _first_run(given, steps=1)
    admin.create_partitions([NewPartitions(progress, 16)])[progress].result(30)
    reader_clients.close_all()  # a new process: the readers' producer sees 16 partitions
    restarted = Driven.restart(given, checkpoint)
    try:
        restarted.step()  # batch 1's progress (partition 0); batch 2 planned and read
        for partition in range(4):
            write.data(partition, 20 + partition)
        restarted.step()
        # The test's premise: some of the records of batches 2 and 3 (one synthetic
        # task's, then four reader tasks' and one synthetic task's) went to a new partition.
        assert sum(_log_ends(broker, progress, 16)[1:]) > 0
        restarted.step()
        assert restarted.offset["watermark"] == BASE_MS + 19_000
    finally:
        restarted.stop()
    again = Driven.restart(given, restarted.offset)
    try:
        again.step()  # and a restart finds them too
    finally:
        again.stop()


def _log_ends(broker: KafkaBroker, topic: str, partitions: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "ends"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def test_a_changed_progress_topic_is_refused_in_one_line(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=1)
    control = new_topic(partitions=1, prefix="ctl")
    Writer(broker.bootstrap_servers, topic, control).data(0, 20)
    given = options(broker.bootstrap_servers, topic, control)
    checkpoint = _first_run(given, steps=1)
    moved = new_topic(partitions=1, prefix="ctl")  # the progress topic follows its name
    restarted = Driven.restart({**given, "controlTopic": moved}, checkpoint)
    try:
        with pytest.raises(SourceError) as refused:
            restarted.step()
    finally:
        restarted.stop()
    assert str(refused.value) == (
        f"option 'progressTopic' is '{moved}.progress' (from controlTopic), the checkpoint's "
        f"'{control}.progress': a restart cannot move it, as the last batch's progress is "
        f"there; set progressTopic to '{control}.progress' to keep it, or start the query on "
        "a new checkpointLocation"
    )


def test_a_changed_control_topic_is_read_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    """The checkpoint's positions are of the old control topic: before, they were taken
    for the new one's, and its markers below them never read."""
    from slackwater.markers import MarkerStatus

    topic = new_topic(partitions=2)
    control = new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    write.data(0, 20)
    for _ in range(3):  # the old control topic's position: 3
        write.marker(1, MarkerStatus.ACTIVE)
    given = options(broker.bootstrap_servers, topic, control)
    checkpoint = _first_run(given)
    assert checkpoint["control"] == {"0": 3}
    assert checkpoint["watermark"] == MIN_WATERMARK  # partition 1 holds it
    moved = new_topic(partitions=1, prefix="ctl")
    new_writer = Writer(broker.bootstrap_servers, topic, moved)
    new_writer.marker(1, MarkerStatus.IDLE, offset=0)  # offset 0 of the new control topic
    changed = {**given, "controlTopic": moved, "progressTopic": f"{control}.progress"}
    restarted = Driven.restart(changed, checkpoint)
    try:
        restarted.step()
        assert restarted.statuses()[f"{topic}:1"] == "IDLE"
        assert restarted.offset["watermark"] == BASE_MS + 19_000
        assert restarted.offset["control"] == {"0": 1}
    finally:
        restarted.stop()
    assert _lines(logged, "controlTopic") == [
        f"option 'controlTopic' is '{moved}', the checkpoint's '{control}': applied from this "
        f"restart on: '{moved}' is read from its start, its emitter's epochs taken as they "
        "come"
    ]


# ------------------------------------------------------------ startingOffsets


def test_starting_offsets_changed_at_a_restart_is_kept_from_the_checkpoint(
    broker: KafkaBroker, new_topic: TopicFactory, logged: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(partitions=1)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, 5)
    given = options(broker.bootstrap_servers, topic, None)
    checkpoint = _first_run(given, steps=1)
    write.data(0, 20)
    restarted = Driven.restart({**given, "startingOffsets": "latest"}, checkpoint)
    try:
        rows = real(restarted.step())
        assert [row["offset"] for row in rows] == [1]  # from the checkpoint's position
    finally:
        restarted.stop()
    assert _lines(logged, "startingOffsets") == [
        "option 'startingOffsets' is latest, the checkpoint's earliest: kept from the "
        "checkpoint (it applies to a new query alone, as in Spark's Kafka source): this "
        "one goes on from its checkpoint's positions"
    ]
