"""The progress collector (spark_consumer/source/driver/progress_collector.py) on Apache
Kafka: the readers' progress records on the progress topic, gone at a restart (deleted
by retention, the topic deleted), a progress topic two queries share, and progress the
broker refuses.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SourceError
from spark_consumer.source.shared.options import PROGRESS_RETENTION_MS
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS
from tests.harness.production import (
    delete_records_before,
    delete_topic,
    latest,
    setup,
)
from tests.harness.source_driver import Driven, options

# ------------------------------------------------------------ 5. progress gone at a restart


def test_a_restart_after_the_progress_records_are_gone_plans_at_once(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
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
    ends = admin.list_offsets({TopicPartition(progress_topic, 0): latest()})
    delete_records_before(admin, progress_topic, 0, next(iter(ends.values())).result(10).offset)
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
    topic, control, write = setup(broker, new_topic, 1)
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
    delete_topic(admin, f"{control}.progress")
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


# ------------------------------------------------------------ 9. two queries, one progress topic


def test_two_queries_sharing_a_progress_topic_never_take_each_others_progress(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
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
    topic, control, write = setup(broker, new_topic, 1)
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
