"""Issue 42, findings 3 and 4, on Apache Kafka.

3. Every secret-bearing librdkafka setting, given in a properties file, goes through
   ``status``, ``finish`` and ``emit`` against a listener where its client fails: the
   value appears nowhere in what they print, log or serve, and the problem is named.
4. The emitter's start-up line says why it cannot start, in the broker's words, as
   ``status`` does: a wrong password, SASL against a plaintext listener, a principal
   without rights on the control topic, a broker certificate not verified.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from emitter.config import EmitterConfig
from emitter.service import Emitter
from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.kafka_logging import OncePerInterval
from tests.harness.factories import SLACKWATER, run_cli, wait_until
from tests.harness.secured import (
    CONTROL,
    DEADLINE_S,
    PASSWORDS,
    Certificates,
    Topics,
    change_acls,
    credentials,
    rights,
    tls_bootstrap,
    tls_credentials,
)

# ------------------------------------------------------------------ finding 3


@dataclass(frozen=True)
class Case:
    """Settings whose client fails against a plaintext listener, the secrets among
    them, and the words every command's output names the problem with."""

    settings: dict[str, str]
    secrets: list[str]
    named: str
    # Other words librdkafka may name the same failure with, as the race falls.
    also: tuple[str, ...] = ()

    def names(self, text: str) -> bool:
        return any(words in text for words in (self.named, *self.also))


def _pem(kind: str, body: str) -> str:
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----\n"


def _cases() -> dict[str, Case]:
    """One case per secret-bearing setting (kafka_logging.SECRET_SETTINGS), each secret
    new to this run."""
    secret = {name: f"{name}-{uuid.uuid4().hex[:12]}" for name in ["pw", "bad", "cs", "kp"]}
    key = f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC{uuid.uuid4().hex}"
    sasl = {"security.protocol": "SASL_PLAINTEXT"}
    oidc = {
        **sasl,
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "slackwater",
        # Nothing listens there: the token is never got, the broker never asked.
        "sasl.oauthbearer.token.endpoint.url": f"http://127.0.0.1:{free_port()}/token",
    }
    return {
        "sasl.password": Case(
            {**sasl, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "ops"}
            | {"sasl.password": secret["pw"]},
            [secret["pw"]],
            "mechanism handshake failed",
        ),
        "sasl.oauthbearer.config": Case(
            {
                **sasl,
                "sasl.mechanism": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": "true",
            }
            | {"sasl.oauthbearer.config": f"principal=ops badkey={secret['bad']}"},
            [secret["bad"]],
            "Unrecognized sasl.oauthbearer.config beginning at: badkey=",
        ),
        "sasl.oauthbearer.client.secret": Case(
            {**oidc, "sasl.oauthbearer.client.secret": secret["cs"]},
            [secret["cs"]],
            "Failed to acquire SASL OAUTHBEARER token",
        ),
        "sasl.oauthbearer.assertion.private.key": Case(
            {
                **oidc,
                "sasl.oauthbearer.grant.type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "sasl.oauthbearer.assertion.private.key.pem": _pem("PRIVATE KEY", key),
                "sasl.oauthbearer.assertion.private.key.passphrase": secret["kp"],
            },
            [key, secret["kp"]],
            "OAUTHBEARER",
        ),
        "ssl.key.password": Case(
            {"security.protocol": "SSL", "ssl.key.password": secret["kp"]},
            [secret["kp"]],
            "SSL handshake failed",
            # The plaintext listener's close can come before the client reads its answer
            # as a failed handshake (seen under load).
            also=("in state SSL_HANDSHAKE",),
        ),
        "ssl.keystore.password": Case(
            {"security.protocol": "SSL", "ssl.keystore.location": "/nonexistent/client.p12"}
            | {"ssl.keystore.password": secret["kp"]},
            [secret["kp"]],
            "ssl.keystore.location",
        ),
        "ssl.key.pem": Case(
            {"security.protocol": "SSL", "ssl.key.pem": _pem("PRIVATE KEY", key)},
            [key],
            "ssl.key.pem",
        ),
        "ssl.certificate.pem with its key": Case(
            {"security.protocol": "SSL"}
            | {"ssl.certificate.pem": _pem("CERTIFICATE", "MIIB") + _pem("PRIVATE KEY", key)},
            [key],
            "ssl.certificate.pem",
        ),
        "ssl.ca.pem": Case(
            {"security.protocol": "SSL", "ssl.ca.pem": _pem("CERTIFICATE", secret["cs"])},
            [secret["cs"]],
            "ssl.ca.pem",
        ),
    }


def _escaped(value: str) -> str:
    """A value as a properties file holds it on one line."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


@pytest.fixture(params=sorted(_cases()))
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Case, Path]]:
    chosen = _cases()[request.param]
    file = tmp_path / "client.properties"
    file.write_text("".join(f"{k}={_escaped(v)}\n" for k, v in chosen.settings.items()))
    yield chosen, file


def _shown(text: str, case: Case) -> list[str]:
    """The secrets of ``case`` that ``text`` shows."""
    return [secret for secret in case.secrets if secret in text]


def test_status_and_finish_name_the_problem_and_show_no_secret(
    broker: KafkaBroker, case: tuple[Case, Path]
) -> None:
    chosen, file = case
    target = ["--bootstrap-servers", broker.bootstrap_servers, "--control-topic", "c"]
    for command in [["status"], ["finish", "--topic", "t", "--partition", "0"]]:
        result = run_cli(*command, *target, "--timeout", "3", "--kafka-config-file", str(file))
        output = result.stdout + result.stderr
        assert result.returncode in (1, 2), output
        assert _shown(output, chosen) == [], output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and chosen.names(lines[0]), output


def test_emit_names_the_problem_and_shows_no_secret_in_its_log_or_http_answers(
    broker: KafkaBroker, case: tuple[Case, Path], tmp_path: Path
) -> None:
    """``emit`` at DEBUG: every line it logs while it starts, and its ``/status`` and
    ``/metrics`` meanwhile; a client librdkafka would not make is one line and exit 2."""
    chosen, file = case
    port = free_port()
    log = tmp_path / "emit.log"
    arguments = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", "t"]
    arguments += ["--control-topic", f"c-{uuid.uuid4().hex[:8]}", "--metrics-port", str(port)]
    arguments += ["--kafka-config-file", str(file), "--log-level", "DEBUG"]
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", "SLACKWATER_REQUEST_TIMEOUT_MS": "2s"}
    served = ""
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*SLACKWATER, "emit", *arguments], stdout=out, stderr=subprocess.STDOUT, env=environ
        )
        try:
            wait_until(
                lambda: chosen.names(log.read_text()) or process.poll() is not None,
                DEADLINE_S,
                f"emit naming {chosen.named!r}",
            )
            if "status on /status" in log.read_text():  # serving (not refused settings)
                served = "".join(_get(port, path) for path in ["/status", "/metrics"])
                process.send_signal(signal.SIGTERM)
            process.wait(timeout=DEADLINE_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert chosen.names(text), text
    assert _shown(text + served, chosen) == [], text + served
    assert process.returncode in (0, 2), text


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        return str(answer.read().decode())


# ------------------------------------------------------------------ finding 4

START_UP = "cannot start on the control topic yet"


def start_up_line(
    bootstrap: str,
    control_topic: str,
    kafka_config: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """The first line the emitter's start-up (``Emitter.connect``) logs about the control
    topic, in its own thread, stopped once said."""
    logger = logging.getLogger("emitter.service.connection")
    # A line of the same kind from an earlier test of this process is not held back.
    kept = [f for f in logger.filters if not isinstance(f, OncePerInterval)]
    monkeypatch.setattr(logger, "filters", kept)
    lines: list[str] = []
    said = threading.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            said.set()

    config = EmitterConfig.model_validate(
        {
            "bootstrap_servers": bootstrap,
            "topics": ["orders"],
            "control_topic": control_topic,
            "kafka_config": kafka_config,
            "request_timeout_ms": 2_000,
            "poll_interval_ms": 200,
            "metrics_port": 0,
        }
    )
    emitter = Emitter(config)
    stop = threading.Event()
    catch = Catch(logging.WARNING)
    logger.addHandler(catch)
    thread = threading.Thread(target=emitter.connect, args=(stop,), daemon=True)
    thread.start()
    try:
        assert said.wait(DEADLINE_S), "no start-up line"
    finally:
        stop.set()
        thread.join(DEADLINE_S)
        logger.removeHandler(catch)
        emitter.close()
    assert not thread.is_alive()
    assert lines[0].startswith(START_UP), lines
    return lines[0]


def test_a_wrong_password_is_named_by_principal_at_start_up(
    secured: KafkaBroker, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = f"not-the-password-{uuid.uuid4().hex[:6]}"
    settings = credentials("slackwater-emitter", wrong)
    line = start_up_line(secured.bootstrap_servers, topics.control, settings, monkeypatch)
    assert "authentication failed as 'slackwater-emitter': " in line, line
    assert "Authentication failed during authentication due to invalid credentials" in line
    assert wrong not in line


def test_sasl_against_a_plaintext_listener_is_named_at_start_up(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = credentials("slackwater-emitter")
    control = f"c-{uuid.uuid4().hex[:8]}"
    line = start_up_line(broker.bootstrap_servers, control, settings, monkeypatch)
    assert "authentication failed as 'slackwater-emitter': " in line, line
    assert "SASL SCRAM-SHA-512 mechanism handshake failed" in line
    assert PASSWORDS["slackwater-emitter"] not in line


def test_a_principal_without_rights_on_the_control_topic_is_named_at_start_up(
    secured: KafkaBroker, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    change_acls(admin, False, rights(topics, "User:slackwater-emitter", CONTROL))
    settings = credentials("slackwater-emitter")
    line = start_up_line(secured.bootstrap_servers, topics.control, settings, monkeypatch)
    refused = "not authorized as 'slackwater-emitter' to describe or create control topic "
    assert f"{refused}{topics.control}: " in line, line
    assert "Authorization failed" in line  # the broker's words (CreateTopics)


def test_a_principal_that_may_read_but_not_write_the_control_topic_is_named_at_start_up(
    secured: KafkaBroker, topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/deploy.md's job principal reads the control topic, never writes it: the
    epoch's claim is refused."""
    settings = credentials("orders-job")
    line = start_up_line(secured.bootstrap_servers, topics.control, settings, monkeypatch)
    assert f"not authorized as 'orders-job' to write control topic {topics.control}" in line, line


def test_a_broker_certificate_not_verified_is_named_at_start_up(
    secured: KafkaBroker,
    topics: Topics,
    certificates: Certificates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = tls_credentials("slackwater-emitter", certificates.other)
    line = start_up_line(tls_bootstrap(secured), topics.control, settings, monkeypatch)
    assert "TLS handshake failed: the broker's certificate was not verified " in line, line
    assert f"(ssl.ca.location={certificates.other})" in line
    assert "certificate verify failed" in line
