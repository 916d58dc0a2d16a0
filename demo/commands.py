"""``slackwater demo`` and ``slackwater demo-producer``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from slackwater import kafka_clients
from slackwater.cli import Commands
from slackwater.cli_types import directory, duration, topic_name
from slackwater.jars import MissingJarsError
from slackwater.kafka_broker import BrokerError
from slackwater.lifecycle import Stop, raise_stop, stop_on_signals
from slackwater.settings import parse_duration_ms


def add_demo_command(commands: Commands, name: str) -> None:
    demo = commands.add_parser(
        name, help="the main job on a local Apache Kafka: producer, emitter, Spark consumer"
    )
    demo.add_argument(
        "--duration", type=duration, default="90s", help="how long to produce (default 90s)"
    )
    demo.add_argument(
        "--output", type=directory, metavar="DIR", help="where windows go (default: a temp dir)"
    )
    demo.add_argument(
        "--compare",
        action="store_true",
        help="also run plain Spark watermarks on the same input, side by side",
    )
    demo.set_defaults(run=run_demo)


def add_producer_command(commands: Commands, name: str) -> None:
    producer = commands.add_parser(
        name, help="the demo's scripted producer against any Kafka (Docker Compose)"
    )
    producer.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    producer.add_argument("--topic", type=topic_name, default="demo-events")
    producer.add_argument("--control-topic", type=topic_name, default="demo-control")
    producer.add_argument("--duration", type=duration, default="10m")
    producer.set_defaults(run=run_demo_producer)


def run_demo(args: argparse.Namespace) -> int:
    from demo.live_demo import run_live_demo
    from slackwater.java_check import check_java

    duration_s = parse_duration_ms(args.duration) / 1000
    problem = check_java()
    if problem is not None:
        print(f"slackwater demo: {problem}", file=sys.stderr)
        return 1
    previous = signal.signal(signal.SIGTERM, raise_stop)
    try:
        return run_live_demo(
            duration_s, Path(args.output) if args.output else None, compare=args.compare
        )
    except (KeyboardInterrupt, Stop):
        print("demo interrupted", file=sys.stderr)
        return 130
    except (BrokerError, MissingJarsError) as error:
        print(f"slackwater demo: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_demo_producer(args: argparse.Namespace) -> int:
    from demo.live_demo import DemoState
    from demo.producer_script import produce_script

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = stop_on_signals("demo-producer")  # the script checks it between records
    missing = _missing_topic(args.bootstrap_servers, args.topic, stop)
    if stop.is_set():
        return 0
    if missing:
        print(f"slackwater demo-producer: {missing}", file=sys.stderr)
        return 1
    print(f"producing to {args.topic} for {args.duration}", flush=True)
    produce_script(
        args.bootstrap_servers,
        parse_duration_ms(args.duration) / 1000,
        DemoState(),
        stop,
        topic=args.topic,
        control_topic=args.control_topic,
    )
    return 0


def _missing_topic(bootstrap_servers: str, topic: str, stop: threading.Event) -> str | None:
    """Why the topic cannot be produced to, once the broker answers (None: it exists, or
    a stop came first). While the broker cannot be reached, keeps asking."""
    from confluent_kafka import KafkaException

    admin = kafka_clients.admin_client("demo-producer", bootstrap_servers)
    while not stop.is_set():
        try:
            metadata = admin.list_topics(timeout=2)
        except KafkaException:
            admin.poll(0)  # the client's error line says why, once per 30 s
            continue
        if topic not in metadata.topics:
            return f"topic {topic!r} does not exist on {bootstrap_servers}: create it first"
        return None
    return None
