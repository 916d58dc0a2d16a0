"""Whether a partition went back or vanished
(spark_consumer/source/driver/partition_identity.py), on Apache Kafka: topics deleted,
re-created (while the query runs, or while it is down), a stale leader's low log end, a
lower end in a newer leader epoch. The same module's cases on plans the test makes,
without a broker, are in tests/pure/test_partition_identity.py.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SourceError
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.shared.options import SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.production import (
    LowBroker,
    assert_never_listed,
    created,
    delete_topic,
    setup,
    step_until,
    text,
)
from tests.harness.source_driver import Driven, options, real

# ------------------------------------------------------------ 6, 7. deleted topics, lost data


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_deleted_topic_leaves_the_valve_as_finished(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """Read to its end, a deleted topic loses nothing: FINISHED whatever failOnDataLoss
    says (docs/source.md's table of events)."""
    behind, ahead = new_topic(partitions=1), new_topic(partitions=1)
    control = new_topic(partitions=1, prefix="ctl")
    Writer(broker.bootstrap_servers, behind, control).data(0, 0, 1, 2)
    Writer(broker.bootstrap_servers, ahead, control).data(0, *range(20))
    given = options(
        broker.bootstrap_servers,
        f"{behind},{ahead}",
        control,
        failOnDataLoss=text(fail_on_data_loss),
    )
    driven = Driven.start(given)
    try:
        driven.step()
        driven.step()
        assert driven.offset["watermark"] == BASE_MS + 1_000  # `behind` holds the minimum
        delete_topic(admin, behind)
        # Missing from one metadata answer is not enough (a lost DESCRIBE, a broker behind):
        # it leaves once missing for a while and a request for it says it does not exist.
        step_until(driven, lambda: driven.counter("partitions_deleted") == 1, "the deletion")
        assert driven.statuses()[f"{behind}:0"] == "FINISHED"
        assert driven.counter("records_lost") == 0
        assert sorted(SourceOffset.decode(driven.offset).data) == [ahead]
        assert driven.offset["watermark"] == BASE_MS + 18_000
        # Asking the broker about the deleted topic did not make it again: Kafka creates
        # a topic a request asks for (auto.create.topics.enable, true by default) unless
        # the client says not to. The broker answers before it creates, so: a while.
        driven.step()
        assert_never_listed(admin, behind, seconds=3.0)
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_recreated_topic_starts_again_or_stops_the_query(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        driven.step()  # [0, 10) read
        delete_topic(admin, topic)
        wait_until(lambda: created(admin, topic), 60, f"{topic} created again")
        Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
        # The new topic's id, described at the next plan, says it is another log.
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\]: the topic was deleted and re-created "
                ".* offset 10;",
            ):
                step_until(driven, lambda: False, "the query to stop")
            return
        rows = step_until(
            driven, lambda: driven.counter("offsets_went_back") == 1, "offsets gone back"
        )
        rows += real(driven.step())
        assert [row["offset"] for row in rows] == [0, 1, 2]  # the new topic's records
        assert driven.counter("offsets_went_back") == 1
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_recreated_past_the_position_between_two_plans_is_read_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """Issue 41, finding 1: 50 records read; between two plans the topic is deleted,
    made again and given 80 records, its log end past the old position. Judged by log
    ends alone the new log looked like the old one grown: offsets 50-79 were read and
    0-49 of the new log never, with no word. Its id, described at every plan, says it
    is another log (rule 6)."""
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(50))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        assert len(real(driven.step())) == 50
        delete_topic(admin, topic)
        wait_until(lambda: created(admin, topic), 60, f"{topic} created again")
        Writer(broker.bootstrap_servers, topic, control).data(0, *range(100, 180))
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\]: the topic was deleted and re-created "
                "under its name after this query read to offset 50",
            ):
                step_until(driven, lambda: False, "the query to stop")
            return
        rows = step_until(
            driven, lambda: driven.counter("offsets_went_back") == 1, "the new log found"
        )
        rows += real(driven.step())
        assert [row["offset"] for row in rows] == list(range(80))  # the new log, whole
        assert driven.counter("records_lost") == 0  # the old one had been read to its end
    finally:
        driven.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_deleted_topic_loses_the_records_a_log_end_showed_whether_planned_or_not(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """Issue 41, finding 2: 100 records, 10 a batch; the planner has seen log end 100
    when the topic is deleted. The 90 not planned yet are as lost as planned ones would
    be: failOnDataLoss=true stops the query, false counts them; before, they were
    counted nowhere and the query went on."""
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(100))
    given = options(
        broker.bootstrap_servers,
        topic,
        control,
        failOnDataLoss=text(fail_on_data_loss),
        maxOffsetsPerTrigger="10",
    )
    driven = Driven.start(given)
    try:
        assert len(real(driven.step())) == 10  # [0, 10) read, log end 100 seen
        delete_topic(admin, topic)
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\] offsets 10 to 99 \(90 records, seen only "
                r"in a log end\) are gone before this query read them: the topic was deleted",
            ):
                step_until(driven, lambda: False, "the query to stop")
            return
        step_until(driven, lambda: driven.counter("partitions_deleted") == 1, "the deletion")
        assert driven.counter("records_lost") == 90
        assert driven.statuses()[f"{topic}:0"] == "FINISHED"
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
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    first = Driven.start(given)
    try:
        first.step()  # [0, 10) read
        first.step()
    finally:
        first.stop()
    kept = first.offset["kafka"]
    assert set(kept["ids"]) == {topic, control} and kept["epochs"][topic] == 0
    delete_topic(admin, topic)
    wait_until(lambda: created(admin, topic), 60, f"{topic} created again")
    Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
    restarted = Driven(SlackwaterStreamReader(SourceOptions.parse(given)), first.offset)
    try:
        if fail_on_data_loss:
            with pytest.raises(
                SourceError, match=rf"data loss: {topic}\[0\]: the topic was deleted and re-created"
            ):
                restarted.step()
            return
        rows = real(restarted.step())
        assert restarted.counter("offsets_went_back") == 1
        rows += step_until(restarted, lambda: restarted.counter("records") == 13, "3 records")
        assert [row["offset"] for row in rows] == [0, 1, 2]  # the new topic's, from its start
    finally:
        restarted.stop()


def _read_then_low(
    broker: KafkaBroker, new_topic: TopicFactory, **settings: str
) -> tuple[str, str, Writer, Driven]:
    """Ten records read by one query; returns its next plans' driver, on no broker yet."""
    topic, control, write = setup(broker, new_topic, 1)
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
    low = LowBroker(given, topic)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        assert real(driven.step()) == []  # below the position: it stands still
        low.low = False
        write.data(0, 10, 11)
        rows = step_until(driven, lambda: driven.counter("records") == 12, "12 records read")
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
        broker, new_topic, failOnDataLoss=text(fail_on_data_loss)
    )
    given = first.reader.options
    low = LowBroker(given, topic)
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        began = time.monotonic()
        # Plans for longer than the old timer (5 s): the outcome holds at any speed.
        while time.monotonic() - began < 7.0 or low.lowered < 3:
            assert real(driven.step()) == []
        assert driven.counter("offsets_went_back") == 0
        low.low = False
        write.data(0, 10, 11)
        rows = step_until(driven, lambda: driven.counter("records") == 12, "12 records read")
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
        broker, new_topic, failOnDataLoss=text(fail_on_data_loss)
    )
    given = first.reader.options
    low = LowBroker(given, topic, 1)
    low.low = False
    driven = Driven(SlackwaterStreamReader(given, low), first.offset)
    try:
        write.data(0, 10)
        assert [row["offset"] for row in real(driven.step())] == [10]  # its epoch is known
        low.low = True
        if fail_on_data_loss:
            with pytest.raises(SourceError, match="truncated by an unclean leader election"):
                driven.step()
            return
        assert real(driven.step()) == []  # started again at the earliest offset, 0
        assert driven.counter("offsets_went_back") == 1
        # The new leader's log (here the old one, not truncated): read again from 0.
        # Its answers carry its newer epoch; the old epoch's would be the deposed
        # leader's, stale (tests/pure/test_one_verdict.py).
        low.low, low.stays_ahead = False, True
        rows = step_until(driven, lambda: driven.counter("records") == 22, "a read again")
        assert [row["offset"] for row in rows] == list(range(11))
        assert driven.counter("offsets_went_back") == 1
    finally:
        driven.stop()
