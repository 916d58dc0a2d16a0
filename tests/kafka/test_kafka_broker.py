"""Apache Kafka from the fetched jars: the session fixture and ``slackwater broker``."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_broker import BrokerError, KafkaBroker, cluster_id, free_port
from tests.conftest import TopicFactory
from tests.harness.factories import SLACKWATER, run_cli

pytestmark = pytest.mark.integration


def test_session_broker_round_trips_a_record(broker: KafkaBroker, new_topic: TopicFactory) -> None:
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


def test_a_taken_controller_port_fails_clearly_before_anything_starts(broker: KafkaBroker) -> None:
    node = KafkaBroker()
    node.controller_port = broker.controller_port  # the session broker's, listened on
    with pytest.raises(BrokerError, match=rf"port in use: .*:{broker.controller_port}"):
        node.launch()
    assert not node.running and node.log_dir is None


def test_a_failed_format_leaves_no_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's temporary directory is made in this test's own (make test's other
    # process starts and ends brokers in the machine's at any moment).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    node = KafkaBroker()
    node.format_arguments = ["--no-such-option"]
    with pytest.raises(BrokerError, match=r"formatting .* failed"):
        node.launch()
    assert node.log_dir is None and list(tmp_path.glob("slackwater-kafka-*")) == []


def _start_cli(port: int, *extra: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [*SLACKWATER, "broker", "--port", str(port), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first_line = process.stdout.readline()
    return process, first_line


def _java_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "java"]


def _log_dir_of(first_line: str) -> Path:
    """The temporary log directory, from the 'log: <dir>/server.log' of the first line."""
    return Path(first_line.rsplit("log: ", 1)[1].strip()).parent


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_broker_prints_bootstrap_and_stops_cleanly_leaving_nothing(signum: int) -> None:
    port = free_port()
    process, first_line = _start_cli(port)
    try:
        assert f"127.0.0.1:{port}" in first_line
        log_dir = _log_dir_of(first_line)
        assert (log_dir / "data" / "meta.properties").exists()  # formatted for KRaft
        children = _java_children(process.pid)
        assert len(children) == 1
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        assert list(metadata.brokers) == [1]  # Apache Kafka's node 1 answered
        process.send_signal(signum)
        assert process.wait(timeout=60) == 0
        psutil.wait_procs(children, timeout=10)
        assert not any(child.is_running() for child in children)
        assert not log_dir.exists()  # a temporary log directory goes with the broker
    finally:
        if process.poll() is None:
            process.kill()


def test_cli_broker_child_dies_with_a_killed_parent() -> None:
    process, _ = _start_cli(free_port())
    children = _java_children(process.pid)
    assert len(children) == 1
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    _gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, "the broker outlived its parent"


def test_cli_broker_with_log_dir_keeps_topics_for_the_next_start(tmp_path: Path) -> None:
    log_dir, port = tmp_path / "kafka", free_port()
    for run in range(2):
        process, first_line = _start_cli(port, "--log-dir", str(log_dir))
        try:
            assert str(log_dir / "server.log") in first_line
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
            if run == 0:
                admin.create_topics([NewTopic("kept", 3, 1)])["kept"].result(30)
            else:
                assert len(admin.list_topics(timeout=10).topics["kept"].partitions) == 3
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
        assert (log_dir / "data" / "meta.properties").exists()  # kept, not removed


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--port", "70000"], "70000 is not a port"), (["--port", "0"], "0 is not a port")],
)
def test_cli_broker_rejects_a_bad_port_in_one_line(arguments: list[str], message: str) -> None:
    result = run_cli("broker", *arguments, timeout_s=30)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert "argument --port" in last and message in last
    assert "Traceback" not in result.stderr


def test_broker_rejects_a_bad_port_given_in_code() -> None:
    with pytest.raises(BrokerError, match="invalid port 70000"):
        KafkaBroker(port=70000)


def test_missing_jars_fail_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACKWATER_JARS_DIR", str(tmp_path))
    with pytest.raises(BrokerError, match="make jars"):
        KafkaBroker().start()


def test_cluster_ids_are_kafkas_format_and_never_look_like_an_option() -> None:
    ids = [cluster_id() for _ in range(5_000)]  # about 78 would start with "-" by chance
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
