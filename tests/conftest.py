"""Shared fixtures: one embedded broker per test session, fresh topics per test."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from emitter.embedded_broker import EmbeddedBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A real Tansu broker on a free loopback port; stopped even when tests fail."""
    log = Path(tmp_path_factory.mktemp("broker")) / "tansu.log"
    embedded = EmbeddedBroker(log_path=log).start()
    try:
        yield embedded
    finally:
        # Kafka clients that tests left for the garbage collector go first, while the
        # broker still answers; else librdkafka logs refused connections at exit.
        gc.collect()
        embedded.stop()


@pytest.fixture(scope="session")
def admin(broker: EmbeddedBroker) -> AdminClient:
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


@pytest.fixture(scope="session")
def spark(broker: EmbeddedBroker) -> Iterator[object]:
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
