"""Every client is made one way: the user's settings, our logging, the bootstrap servers,
then what the client's job needs, in that order of precedence; partitions are counted
one way from a metadata answer."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError
from confluent_kafka.admin import ClusterMetadata, PartitionMetadata, TopicMetadata

from slackwater.kafka_clients import client_settings, partition_counts


def test_the_jobs_settings_win_over_the_users_and_the_users_over_nothing() -> None:
    settings = client_settings(
        "control-writer",
        "broker:9092",
        user={"acks": "1", "security.protocol": "SSL", "bootstrap.servers": "ignored:1"},
        ours={"acks": "all"},
    )
    assert settings["acks"] == "all"  # a marker is acknowledged by all replicas
    assert settings["security.protocol"] == "SSL"  # the user's own settings pass
    assert settings["bootstrap.servers"] == "broker:9092"


def test_librdkafka_logs_through_python_logging_under_the_clients_name() -> None:
    settings = client_settings("admin", "broker:9092")
    assert isinstance(settings["logger"], logging.Logger)
    assert settings["logger"].name.endswith(".admin")
    assert callable(settings["error_cb"])


def test_partition_counts_come_only_from_topics_listed_without_error() -> None:
    metadata = ClusterMetadata()
    for name, partitions, error in (
        ("orders", 3, None),
        ("payments", 1, None),
        ("broken", 2, KafkaError(KafkaError.LEADER_NOT_AVAILABLE)),
    ):
        topic = TopicMetadata()
        topic.topic, topic.error = name, error
        topic.partitions = {index: PartitionMetadata() for index in range(partitions)}
        metadata.topics[name] = topic
    counts = partition_counts(metadata, ["payments", "orders", "broken", "missing"])
    assert counts == {"payments": 1, "orders": 3}
    assert list(counts) == ["payments", "orders"]  # in the order asked
