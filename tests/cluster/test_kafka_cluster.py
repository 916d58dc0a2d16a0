"""Apache Kafka as three KRaft nodes: the launcher (``KafkaCluster``, ``slackwater broker
--nodes 3``) and what a lost broker does to writes acknowledged by all replicas."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from slackwater.cli_types import ensure_port_free
from slackwater.kafka_broker import BrokerError, free_port
from slackwater.kafka_cluster import KafkaCluster
from tests.harness.cluster import described, in_sync, kill_leader, leader_of, replicated_topic
from tests.harness.factories import SLACKWATER, run_cli, wait_until


def _write(bootstrap: str, topic: str, value: bytes, timeout_s: float) -> KafkaError | None:
    """One record with acks=all; the delivery error, or None once every in-sync replica
    has it."""
    outcome: list[KafkaError | None] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000),
            "allow.auto.create.topics": False,
            "log_level": 0,
        }
    )
    producer.produce(topic, value, partition=0, on_delivery=lambda e, _m: outcome.append(e))
    producer.flush(timeout_s + 10)
    assert len(outcome) == 1, "no delivery report"
    return outcome[0]


def _configs(admin: AdminClient, resource: ConfigResource) -> dict[str, Any] | None:
    """The resource's configs, or None while the node asked does not know the topic."""
    try:
        configs: dict[str, Any] = admin.describe_configs([resource])[resource].result(30)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise
        return None
    return configs


def test_three_nodes_replicate_every_topic_three_times_with_two_in_sync_needed(
    cluster: KafkaCluster,
) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
    topic = replicated_topic(admin)
    partition = wait_until(lambda: described(admin, topic), 60, f"{topic} known to the node asked")
    assert sorted(partition.replicas) == [1, 2, 3]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    # DescribeConfigs may go to another node than the one that listed the topic, which
    # may not know it yet (under load: UNKNOWN_TOPIC_OR_PART): asked until one does.
    config = wait_until(lambda: _configs(admin, resource), 60, f"{topic}'s configs")
    assert config["min.insync.replicas"].value == "2"
    assert _write(cluster.bootstrap_servers, topic, b"one", timeout_s=30) is None


def test_a_killed_leader_moves_leadership_and_acks_all_writes_go_on_until_two_are_lost(
    all_nodes_running: KafkaCluster,
) -> None:
    cluster = all_nodes_running
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = replicated_topic(admin)
    leader = kill_leader(cluster, admin, topic, timeout_s=60)
    # Two replicas of three are in sync: min.insync.replicas=2 is met.
    assert _write(cluster.bootstrap_servers, topic, b"after one lost", timeout_s=60) is None
    second = leader_of(admin, topic)
    cluster.node(second).kill()
    # One replica left (and one controller of three: no quorum): acks=all cannot be met.
    refused = _write(cluster.bootstrap_servers, topic, b"after two lost", timeout_s=5)
    assert refused is not None
    cluster.start_nodes([leader, second])  # together: each is ready once all are listed
    wait_until(lambda: in_sync(admin, topic) == {3}, 120, f"{topic} back to 3 in sync")
    assert _write(cluster.bootstrap_servers, topic, b"all back", timeout_s=60) is None


def test_a_cluster_that_cannot_listen_on_its_host_is_one_error() -> None:
    with pytest.raises(BrokerError, match=r"cannot listen on '256\.1\.1\.1'"):
        KafkaCluster(3, host="256.1.1.1")


def _consecutive_free_ports(count: int) -> int:
    for _ in range(50):
        first = free_port()
        if first + count <= 65535 and all(
            ensure_port_free("127.0.0.1", first + i) is None for i in range(1, count)
        ):
            return first
    raise AssertionError(f"no {count} consecutive free ports")


@dataclass
class _CliCluster:
    """A running ``slackwater broker --nodes 3``: its process, first port, bootstrap
    servers, first line and the nodes' JVMs."""

    process: subprocess.Popen[str]
    port: int
    bootstrap: str
    first_line: str
    children: list[psutil.Process]


@contextlib.contextmanager
def _cli_cluster() -> Iterator[_CliCluster]:
    """The command started on three free ports, once it says where it listens; stopped
    with SIGTERM when the block ends, unless the test ended it."""
    port = _consecutive_free_ports(3)
    process = subprocess.Popen(
        [*SLACKWATER, "broker", "--nodes", "3", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first_line = process.stdout.readline()
        bootstrap = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
        assert f"bootstrap servers: {bootstrap};" in first_line
        children = [
            p for p in psutil.Process(process.pid).children(recursive=True) if p.name() == "java"
        ]
        yield _CliCluster(process, port, bootstrap, first_line, children)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # the launcher stops the nodes, removes dirs
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.mark.integration
@pytest.mark.cluster
def test_cli_broker_with_three_nodes_serves_a_cluster_and_stops_leaving_nothing() -> None:
    with _cli_cluster() as cli:
        line = cli.first_line
        logs = [Path(log.strip()) for log in line.rsplit("log: ", 1)[1].split(",")]
        assert len(logs) == 3 and all(log.parent.is_dir() for log in logs)
        assert len(cli.children) == 3
        admin = AdminClient({"bootstrap.servers": cli.bootstrap})
        assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]
        cli.process.send_signal(signal.SIGTERM)
        assert cli.process.wait(timeout=120) == 0
        _gone, alive = psutil.wait_procs(cli.children, timeout=30)
        assert not alive
        assert not any(log.parent.exists() for log in logs)  # temporary directories


def _node_listening_on(children: list[psutil.Process], port: int) -> psutil.Process:
    """The node's JVM among the command's children: the one listening on ``port``."""
    for child in children:
        try:
            connections = child.net_connections("tcp")
        except psutil.NoSuchProcess:
            continue  # a node killed before
        if port in {c.laddr.port for c in connections if c.status == "LISTEN"}:
            return child
    raise AssertionError(f"no node listens on {port}")


@pytest.mark.integration
@pytest.mark.cluster
def test_cli_broker_with_three_nodes_serves_on_without_one_and_stops_without_a_quorum() -> None:
    """What docs/deploy.md says a cluster of three does: one node SIGKILLed is one line,
    and writes acknowledged by all in-sync replicas go on; a second one lost leaves no
    quorum, and the command stops the last node and exits 1, saying so in one line."""
    with _cli_cluster() as cli:
        process = cli.process
        assert process.stderr is not None
        topic = replicated_topic(AdminClient({"bootstrap.servers": cli.bootstrap}))
        _node_listening_on(cli.children, cli.port + 1).kill()  # node 2
        lost = process.stderr.readline().strip()
        assert lost.startswith("slackwater broker: node 2 exited with code -9; "), lost
        assert lost.endswith("2 of 3 nodes serve on (a quorum needs 2)"), lost
        assert process.poll() is None  # still serving
        assert _write(cli.bootstrap, topic, b"after one node", 60) is None
        _node_listening_on(cli.children, cli.port + 2).kill()  # node 3
        assert process.wait(timeout=120) == 1
        last = process.stderr.read().strip().splitlines()
        assert last == [
            "slackwater broker: node 3 exited with code -9; 1 of 3 nodes left, no quorum "
            "(it needs 2): stopping"
        ]
        _gone, alive = psutil.wait_procs(cli.children, timeout=30)
        assert not alive  # node 1 stopped with the command


@pytest.mark.parametrize("host", ["256.1.1.1", "no-such-host.invalid"])
@pytest.mark.parametrize("nodes", ["1", "3"])
def test_cli_broker_on_a_host_it_cannot_listen_on_is_one_line(host: str, nodes: str) -> None:
    result = run_cli("broker", "--host", host, "--nodes", nodes, timeout_s=30)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"slackwater broker: cannot listen on {host!r}: ")


def _kept_nodes(log_dir: Path, nodes: int, cluster: str) -> None:
    """What `slackwater broker --nodes N --log-dir DIR` keeps of a cluster: node-K
    directories formatted with one cluster id."""
    for index in range(1, nodes + 1):
        data = log_dir / f"node-{index}" / "data"
        data.mkdir(parents=True)
        (data / "meta.properties").write_text(f"cluster.id={cluster}\nnode.id={index}\nversion=1\n")


def test_a_kept_cluster_starts_again_with_its_own_cluster_id(tmp_path: Path) -> None:
    _kept_nodes(tmp_path, 3, "kept-cluster-id-0001")
    cluster = KafkaCluster(3, log_dir=tmp_path)
    assert {node.cluster_id for node in cluster.nodes} == {"kept-cluster-id-0001"}


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ("2", "holds a cluster of 3 nodes: start it with --nodes 3"),
        ("4", "holds a cluster of 3 nodes: start it with --nodes 3"),
        ("1", "holds a cluster's nodes: start it with --nodes"),
    ],
)
def test_cli_broker_on_a_kept_cluster_with_another_node_count_is_one_line(
    tmp_path: Path, nodes: str, message: str
) -> None:
    """A node added would be formatted into a cluster of its own, a node left out would
    leave the quorum a voter short: neither starts."""
    _kept_nodes(tmp_path, 3, "kept-cluster-id-0001")
    result = run_cli("broker", "--nodes", nodes, "--log-dir", str(tmp_path), timeout_s=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"slackwater broker: {tmp_path} {message}"]
    assert not (tmp_path / "node-4").exists() and not (tmp_path / "data").exists()
