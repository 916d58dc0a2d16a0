"""Every bad flag of every subcommand: one line naming the flag, a non-zero exit, and no
traceback (issue 13). Nothing here needs a broker (the flags fail before any connects)
but the last test: only a broker can say a topic does not exist."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from slackwater.kafka_broker import KafkaBroker
from tests.harness.factories import run_cli

NOWHERE = "127.0.0.1:1"  # nothing listens: a flag check must not get that far
CONTROL = ["--bootstrap-servers", NOWHERE, "--control-topic", "c"]
EMIT = ["emit", "--bootstrap-servers", NOWHERE, "--topic", "t", "--control-topic", "c"]
CONSUME = ["consume", "--bootstrap-servers", NOWHERE, "--topic", "t", "--control-topic", "c"]

CASES = [
    (["broker", "--port", "70000"], "--port", "70000 is not a port"),
    (["broker", "--port", "http"], "--port", "not a port number"),
    ([*EMIT, "--log-level", "bogus"], "--log-level", "unknown log level 'bogus'"),
    ([*EMIT, "--metrics-port", "0"], "--metrics-port", "0 is not a port"),
    ([*EMIT, "--idle-timeout=-5s"], "--idle-timeout", "not a duration"),
    ([*EMIT, "--poll-interval", "0ms"], "--poll-interval", "longer than zero"),
    ([*EMIT, "--topic", "bad topic!"], "--topic", "not a Kafka topic name"),
    (["finish", *CONTROL, "--topic", "t", "--partition", "0", "--timeout", "-1"], "--timeout",
     "positive number of seconds"),
    (["finish", *CONTROL, "--topic", "t/x", "--partition", "0"], "--topic", "not a Kafka"),
    (["status", *CONTROL, "--timeout", "nan"], "--timeout", "positive number of seconds"),
    (["status", "--bootstrap-servers", NOWHERE, "--control-topic", ".."], "--control-topic",
     "not a Kafka topic name"),
    ([*CONSUME, "--window", "0s"], "--window", "longer than zero"),
    ([*CONSUME, "--trigger", "soon"], "--trigger", "not a duration"),
    ([*CONSUME, "--log-level", "loud"], "--log-level", "unknown log level"),
    ([*CONSUME, "--metrics-port", "99999"], "--metrics-port", "not a port"),
    ([*CONSUME, "--fail-on-data-loss", "maybe"], "--fail-on-data-loss", "invalid choice"),
    (["demo", "--duration", "abc"], "--duration", "not a duration"),
    (["demo-producer", "--bootstrap-servers", NOWHERE, "--duration", "abc"], "--duration",
     "not a duration"),
    (["demo-producer", "--bootstrap-servers", NOWHERE, "--topic", "a b"], "--topic",
     "not a Kafka topic name"),
]  # fmt: skip


def _run(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return run_cli(*arguments)


@pytest.mark.parametrize(("arguments", "flag", "message"), CASES, ids=lambda v: str(v)[:40])
def test_bad_flag_is_one_line_naming_it(arguments: list[str], flag: str, message: str) -> None:
    result = _run(arguments)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"argument {flag}" in last and message in last, last
    assert "Traceback" not in result.stderr


@pytest.fixture
def file_path(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


@pytest.mark.parametrize("flag", ["--output", "--checkpoint", "--late-output"])
def test_consume_path_that_is_a_file_is_one_line(flag: str, file_path: Path) -> None:
    result = _run([*CONSUME, flag, str(file_path)])
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert f"argument {flag}" in last and "is a file, not a directory" in last
    assert "Traceback" not in result.stderr and "java" not in result.stderr.lower()


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_emit_with_its_metrics_port_in_use_names_the_port(taken_port: int) -> None:
    result = _run([*EMIT, "--metrics-host", "127.0.0.1", "--metrics-port", str(taken_port)])
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"127.0.0.1:{taken_port}" in result.stderr and "metrics port" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_producer_to_a_topic_that_does_not_exist_is_one_line(broker: KafkaBroker) -> None:
    done = run_cli(
        "demo-producer",
        *("--bootstrap-servers", broker.bootstrap_servers),
        *("--topic", "no-such-topic-here", "--duration", "5s"),
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"slackwater demo-producer: topic 'no-such-topic-here' does not exist on "
        f"{broker.bootstrap_servers}: create it first"
    ]
