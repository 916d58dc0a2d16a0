"""``slackwater broker``: Apache Kafka (one KRaft node) in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from slackwater.cli import Commands
from slackwater.cli_types import port
from slackwater.kafka_broker import BrokerError, KafkaBroker
from slackwater.lifecycle import Stop, raise_stop


def add_broker_command(commands: Commands, name: str) -> None:
    broker = commands.add_parser(
        name, help="run Apache Kafka (one KRaft node) on a loopback port in the foreground"
    )
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument("--port", type=port, default=9092, help="listen port (default 9092)")
    broker.add_argument(
        "--log-dir",
        metavar="DIR",
        help="keep the broker's data here and reuse it on the next start "
        "(default: a temporary directory, removed on stop)",
    )
    broker.set_defaults(run=run_broker)


def run_broker(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, raise_stop)
    try:
        broker = KafkaBroker(
            host=args.host,
            port=args.port,
            log_dir=Path(args.log_dir) if args.log_dir else None,
        )
    except BrokerError as error:
        print(f"slackwater broker: {error}", file=sys.stderr)
        return 2
    try:
        broker.start()
        print(
            f"Apache Kafka (KRaft) listening; bootstrap servers: {broker.bootstrap_servers}; "
            f"log: {broker.server_log}",
            flush=True,
        )
        code = broker.wait()
        print(f"broker exited with code {code}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Stop):
        print("stopping broker", file=sys.stderr, flush=True)
        return 0
    except BrokerError as error:
        print(f"slackwater broker: {error}", file=sys.stderr)
        return 1
    finally:
        broker.stop()
        signal.signal(signal.SIGTERM, previous)
