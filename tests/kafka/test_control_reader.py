"""The control reader (spark_consumer/source/driver/control_reader.py) on Apache Kafka:
markers read up to the control topic's ends the plan listed, never past them; a control
topic that ends below its position, or is re-created; a marker held for a partition
not made yet, applied in the plan that sees it.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus, encode
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.driver.progress_collector import ProgressCollector
from spark_consumer.source.shared.options import SourceOptions
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import Writer
from tests.harness.production import (
    LowBroker,
    created,
    delete_topic,
    latest,
    marker,
    setup,
    step_until,
)
from tests.harness.source_driver import Driven, options

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


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
    topic, control, write = setup(broker, new_topic, 1)
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
            ends = admin.list_offsets({TopicPartition(control, 0): latest()})
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


# ------------------------------------------------------------ 6, 7. deleted topics, lost data


def test_one_control_topic_end_below_its_position_reads_nothing_again(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """Finding 3 of issue 31: one low answer of the control topic once made the planner
    read it again from 0 and forget the emitters' epochs (markers_read 2 -> 4)."""
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    for seq in range(2):
        write.raw_control(*encode(marker(topic, ACTIVE, 10, epoch=5, seq=seq)))
    first = Driven.start(options(broker.bootstrap_servers, topic, control))
    try:
        first.step()
        first.step()
        assert first.offset["control"] == {"0": 2}
        assert first.counter("markers_read") == 2
    finally:
        first.stop()
    given = first.reader.options
    low = LowBroker(given, control)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        write.data(0, 10)
        step_until(driven, lambda: low.lowered >= 2 and driven.counter("records") == 11, "a read")
        assert driven.offset["control"] == {"0": 2}
        assert (driven.counter("control_went_back"), driven.counter("markers_read")) == (0, 2)
    finally:
        driven.stop()


def test_a_recreated_control_topic_is_read_again_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    for seq in range(2):  # an emitter of epoch 5: the control topic's position is 2
        write.raw_control(*encode(marker(topic, ACTIVE, 10, epoch=5, seq=seq)))
    driven = Driven.start(options(broker.bootstrap_servers, topic, control))
    try:
        driven.step()
        driven.step()
        assert driven.offset["control"] == {"0": 2}
        delete_topic(admin, control)
        wait_until(lambda: created(admin, control), 60, f"{control} created again")
        # A new emitter on the new topic takes epoch 1 (the highest it sees, plus one).
        Writer(broker.bootstrap_servers, topic, control).raw_control(
            *encode(marker(topic, IDLE, 10, epoch=1, seq=0))
        )
        step_until(driven, lambda: driven.statuses()[f"{topic}:0"] == "IDLE", "the IDLE")
        assert driven.offset["control"] == {"0": 1}
        assert driven.counter("control_went_back") == 1
        write.data(0, 10)  # a later plan: the new topic is read on, not again from 0
        step_until(driven, lambda: driven.counter("records") == 11, "a record read")
        assert (driven.counter("control_went_back"), driven.counter("markers_read")) == (1, 3)
    finally:
        driven.stop()


# ------------------------------------------------------------ 8, 12. partitions that appear


def test_a_held_marker_applies_when_create_partitions_makes_its_partition(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    """A FINISHED@0 for a partition not made yet applies in the plan that sees the
    partition, not only when some other input changes: a bounded job ends."""
    topic, control, write = setup(broker, new_topic, 2)
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
        step_until(driven, lambda: driven.offset["held"] == [], "partition 2 to be seen")
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
