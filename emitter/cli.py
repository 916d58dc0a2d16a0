"""The ``slackwater`` command: one entry point, one sub-command per job."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from emitter.cli_types import directory, duration, port, topic_name
from emitter.commands import (
    add_control_arguments,
    add_emit_arguments,
    run_emit,
    run_finish,
    run_status,
)
from emitter.jars import MissingJarsError
from emitter.kafka_broker import BrokerError, KafkaBroker


class _Stop(Exception):
    """Raised by the SIGTERM handler so that cleanup runs as on Ctrl-C."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def _run_broker(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _raise_stop)
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
    except (KeyboardInterrupt, _Stop):
        print("stopping broker", file=sys.stderr, flush=True)
        return 0
    except BrokerError as error:
        print(f"slackwater broker: {error}", file=sys.stderr)
        return 1
    finally:
        broker.stop()
        signal.signal(signal.SIGTERM, previous)


def _run_demo(args: argparse.Namespace) -> int:
    from emitter.settings import parse_duration_ms
    from spark_consumer.java_check import check_java
    from spark_consumer.live_demo import run_live_demo

    try:
        duration_s = parse_duration_ms(args.duration) / 1000
    except ValueError as error:
        print(f"slackwater demo: invalid config field 'duration': {error}", file=sys.stderr)
        return 2
    problem = check_java()
    if problem is not None:
        print(f"slackwater demo: {problem}", file=sys.stderr)
        return 1
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        return run_live_demo(
            duration_s, Path(args.output) if args.output else None, compare=args.compare
        )
    except (KeyboardInterrupt, _Stop):
        print("demo interrupted", file=sys.stderr)
        return 130
    except (BrokerError, MissingJarsError) as error:
        print(f"slackwater demo: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_demo_producer(args: argparse.Namespace) -> int:
    from emitter.lifecycle import stop_on_signals
    from emitter.settings import parse_duration_ms
    from spark_consumer.live_demo import DemoState, produce_script

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
    from confluent_kafka.admin import AdminClient

    from emitter.kafka_logging import client_logging

    admin = AdminClient({**client_logging("demo-producer"), "bootstrap.servers": bootstrap_servers})
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slackwater",
        description="Keep event time moving when Kafka partitions go quiet or end for good.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = commands.add_parser(
        "broker", help="run Apache Kafka (one KRaft node) on a loopback port in the foreground"
    )
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument("--port", type=port, default=9092, help="listen port (default 9092)")
    broker.add_argument(
        "--log-dir",
        metavar="DIR",
        help="keep the broker's data here and reuse it on the next start "
        "(default: a temporary directory, removed on stop)",
    )
    broker.set_defaults(run=_run_broker)

    emit = commands.add_parser(
        "emit", help="watch partitions and publish IDLE/ACTIVE/FINISHED markers (sidecar)"
    )
    add_emit_arguments(emit)
    emit.set_defaults(run=run_emit)

    finish = commands.add_parser(
        "finish", help="declare a partition finished for ever (the emitter publishes FINISHED)"
    )
    add_control_arguments(finish)
    finish.add_argument("--topic", required=True, type=topic_name)
    finish.add_argument("--partition", type=int, required=True)
    finish.set_defaults(run=run_finish)

    status = commands.add_parser(
        "status", help="print each partition's last marker from the control topic"
    )
    add_control_arguments(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=run_status)

    consume = commands.add_parser(
        "consume", help="the Spark consumer: data + control topics into event-time windows"
    )
    from spark_consumer.command import add_consume_arguments, run_consume

    add_consume_arguments(consume)
    consume.set_defaults(run=run_consume)

    demo = commands.add_parser(
        "demo", help="the main job on a local Apache Kafka: producer, emitter, Spark consumer"
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
    demo.set_defaults(run=_run_demo)

    producer = commands.add_parser(
        "demo-producer", help="the demo's scripted producer against any Kafka (Docker Compose)"
    )
    producer.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    producer.add_argument("--topic", type=topic_name, default="demo-events")
    producer.add_argument("--control-topic", type=topic_name, default="demo-control")
    producer.add_argument("--duration", type=duration, default="10m")
    producer.set_defaults(run=_run_demo_producer)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
