"""Argument types for the ``slackwater`` command: every flag checked before anything
starts, so a bad value is one argparse line naming the flag, and exit code 2."""

from __future__ import annotations

import argparse
import re
import socket
from pathlib import Path

from slackwater.markers import TOPIC_NAME_PATTERN
from slackwater.settings import parse_duration_ms

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# Kafka's rule: 1-249 characters of ASCII letters, digits, '.', '_' and '-', not '.'/'..'.
_TOPIC = re.compile(TOPIC_NAME_PATTERN)


def port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is not a port (1 to 65535)")
    return number


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {value}")
    return seconds


def duration(value: str) -> str:
    """A positive duration like 500ms, 30s or 5m (kept as text; parsed where it is used)."""
    try:
        milliseconds = parse_duration_ms(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if milliseconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero, got {value!r}")
    return value


def log_level(value: str) -> str:
    level = value.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {value!r} (one of {', '.join(LOG_LEVELS)})"
        )
    return level


def topic_name(value: str) -> str:
    if not _TOPIC.fullmatch(value) or value in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -)"
        )
    return value


def directory(value: str) -> str:
    """A directory, or a path where one can be made: never an existing file. Other
    schemes (s3a://, hdfs://) are Spark's to check."""
    if "://" not in value and Path(value).exists() and not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file, not a directory")
    return value


def ensure_port_free(host: str, number: int) -> str | None:
    """None if ``host:number`` can be listened on now, else the one-line reason."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, number))
        except OSError as error:
            return f"cannot listen on {host}:{number}: {error.strerror or error}"
    return None


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """The Kafka client settings every command that talks to Kafka takes (KafkaSettings)."""
    parser.add_argument(
        "--kafka-config",
        action="append",
        metavar="KEY=VALUE",
        help="librdkafka setting, e.g. security.protocol=SASL_SSL (repeat); over the file's",
    )
    parser.add_argument(
        "--kafka-config-file",
        metavar="PATH",
        help="librdkafka settings in a Java-style properties file (passwords: not in flags)",
    )
