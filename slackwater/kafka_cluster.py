"""Apache Kafka as a cluster of KRaft nodes on loopback ports: what `slackwater broker
--nodes 3` and the cluster tests run.

Every node is broker and controller in one JVM (KafkaBroker), with its own ports, log
directory and log file; the controllers form one quorum of all nodes (three voters for
three nodes: a majority survives one lost node). Topics get three replicas and a write
acknowledged by all in-sync replicas needs two (kafka_broker.replication_settings), as
production clusters run. Ready when every node lists every broker and a record can be
written with ``acks=all``. A node can be killed and started again on its log directory,
which is how the tests lose a broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from slackwater.kafka_broker import BrokerError, KafkaBroker, cluster_id, replication_settings

# Written once with acks=all when the cluster starts, then deleted.
_READY_TOPIC = "__slackwater_cluster_ready"
# How long a node may go on shutting down once the quorum has lost its majority (stop).
QUORUMLESS_GRACE_S = 10.0


def _kept_cluster_id(log_dir: Path | None, nodes: int) -> str | None:
    """The cluster id of the nodes kept in ``log_dir`` from an earlier start, if any. A
    kept cluster starts again with its own node count: a node added or left out would
    be formatted into another cluster (or its quorum would lack a voter)."""
    if log_dir is None:
        return None
    if (log_dir / "data" / "meta.properties").exists():
        raise BrokerError(f"{log_dir} holds a single node's data: start it without --nodes")
    kept = sorted(log_dir.glob("node-*/data/meta.properties"))
    if not kept:
        return None
    if len(kept) != nodes:
        raise BrokerError(
            f"{log_dir} holds a cluster of {len(kept)} nodes: start it with --nodes {len(kept)}"
        )
    for line in kept[0].read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


class KafkaCluster:
    """``nodes`` KRaft nodes of one cluster on ``host``."""

    def __init__(
        self,
        nodes: int = 3,
        host: str = "127.0.0.1",
        *,
        first_port: int | None = None,
        log_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        log_level: str = "WARN",
    ) -> None:
        if nodes < 1:
            raise BrokerError(f"invalid node count {nodes}: must be at least 1")
        if first_port is not None and not (first_port > 0 and first_port + nodes - 1 < 65536):
            raise BrokerError(
                f"invalid port {first_port}: {nodes} ports from it must be between 1 and 65535"
            )
        shared = _kept_cluster_id(log_dir, nodes) or cluster_id()
        self.nodes = [
            KafkaBroker(
                host=host,
                port=None if first_port is None else first_port + index,
                log_dir=None if log_dir is None else log_dir / f"node-{index + 1}",
                settings={**replication_settings(nodes), **(settings or {})},
                log_level=log_level,
                node_id=index + 1,
            )
            for index in range(nodes)
        ]
        voters = ",".join(f"{n.node_id}@{host}:{n.controller_port}" for n in self.nodes)
        for node in self.nodes:
            node.quorum_voters = voters
            node.cluster_id = shared
            node.expected_brokers = nodes

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        return self.nodes[node_id - 1]

    def start(self, timeout_s: float = 120.0) -> KafkaCluster:
        """Every node started, then waited for together; stopped again on a failure."""
        try:
            deadline = time.monotonic() + timeout_s
            self.start_nodes([node.node_id for node in self.nodes], timeout_s)
            self._write_with_all_replicas(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def start_nodes(self, node_ids: list[int], timeout_s: float = 120.0) -> None:
        """Nodes started (again, on their log directories) together, then waited for: a
        node waits for a quorum, which the others it starts with may be part of."""
        for node_id in node_ids:
            self.node(node_id).launch()
        deadline = time.monotonic() + timeout_s
        for node_id in node_ids:
            self.node(node_id).wait_until_ready(max(1.0, deadline - time.monotonic()))

    def _write_with_all_replicas(self, timeout_s: float) -> None:
        """A record acknowledged by every in-sync replica: the cluster replicates."""
        from confluent_kafka import KafkaError, KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        settings: dict[str, Any] = {**self.nodes[0].client_settings, "log_level": 0}
        admin = AdminClient({**settings, "bootstrap.servers": self.bootstrap_servers})
        deadline = time.monotonic() + timeout_s
        replicas = min(3, len(self.nodes))
        try:
            admin.create_topics([NewTopic(_READY_TOPIC, 1, replicas)])[_READY_TOPIC].result(
                timeout_s
            )
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a restart on kept data
                raise BrokerError(f"cluster cannot create a topic: {error}") from None
        producer = Producer(
            {
                **settings,
                "bootstrap.servers": self.bootstrap_servers,
                "acks": "all",
                "allow.auto.create.topics": False,  # the topic is deleted right after
                "message.timeout.ms": max(1000, int((deadline - time.monotonic()) * 1000)),
            }
        )
        failures: list[str] = []
        producer.produce(
            _READY_TOPIC,
            b"ready",
            on_delivery=lambda error, _m: failures.append(str(error)) if error else None,
        )
        if producer.flush(max(1.0, deadline - time.monotonic())) != 0 or failures:
            raise BrokerError(
                f"cluster not ready: a write with acks=all failed ({', '.join(failures)})"
            )
        admin.delete_topics([_READY_TOPIC])[_READY_TOPIC].result(timeout_s)

    @property
    def majority(self) -> int:
        """Nodes the controllers' quorum needs: a cluster with fewer cannot serve."""
        return len(self.nodes) // 2 + 1

    def wait(
        self, lost: Callable[[KafkaBroker, int, int], None] | None = None
    ) -> tuple[KafkaBroker, int]:
        """Blocks while the cluster can serve: until fewer than a majority of its nodes
        run (three nodes serve on without one, as a production cluster does). Each node
        lost before then is told to ``lost`` (the node, its exit code, the nodes still
        running); returns the node whose loss ended the quorum, and its exit code."""
        gone: set[int] = set()
        while True:
            for node in self.nodes:
                if node.node_id in gone or node.running:
                    continue
                gone.add(node.node_id)
                code = node.wait()
                running = sum(other.running for other in self.nodes)
                if running < self.majority:
                    return node, code
                if lost is not None:
                    lost(node, code, running)
            time.sleep(0.5)  # (a process's exit is looked for, not waited out)

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM to every node at once (controlled shutdowns while the quorum still has
        its majority), then each waited for; temporary log directories removed.

        A node still running once a majority has exited has no quorum left to grant its
        controlled shutdown, and Kafka waits minutes for that grant (a test teardown took
        61 s, the whole timeout): it gets ``QUORUMLESS_GRACE_S`` more, then SIGKILL, a
        crash its log recovers from at the next start."""
        for node in self.nodes:
            node.terminate()
        majority = self.majority
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            running = sum(node.running for node in self.nodes)
            if running == 0 or len(self.nodes) - running >= majority:
                break
            time.sleep(0.1)
        grace_s = min(QUORUMLESS_GRACE_S, max(0.0, deadline - time.monotonic()))
        for node in self.nodes:
            node.stop(grace_s)

    @property
    def server_logs(self) -> list[Path]:
        return [node.server_log for node in self.nodes]

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
