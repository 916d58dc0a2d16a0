"""A reader's ranges (spark_consumer/source/executor/reader_ranges.py) on Apache Kafka:
records gone from under a planned range before it is read (the topic deleted, or
re-created empty; records deleted by retention), which failOnDataLoss stops the
query on or skips and counts.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SourceError
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.production import (
    created,
    delete_records_before,
    delete_topic,
    setup,
    step_until,
    text,
)
from tests.harness.source_driver import Driven, options, real

# ------------------------------------------------------------ 6, 7. deleted topics, lost data


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_batch_planned_over_a_topic_deleted_before_it_is_read(
    broker: KafkaBroker, new_topic: TopicFactory, admin: AdminClient, fail_on_data_loss: bool
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        end = driven.plan()  # [0, 10) planned
        delete_topic(admin, topic)
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\] offsets 0 to 9 \(10 records, planned in a batch\) "
                "are gone .*: the topic was deleted",
            ):
                driven.run(end)
            return
        assert real(driven.run(end)) == []
        step_until(driven, lambda: driven.offset["status"] == "FINISHED", "the deletion")
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
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(10))
    given = options(
        broker.bootstrap_servers,
        topic,
        control,
        failOnDataLoss=text(fail_on_data_loss),
        readTimeoutMs="120000",
    )
    driven = Driven.start(given)
    try:
        end = driven.plan()  # [0, 10) planned
        delete_topic(admin, topic)
        wait_until(lambda: created(admin, topic), 60, f"{topic} created again")
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\] offsets 0 to 9 \(10 records, planned in a batch\) "
                "are gone .*: the topic was deleted and re-created",
            ):
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
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(4))
    given = options(
        broker.bootstrap_servers, topic, control, failOnDataLoss=text(fail_on_data_loss)
    )
    driven = Driven.start(given)
    try:
        driven.step()  # [0, 4) read
        write.data(0, *range(4, 12))
        end = driven.plan()  # [4, 12) planned
        delete_records_before(admin, topic, 0, 7)  # 4, 5, 6 go before they are read
        if fail_on_data_loss:
            with pytest.raises(
                SourceError,
                match=rf"data loss: {topic}\[0\] offsets 4 to 6 \(3 records, planned in a batch\) "
                "are gone .*: retention",
            ):
                driven.run(end)
            return
        assert [row["offset"] for row in real(driven.run(end))] == [7, 8, 9, 10, 11]
        driven.step()
        assert driven.counter("records_lost") == 3
        assert driven.counter("records") == 4 + 5
    finally:
        driven.stop()
