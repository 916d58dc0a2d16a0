"""``slackwater emit``, ``finish`` and ``status``: argument parsing and output only."""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
import time
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from emitter.config import ControlConfig, EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    ReadBack,
    last_marker_per_partition,
)
from slackwater import kafka_clients, kafka_logging
from slackwater.cli import Commands
from slackwater.cli_types import (
    add_kafka_arguments,
    duration,
    ensure_port_free,
    log_level,
    port,
    positive_seconds,
    topic_name,
)
from slackwater.lifecycle import stop_on_signals
from slackwater.markers import EpochClaim, FinishRequest, Marker, MarkerStatus
from slackwater.settings import EXIT_CONFIG, ConfigError, config_from_args, load_config


def add_emit_command(commands: Commands, name: str) -> None:
    emit = commands.add_parser(
        name, help="watch partitions and publish IDLE/ACTIVE/FINISHED markers (sidecar)"
    )
    add_emit_arguments(emit)
    emit.set_defaults(run=run_emit)


def add_finish_command(commands: Commands, name: str) -> None:
    finish = commands.add_parser(
        name, help="declare a partition finished for ever (the emitter publishes FINISHED)"
    )
    add_control_arguments(finish)
    finish.add_argument("--topic", required=True, type=topic_name)
    finish.add_argument("--partition", type=int, required=True)
    finish.set_defaults(run=run_finish)


def add_status_command(commands: Commands, name: str) -> None:
    status = commands.add_parser(
        name, help="print each partition's last marker from the control topic"
    )
    add_control_arguments(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=run_status)


def add_emit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", help="settings file (YAML)")
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT")
    parser.add_argument(
        "--topic",
        dest="topics",
        action="append",
        type=topic_name,
        metavar="T",
        help="a data topic to watch (repeat for more)",
    )
    parser.add_argument("--control-topic", type=topic_name, metavar="C")
    parser.add_argument("--group", metavar="G", help="consumer group whose lag to watch")
    parser.add_argument(
        "--idle-timeout",
        dest="idle_timeout_ms",
        type=duration,
        metavar="30s",
        help="log end still this long -> IDLE (default 30s)",
    )
    parser.add_argument("--poll-interval", dest="poll_interval_ms", type=duration, metavar="1s")
    parser.add_argument(
        "--metadata-interval",
        dest="metadata_interval_ms",
        type=duration,
        metavar="10s",
        help="how often to re-read topic metadata (default 10s)",
    )
    parser.add_argument("--metrics-host")
    parser.add_argument("--metrics-port", type=port)
    parser.add_argument(
        "--metrics-per-partition",
        choices=["true", "false"],
        help="per-partition series on /metrics (default true; false: per-topic aggregates)",
    )
    add_kafka_arguments(parser)
    parser.add_argument("--emitter-id", help="identity in markers (default host-random)")
    parser.add_argument("--log-level", type=log_level, default="INFO")


def add_control_arguments(parser: argparse.ArgumentParser) -> None:
    """``finish``'s and ``status``'s settings (ControlConfig): these flags, or
    SLACKWATER_BOOTSTRAP_SERVERS, SLACKWATER_CONTROL_TOPIC, SLACKWATER_KAFKA_CONFIG[_FILE]."""
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT")
    parser.add_argument("--control-topic", type=topic_name, metavar="C")
    add_kafka_arguments(parser)
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, metavar="SECONDS")


def run_emit(args: argparse.Namespace) -> int:
    from emitter.service import Emitter

    try:
        config = config_from_args(EmitterConfig, args)
    except ConfigError as error:
        print(f"slackwater emit: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if config.metrics_port:
        problem = ensure_port_free(config.metrics_host, config.metrics_port)
        if problem is not None:
            print(f"slackwater emit: metrics port: {problem}", file=sys.stderr)
            return 1
    stop = stop_on_signals("emitter")
    try:
        emitter = Emitter(config)
    except KafkaException as error:
        line = kafka_logging.redact(str(error), config.kafka_config)
        print(f"slackwater emit: invalid Kafka settings: {line}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as error:
        print(f"slackwater emit: cannot serve metrics: {error}", file=sys.stderr)
        return 1
    return emitter.run(stop)


def _control_config(args: argparse.Namespace) -> ControlConfig | None:
    """``finish``'s and ``status``'s settings, or None after one line saying why not. From
    here on librdkafka's own lines are left out: the command's one line names a failure."""
    kafka_logging.leave_out_client_lines()
    given = {
        "bootstrap_servers": args.bootstrap_servers,
        "control_topic": args.control_topic,
        "kafka_config": args.kafka_config,
        "kafka_config_file": args.kafka_config_file,
    }
    try:
        return load_config(ControlConfig, given)
    except ConfigError as error:
        print(f"slackwater {args.command}: {error}", file=sys.stderr)
        return None


def _say(args: argparse.Namespace, config: ControlConfig, problem: object) -> None:
    """The command's one line on stderr, through the one filter of librdkafka's texts
    (kafka_logging.redact): no secret setting's value, whatever the client echoed."""
    line = kafka_logging.redact(f"slackwater {args.command}: {problem}", config.kafka_config)
    print(line, file=sys.stderr)


def _refused_settings(error: KafkaException) -> bool:
    """Whether librdkafka would not make a client of these settings."""
    return bool(error.args) and error.args[0].code() == KafkaError._INVALID_ARG


def _settings_problem(error: KafkaException) -> str:
    """A client librdkafka would not make: a setting it does not know, or cannot read."""
    return f"invalid Kafka settings: {_words(error)}"


def _broker_problem(error: Exception, kafka: dict[str, str], client: Any = None) -> str:
    """Why a request failed, in one line: a failed authentication by name (librdkafka
    reports a request after one as a transport failure, and tells the client's error
    callback, served by its poll), else the error with the last one a client reported
    (a refused connection, an unknown host: librdkafka's lines are not printed). The
    client's words pass kafka_logging.redact: librdkafka quotes settings it was given
    ("Unrecognized sasl.oauthbearer.config beginning at: ...")."""
    if client is not None:
        client.poll(0)
    failure = kafka_logging.authentication_failure()
    if failure is not None:
        return kafka_logging.authentication_problem(failure, kafka)
    said = _words(error)
    last = kafka_logging.last_error()
    return kafka_logging.redact(said if last is None else f"{said} (last: {last.str()})", kafka)


def _words(error: Exception) -> str:
    """librdkafka's words for a KafkaException (not its KafkaError{code=...} dump)."""
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return str(error.args[0].str())
    return str(error)


def run_finish(args: argparse.Namespace) -> int:
    config = _control_config(args)
    if config is None:
        return EXIT_CONFIG
    if args.partition < 0:
        _say(args, config, "invalid config field 'partition': must be >= 0")
        return EXIT_CONFIG
    kafka = config.kafka_config
    try:
        admin = kafka_clients.admin_client("finish", config.bootstrap_servers, kafka)
    except KafkaException as error:
        _say(args, config, _settings_problem(error))
        return EXIT_CONFIG
    problem = _finish_target_problem(args, config, admin)
    if problem is not None:
        _say(args, config, problem)
        return 1
    request = FinishRequest(
        topic=args.topic,
        partition=args.partition,
        requested_at=time.time_ns() // 1_000_000,
        requested_by=f"{getpass.getuser()}@{socket.gethostname()}",
    )
    writer = ControlTopicWriter(config.bootstrap_servers, config.control_topic, kafka, args.timeout)
    try:
        writer.write(request)
    except ControlTopicError as error:
        _say(args, config, error)
        return 1
    finally:
        writer.close()
    print(
        f"finish requested for {args.topic}:{args.partition}; the emitter will publish "
        "FINISHED at the partition's log end"
    )
    return 0


def _finish_target_problem(
    args: argparse.Namespace, config: ControlConfig, admin: Any
) -> str | None:
    """None if the control topic and the partition to finish exist, else why not."""
    try:
        topics = admin.list_topics(timeout=args.timeout).topics
    except KafkaException as error:
        problem = _broker_problem(error, config.kafka_config, admin)
        return problem if problem.startswith("authentication") else f"broker unreachable: {problem}"
    if config.control_topic not in topics:
        return f"control topic {config.control_topic!r} does not exist (start the emitter first)"
    data = topics.get(args.topic)
    if data is None or args.partition not in data.partitions:
        return f"no partition {args.topic}:{args.partition} on the broker"
    return None


def run_status(args: argparse.Namespace) -> int:
    config = _control_config(args)
    if config is None:
        return EXIT_CONFIG
    read = _read_control_topic(args, config)
    if isinstance(read, int):
        return read
    rows = status_rows(read)
    emitters = _emitters(read)
    if args.json:
        document = {
            "partitions": rows,
            "malformed_records": read.malformed,
            "tombstones": read.tombstones,
            "skipped": dict(sorted(read.skipped.items())),
            "emitters": {emitter: sorted(epochs) for emitter, epochs in sorted(emitters.items())},
        }
        print(json.dumps(document, indent=2))
    else:
        _print_status(config.control_topic, rows, emitters, read)
    return 0


def _read_control_topic(args: argparse.Namespace, config: ControlConfig) -> ReadBack | int:
    """The whole control topic, or the exit code after one line on stderr saying why not."""
    kafka = config.kafka_config
    try:
        reader = ControlTopicReader(
            config.bootstrap_servers, config.control_topic, kafka, args.timeout
        )
    except (KafkaException, KeyError) as error:
        if isinstance(error, KafkaException) and _refused_settings(error):
            _say(args, config, _settings_problem(error))
            return EXIT_CONFIG
        problem = _broker_problem(error, kafka) if isinstance(error, KafkaException) else error
        if isinstance(error, KafkaException) and isinstance(error.args[0], KafkaError):
            # A topic the principal may not describe: the ACL it lacks, by name.
            action = f"read control topic {config.control_topic}"
            problem = kafka_logging.authorization_problem(error.args[0], action, kafka) or problem
        _say(args, config, f"cannot read control topic {config.control_topic!r}: {problem}")
        return 1
    try:
        return reader.read_to_end()
    except (ControlTopicError, KafkaException) as error:
        _say(args, config, _broker_problem(error, kafka))
        return 1
    finally:
        reader.close()


def status_rows(read: ReadBack) -> list[dict[str, Any]]:
    """One row per partition: its last marker as consumers hold it, then the partitions
    with a finish request and no marker yet."""
    latest = last_marker_per_partition(read.records)
    requested = {(r.topic, r.partition) for r in read.records if isinstance(r, FinishRequest)}
    rows: list[dict[str, Any]] = []
    for (topic, partition), marker in sorted(latest.items()):
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "status": marker.status.value,
                "offset": marker.offset,
                "since": datetime.fromtimestamp(marker.emitted_at / 1000, tz=UTC).isoformat(
                    timespec="seconds"
                ),
                "emitter_id": marker.emitter_id,
                "epoch": marker.epoch,
                "seq": marker.seq,
                "finish_pending": (topic, partition) in requested
                and marker.status is not MarkerStatus.FINISHED,
            }
        )
    for topic, partition in sorted(requested - set(latest)):
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "status": None,
                "offset": None,
                "since": None,
                "emitter_id": None,
                "epoch": None,
                "seq": None,
                "finish_pending": True,
            }
        )
    return rows


def _emitters(read: ReadBack) -> dict[str, set[int]]:
    """Who wrote markers and epoch claims: a writer that should not be there stands out."""
    emitters: dict[str, set[int]] = {}
    for record in read.records:
        if isinstance(record, Marker | EpochClaim):
            emitters.setdefault(record.emitter_id, set()).add(record.epoch)
    return emitters


def _print_status(
    control_topic: str, rows: list[dict[str, Any]], emitters: dict[str, set[int]], read: ReadBack
) -> None:
    if not rows:
        print(f"no markers on {control_topic}")
    for row in rows:
        note = "  (finish requested)" if row["finish_pending"] else ""
        print(
            f"{row['topic']}:{row['partition']:<5} {row['status'] or '-':<8} "
            f"offset={row['offset']} since={row['since']} emitter={row['emitter_id']} "
            f"epoch={row['epoch']}{note}"
        )
    for emitter, epochs in sorted(emitters.items()):
        shown = ", ".join(str(epoch) for epoch in sorted(epochs)[-5:])
        print(f"emitter {emitter}: epochs {shown}")
    if read.skipped:
        reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(read.skipped.items()))
        print(f"skipped {sum(read.skipped.values())} control records ({reasons})")
