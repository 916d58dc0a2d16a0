"""The plan's partitions following the broker's
(spark_consumer/source/driver/topic_partitions.py) on Apache Kafka: partitions gone from
a topic re-created with fewer leave as FINISHED; a partition that appears after every
partition finished is data after FINISHED.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.source import SourceError
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.production import (
    created,
    delete_topic,
    setup,
    step_until,
    text,
)
from tests.harness.source_driver import Driven, options, real
from tests.harness.source_jobs import late_output_rows

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


# ------------------------------------------------------------ 6, 7. deleted topics, lost data


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_partitions_gone_from_a_topic_recreated_with_fewer_leave_the_valve(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = setup(broker, new_topic, 2)
    write.data(0, *range(10))
    write.data(1, *range(5))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        driven.step()
        delete_topic(admin, topic)
        wait_until(lambda: created(admin, topic, partitions=1), 60, f"{topic} created again")
        Writer(broker.bootstrap_servers, topic, control).data(0, 30, 31, 32)
        if fail_on_data_loss:
            with pytest.raises(SourceError, match=rf"{topic}\[0\]: the topic was deleted and re-"):
                step_until(driven, lambda: False, "the query to stop")
            return
        rows = step_until(
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


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_topic_recreated_with_more_partitions_is_read_whole_from_its_start(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    """Re-created with more partitions: every old one is a new log (rule 6, its id),
    read again from its start, and the new ones join from theirs; or the query stops."""
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        assert len(real(driven.step())) == 10
        delete_topic(admin, topic)
        wait_until(lambda: created(admin, topic, partitions=2), 60, f"{topic} created again")
        again = Writer(broker.bootstrap_servers, topic, control)
        again.data(0, *range(30, 42))
        again.data(1, 50, 51)
        if fail_on_data_loss:
            with pytest.raises(SourceError, match=rf"{topic}\[0\]: the topic was deleted and re-"):
                step_until(driven, lambda: False, "the query to stop")
            return
        rows = step_until(driven, lambda: driven.counter("records") == 10 + 14, "the new log")
        assert sorted((row["partition"], row["offset"]) for row in rows) == [
            *((0, offset) for offset in range(12)),
            (1, 0),
            (1, 1),
        ]
        assert driven.counter("offsets_went_back") == 1
        assert driven.counter("records_lost") == 0
    finally:
        driven.stop()


# ------------------------------------------------------------ 8, 12. partitions that appear


def test_a_partition_that_appears_after_every_partition_finished_is_data_after_finished(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, tmp_path: Path
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
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
        rows = step_until(
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
