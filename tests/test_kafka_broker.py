"""The embedded broker: the session fixture and ``slackwater broker`` in the foreground."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from emitter.kafka_broker import BrokerError, KafkaBroker, free_port
from tests.conftest import TopicFactory


def test_session_broker_round_trips_a_record(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    producer.produce(topic, key=b"k", value=b"hello", partition=1, timestamp=1_234)
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": topic,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 1, 0)])
    try:
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.2)
        assert message is not None and message.error() is None
        assert (message.key(), message.value(), message.offset()) == (b"k", b"hello", 0)
        assert message.timestamp()[1] == 1_234
    finally:
        consumer.close()


def test_new_topic_factory_gives_fresh_names(admin: AdminClient, new_topic: TopicFactory) -> None:
    first, second = new_topic(partitions=3), new_topic()
    assert first != second
    topics = admin.list_topics(timeout=10).topics
    assert len(topics[first].partitions) == 3
    assert len(topics[second].partitions) == 1


def test_starting_on_a_taken_port_fails_clearly(broker: KafkaBroker) -> None:
    with pytest.raises(BrokerError, match="port"):
        KafkaBroker(port=broker.port).start(timeout_s=5)


def _start_cli(port: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "emitter.cli", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first_line = process.stdout.readline()
    return process, first_line


def _tansu_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if "tansu" in p.name()]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_broker_prints_bootstrap_and_stops_cleanly(signum: int) -> None:
    port = free_port()
    process, first_line = _start_cli(port)
    try:
        assert f"127.0.0.1:{port}" in first_line
        children = _tansu_children(process.pid)
        assert len(children) == 1
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        assert metadata.brokers  # a real Kafka API answered
        process.send_signal(signum)
        assert process.wait(timeout=15) == 0
        psutil.wait_procs(children, timeout=5)
        assert not any(child.is_running() for child in children)
    finally:
        if process.poll() is None:
            process.kill()


def test_cli_broker_child_dies_with_a_killed_parent() -> None:
    process, _ = _start_cli(free_port())
    children = _tansu_children(process.pid)
    assert len(children) == 1
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, "the broker outlived its parent"
