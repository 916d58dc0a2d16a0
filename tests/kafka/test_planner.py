"""The planner (spark_consumer/source/driver/planner.py) on Apache Kafka: the consumer-side
idle clock (consumerIdleTimeout) starts again at a restart, and counts no time the
broker was away.

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_broker import KafkaBroker
from tests.conftest import TEST_BROKER_SETTINGS, TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_driver import Driven, options, real

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
