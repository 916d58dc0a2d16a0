"""The planner's Kafka client (spark_consumer/source/driver/planner_client.py) on Apache
Kafka: log ends asked in several ListOffsets requests are each partition's own
(issue 33). The stream reader is driven as Spark does, in this process
(tests/harness/source_driver.py)."""

from __future__ import annotations

import pytest

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import Writer
from tests.harness.source_driver import Driven, options, real


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
