"""Shared fixtures: one Apache Kafka broker per test session, fresh topics per test.

Every test that uses the broker (or Spark, which uses it) is marked ``integration``, so
``pytest -m "not integration"`` runs the unit tests alone, in seconds.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from emitter.kafka_broker import KafkaBroker

if TYPE_CHECKING:
    from tests.emitter_harness import RunningEmitter


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


# Everything not here is Apache Kafka's default.
TEST_BROKER_SETTINGS = {
    # Tests write fixed event times (2023, tests/pipeline_harness.BASE_MS) as record
    # timestamps; time-based retention (7 days) would delete them 30 s after start.
    "log.retention.ms": "-1",
    # The log cleaner looks for dirty logs every 15 s; the compaction test need not wait.
    "log.cleaner.backoff.ms": "200",
}


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Apache Kafka on a free loopback port; stopped even when tests fail."""
    log_dir = Path(tmp_path_factory.mktemp("kafka"))
    kafka = KafkaBroker(log_dir=log_dir, settings=TEST_BROKER_SETTINGS).start()
    try:
        yield kafka
    finally:
        # Kafka clients that tests left for the garbage collector go first, while the
        # broker still answers; else librdkafka logs refused connections at exit.
        gc.collect()
        kafka.stop()


@pytest.fixture(scope="session")
def admin(broker: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


TopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(admin: AdminClient) -> TopicFactory:
    """Creates a topic with a fresh uuid name and returns the name."""

    def create(partitions: int = 1, prefix: str = "t", **config: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)]
        )
        futures[name].result(10)
        return name

    return create


EmitterFactory = Callable[..., "RunningEmitter"]


@pytest.fixture
def emitters(broker: KafkaBroker) -> Iterator[EmitterFactory]:
    """Starts emitters on the session broker; stops every one, also when a test fails."""
    from tests.emitter_harness import start_emitter

    started: list[RunningEmitter] = []

    def start(**settings: object) -> RunningEmitter:
        settings.setdefault("bootstrap_servers", broker.bootstrap_servers)
        running = start_emitter(**settings)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


@pytest.fixture(scope="session")
def spark(broker: KafkaBroker) -> Iterator[object]:
    """One local SparkSession for every Spark test (starting one takes seconds).

    It depends on ``broker`` so that it stops first, with the clients its queries hold.
    """
    from spark_consumer.kafka_source import KafkaDataSource
    from spark_consumer.pipeline import spark_session

    session = spark_session("slackwater-tests")
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(KafkaDataSource)
    try:
        yield session
    finally:
        session.stop()
