"""librdkafka's lines through Python logging: one line per kind per 30 s, and the
long-running commands against a broker they cannot reach."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from slackwater.kafka_broker import free_port
from slackwater.kafka_logging import (
    OncePerInterval,
    authentication_problem,
    client_logging,
    settings_problem,
    take_authentication_failure,
)
from tests.harness.factories import SLACKWATER, ResettingEndpoint, wait_until


def _record(message: str, name: str = "t", level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (), None)


def test_a_kind_passes_once_per_interval_and_then_says_how_many_were_held() -> None:
    clock = [0.0]
    only = OncePerInterval(interval_s=30.0, clock=lambda: clock[0])
    assert only.filter(_record("Connect to 127.0.0.1:1 failed (after 0ms)"))
    for ms in range(1, 6):
        clock[0] += 1.0
        assert not only.filter(_record(f"Connect to 127.0.0.1:1 failed (after {ms}ms)"))
    clock[0] = 30.0
    later = _record("Connect to 127.0.0.1:1 failed (after 9ms)")
    assert only.filter(later)
    assert later.getMessage().endswith("(and 5 more like it in 30s)")
    clock[0] = 31.0
    assert not only.filter(_record("Connect to 127.0.0.1:1 failed (after 1ms)"))


def test_other_kinds_and_other_loggers_pass_on_their_own() -> None:
    clock = [0.0]
    only = OncePerInterval(interval_s=30.0, clock=lambda: clock[0])
    assert only.filter(_record("1/1 brokers are down"))
    assert only.filter(_record("topic t deleted"))
    assert only.filter(_record("1/1 brokers are down", name="other"))
    assert not only.filter(_record("2/2 brokers are down"))


def test_librdkafka_connection_lines_are_left_to_the_error_callback_unless_debugging() -> None:
    logger = client_logging("test-client")["logger"]
    fail = _record("FAIL [rdkafka#producer-1] Connect failed", name=logger.name)
    fail.levelno = logging.ERROR
    logger.setLevel(logging.INFO)
    assert not logger.filter(fail)
    logger.setLevel(logging.DEBUG)
    assert logger.filter(fail)


# librdkafka reports each failed connection (about 15 a second here); the commands
# must say so in a few lines however many there were.
FAILED_CONNECTIONS = 100


# librdkafka's words, as its error callback reports them.
REFUSED_SASL = (
    "sasl_plaintext://127.0.0.1:9092/bootstrap: SASL authentication error: Authentication "
    "failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
)
CUT_SASL = "sasl_plaintext://127.0.0.1:9092/1: SASL authentication error: Local: Timed out"
UNVERIFIED = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
    "routines::certificate verify failed: broker certificate could not be verified"
)
CUT_TLS = "sasl_ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: Disconnected"
# A broker with ssl.client.auth=required refusing the client's certificate (none, or one
# it does not trust), under TLS 1.3: a failed receive after the client's handshake.
NO_CERTIFICATE = (
    "ssl://127.0.0.1:9094/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls "
    "alert bad certificate: SSL alert number 42 (after 4ms in state APIVERSION_QUERY)"
)
UNTRUSTED_CERTIFICATE = (
    "ssl://127.0.0.1:9094/bootstrap: Receive failed: error:0A000416:SSL routines::ssl/tls "
    "alert certificate unknown: SSL alert number 46 (after 10ms in state APIVERSION_QUERY)"
)
NOT_VERIFIED = "TLS handshake failed: the broker's certificate was not verified"
REFUSED_CERTIFICATE = "TLS handshake failed: the broker refused this client's certificate"


@pytest.mark.parametrize(
    ("code", "words", "line"),
    [
        (
            KafkaError._AUTHENTICATION,
            REFUSED_SASL,
            "authentication failed as 'ops': " + REFUSED_SASL,
        ),
        (KafkaError._AUTHENTICATION, CUT_SASL, None),
        # The client's own token provider failed (its identity provider down): librdkafka
        # keeps the token it has and tries again, so this is an outage, not a refusal.
        (
            KafkaError._AUTHENTICATION,
            "Failed to acquire SASL OAUTHBEARER token: identity provider unreachable",
            None,
        ),
        (
            KafkaError._SSL,
            UNVERIFIED,
            f"{NOT_VERIFIED} (no ssl.ca.location: the system's CAs): {UNVERIFIED}",
        ),
        (KafkaError._SSL, CUT_TLS, None),
        (KafkaError._TRANSPORT, "sasl_plaintext://127.0.0.1:9092/1: Disconnected", None),
        (
            KafkaError._TRANSPORT,
            NO_CERTIFICATE,
            f"{REFUSED_CERTIFICATE} (none given: no ssl.keystore.location or "
            f"ssl.certificate.location): {NO_CERTIFICATE}",
        ),
    ],
)
def test_only_refused_credentials_or_an_unverified_certificate_are_recorded_as_failures(
    code: int, words: str, line: str | None
) -> None:
    """A refusal no retry mends is what ends a command or a query; the same codes with a
    connection cut short in their words are an outage, waited out."""
    client = f"test-{code}-{len(words)}"
    client_logging(client)["error_cb"](KafkaError(code, words))
    failure = take_authentication_failure(client)
    if line is None:
        assert failure is None
    else:
        assert failure is not None
        assert authentication_problem(failure, {"sasl.username": "ops"}) == line
    assert take_authentication_failure(client) is None  # taken once


def test_a_certificate_problem_names_the_files_never_a_secret() -> None:
    """Issue 31, finding 8: which CA the client trusted, which certificate the broker
    refused (paths, never a password or a PEM's text)."""
    settings = {
        "ssl.ca.location": "/etc/kafka/ca.pem",
        "ssl.keystore.location": "/etc/kafka/job.p12",
        "ssl.keystore.password": "keystore-secret",
    }
    unverified = authentication_problem(KafkaError(KafkaError._SSL, UNVERIFIED), settings)
    assert unverified == f"{NOT_VERIFIED} (ssl.ca.location=/etc/kafka/ca.pem): {UNVERIFIED}"
    refused = KafkaError(KafkaError._TRANSPORT, UNTRUSTED_CERTIFICATE)
    assert authentication_problem(refused, settings) == (
        f"{REFUSED_CERTIFICATE} (ssl.keystore.location=/etc/kafka/job.p12): {UNTRUSTED_CERTIFICATE}"
    )
    inline = {"ssl.certificate.pem": "-----BEGIN CERTIFICATE-----"}
    assert "(ssl.certificate.pem (inline)): " in authentication_problem(refused, inline)
    assert "BEGIN" not in authentication_problem(refused, inline)


def test_a_client_not_made_names_the_files_missing_here(tmp_path: Path) -> None:
    """librdkafka's words name the setting, not its file: the line says which is missing
    on this machine (a CA file the executors lack), and never a secret."""
    there = tmp_path / "job.p12"
    there.write_bytes(b"")
    missing = tmp_path / "ca.pem"
    words = (
        "Failed to create consumer: ssl.ca.location failed: "
        "error:05880020:x509 certificate routines::BIO lib"
    )
    settings = {
        "ssl.ca.location": str(missing),
        "ssl.keystore.location": str(there),
        "ssl.keystore.password": "keystore-secret",
    }
    line = settings_problem(KafkaError(KafkaError._INVALID_ARG, words), settings)
    assert (
        line == f"invalid Kafka settings: {words} (ssl.ca.location={missing} does not exist here)"
    )


def test_instances_of_a_client_keep_their_failures_apart_and_share_one_logger() -> None:
    """A planner per query start: its own failures, but not a logger of its own, which
    Python would keep for the process's life."""
    first, second = "test-planner#1", "test-planner#2"
    first_logging, second_logging = client_logging(first), client_logging(second)
    assert first_logging["logger"] is second_logging["logger"]
    assert first_logging["logger"].name == "slackwater.librdkafka.test-planner"
    first_logging["error_cb"](KafkaError(KafkaError._AUTHENTICATION, REFUSED_SASL))
    assert take_authentication_failure(second) is None
    assert take_authentication_failure(first) is not None


@pytest.mark.parametrize(
    "arguments",
    [
        ["emit", "--topic", "t", "--control-topic", "c"],
        ["demo-producer", "--duration", "60s"],
    ],
    ids=["emit", "demo-producer"],
)
def test_an_unreachable_broker_is_a_few_clear_lines_and_sigterm_exits_0(
    arguments: list[str], tmp_path: Path
) -> None:
    if arguments[0] == "emit":
        arguments = [*arguments, "--metrics-port", str(free_port())]
    log = tmp_path / "out.log"
    with ResettingEndpoint() as broker, log.open("wb") as out:
        process = subprocess.Popen(
            [*SLACKWATER, *arguments, "--bootstrap-servers", broker.address],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            wait_until(
                lambda: broker.resets >= FAILED_CONNECTIONS or process.poll() is not None,
                120,
                f"{FAILED_CONNECTIONS} failed connections",
            )
            assert process.poll() is None, log.read_text()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log.read_text()
    assert code == 0, text
    lines = text.splitlines()
    assert "Traceback" not in text
    assert 1 <= len(lines) <= 6, text
    assert any(broker.address in line or "transport" in line.lower() for line in lines), text
    assert any(line.endswith("SIGTERM: stopping") for line in lines), text
