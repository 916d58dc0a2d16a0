"""``slackwater broker``: Apache Kafka (one KRaft node, or a cluster of ``--nodes``) in the
foreground."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from slackwater.cli import Commands
from slackwater.cli_types import port, positive_int
from slackwater.kafka_broker import BrokerError, KafkaBroker
from slackwater.kafka_cluster import KafkaCluster
from slackwater.lifecycle import Stop, raise_stop


def add_broker_command(commands: Commands, name: str) -> None:
    broker = commands.add_parser(
        name, help="run Apache Kafka (KRaft) on loopback ports in the foreground"
    )
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument(
        "--port",
        type=port,
        default=9092,
        help="listen port (default 9092); with --nodes N, node k listens on port + k - 1",
    )
    broker.add_argument(
        "--nodes",
        type=positive_int,
        default=1,
        help="KRaft nodes (broker and controller each) in one cluster (default 1); from 3 "
        "on, topics get 3 replicas and acks=all needs 2 in sync",
    )
    broker.add_argument(
        "--log-dir",
        metavar="DIR",
        help="keep the data here (a node-K directory per node with --nodes) and reuse it "
        "on the next start (default: temporary directories, removed on stop)",
    )
    broker.set_defaults(run=run_broker)


def _say_node_lost(cluster: KafkaCluster) -> Callable[[KafkaBroker, int, int], None]:
    """One line per node lost while the others keep a quorum and serve on."""

    def say(node: KafkaBroker, code: int, running: int) -> None:
        print(
            f"slackwater broker: node {node.node_id} exited with code {code}; "
            f"{running} of {len(cluster.nodes)} nodes serve on (a quorum needs "
            f"{cluster.majority})",
            file=sys.stderr,
            flush=True,
        )

    return say


def run_broker(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, raise_stop)
    log_dir = Path(args.log_dir) if args.log_dir else None
    broker: KafkaBroker | KafkaCluster
    try:
        if args.nodes == 1:
            if log_dir is not None and any(log_dir.glob("node-*/data/meta.properties")):
                raise BrokerError(f"{log_dir} holds a cluster's nodes: start it with --nodes")
            broker = KafkaBroker(host=args.host, port=args.port, log_dir=log_dir)
        else:
            broker = KafkaCluster(args.nodes, host=args.host, first_port=args.port, log_dir=log_dir)
    except BrokerError as error:
        signal.signal(signal.SIGTERM, previous)
        print(f"slackwater broker: {error}", file=sys.stderr)
        return 2
    try:
        broker.start()
        logs = (
            str(broker.server_log)
            if isinstance(broker, KafkaBroker)
            else ", ".join(str(log) for log in broker.server_logs)
        )
        print(
            f"Apache Kafka (KRaft) listening; bootstrap servers: {broker.bootstrap_servers}; "
            f"log: {logs}",
            flush=True,
        )
        if isinstance(broker, KafkaBroker):
            code = broker.wait()
            print(f"slackwater broker: the broker exited with code {code}", file=sys.stderr)
            return 1
        node, code = broker.wait(_say_node_lost(broker))
        running = sum(other.running for other in broker.nodes)
        print(
            f"slackwater broker: node {node.node_id} exited with code {code}; {running} of "
            f"{len(broker.nodes)} nodes left, no quorum (it needs {broker.majority}): stopping",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except (KeyboardInterrupt, Stop):
        print("stopping broker", file=sys.stderr, flush=True)
        return 0
    except BrokerError as error:
        print(f"slackwater broker: {error}", file=sys.stderr)
        return 1
    finally:
        # A second Ctrl-C or SIGTERM must not cut the stop short (nodes left running,
        # directories left behind): ignored until every node has stopped.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            broker.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
