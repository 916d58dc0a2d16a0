"""librdkafka's log lines through Python logging, each kind at most once per 30 s.

A client that cannot reach its broker logs a failed connection several times a second
(about 15 lines a second from the emitter's three clients); one line saying so, and
again while it lasts, is what an operator needs. Every Kafka client of slackwater gets
``client_logging(name)`` in its configuration.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError

LOGGER_NAME = "slackwater.librdkafka"
REPEAT_INTERVAL_S = 30.0
# What varies between two lines of one kind: timestamps, durations, counts, ports.
_VARYING = re.compile(r"\d+")


class OncePerInterval(logging.Filter):
    """Passes a record unless one of the same kind passed less than ``interval_s`` ago;
    the next one that passes says how many were held back."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._last_s: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = f"{record.name}|{_VARYING.sub('#', record.getMessage())}"
        now = self._clock()
        last = self._last_s.get(kind)
        if last is not None and now - last < self._interval_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return False
        self._last_s[kind] = now
        held = self._held.pop(kind, 0)
        if held and last is not None:
            record.msg = f"{record.getMessage()} (and {held} more like it in {now - last:.0f}s)"
            record.args = ()
        return True


def _not_reported_twice(record: logging.LogRecord) -> bool:
    """librdkafka logs a failed connection (facility FAIL) and reports the same error to
    ``error_cb``: the error line is kept, the log line shown only at DEBUG."""
    if record.getMessage().startswith("FAIL ") and record.levelno > logging.DEBUG:
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
    return True


def once_per_interval(name: str) -> logging.Logger:
    """A logger that says each kind of line at most once per 30 s (for what repeats
    while a broker is away)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, OncePerInterval) for f in logger.filters):
        logger.addFilter(OncePerInterval())
    return logger


def client_logging(client: str) -> dict[str, Any]:
    """Configuration entries that route a client's logs and errors through Python
    logging, rate-limited (served from the client's poll, flush and consume calls).

    A name may carry an instance after ``#`` (``source.planner#1f2e``): its failures are
    its own (authentication_failure), its logger is the kind's, as Python keeps every
    logger made for the process's life."""
    logger = logging.getLogger(f"{LOGGER_NAME}.{client.partition('#')[0]}")
    if not any(isinstance(f, OncePerInterval) for f in logger.filters):
        logger.addFilter(_not_reported_twice)
        logger.addFilter(OncePerInterval())

    def on_error(error: Any) -> None:
        # librdkafka retries by itself: this says what is wrong, never stops anything.
        logger.warning("Kafka: %s (still retrying)", error.str())
        if _credentials_refused(error):
            _authentication_failures.pop(client, None)  # the newest last
            _authentication_failures[client] = error
        if error.code() != KafkaError._ALL_BROKERS_DOWN:  # says no more than the one before
            _last_errors.pop(client, None)
            _last_errors[client] = error

    return {"logger": logger, "error_cb": on_error}


# How librdkafka's words name an error of the client itself (not the broker's answer).
_LOCAL = "Local: "
# librdkafka's words when its OAUTHBEARER token could not be refreshed (rdkafka_sasl_oauthbearer.c).
_TOKEN_NOT_ACQUIRED = "Failed to acquire SASL OAUTHBEARER token"
# OpenSSL's reason when the broker's certificate does not verify against the client's CA.
_CERTIFICATE_NOT_VERIFIED = "certificate verify failed"
# OpenSSL's words for a TLS alert the broker sent about the client's certificate (mTLS,
# ssl.client.auth=required): none given, or one it does not trust, or one expired. Under
# TLS 1.3 the broker judges the certificate after the client's handshake has ended, so
# librdkafka reports the alert as a failed receive (_TRANSPORT), not as _SSL.
_CERTIFICATE_REFUSED = re.compile(
    r"alert (bad certificate|unsupported certificate|certificate revoked|certificate expired"
    r"|certificate unknown|unknown ca|certificate required)"
)


def _credentials_refused(error: KafkaError) -> bool:
    """The broker refused the client's SASL credentials or its certificate, or the client
    could not verify the broker's certificate: configuration, which no retry mends.
    librdkafka also reports a SASL exchange cut short by the connection as
    _AUTHENTICATION, with a local error in its words ("Local: Broker transport failure",
    "Local: Timed out"), and a TLS handshake cut short as _SSL: those are outages,
    waited out."""
    if error.code() == KafkaError._AUTHENTICATION:
        # Its own token provider failing (an identity provider down) is not the broker's
        # refusal: librdkafka keeps the current token and tries again.
        return _LOCAL not in error.str() and _TOKEN_NOT_ACQUIRED not in error.str()
    if error.code() == KafkaError._SSL and _CERTIFICATE_NOT_VERIFIED in error.str():
        return True
    return error.code() in (KafkaError._SSL, KafkaError._TRANSPORT) and bool(
        _CERTIFICATE_REFUSED.search(error.str())
    )


# The last authentication failure each client of this process met. librdkafka reports
# it to error_cb and goes on retrying; a request then fails as a "transport failure",
# so a command that gives up names this instead (authentication_failure).
_authentication_failures: dict[str, KafkaError] = {}


# The last error each client of this process reported, whatever it was.
_last_errors: dict[str, KafkaError] = {}


def last_error() -> KafkaError | None:
    """The last error any client here reported (a refused connection, say): what a
    command that gives up names, its request's own error being "transport failure"."""
    return next(reversed(_last_errors.values()), None)


def leave_out_client_lines() -> None:
    """For a command that gives up with one line of its own (``finish``, ``status``):
    librdkafka's lines, which tell what it retried meanwhile, are not printed; that one
    line names the failure (authentication_failure, last_error)."""
    logging.getLogger(LOGGER_NAME).setLevel(logging.CRITICAL + 1)


# The names of settings whose values are secrets: Spark's spark.redaction.regex (its
# default), and PEM text (librdkafka's ssl.key.pem) and JAAS lines (Kafka's Java clients').
_SECRET_SETTING = re.compile(r"(?i)secret|password|token|access[.]?key|pem|jaas")
REDACTED = "*********(redacted)"


def without_secrets(line: str, kafka_config: Mapping[str, Any]) -> str:
    """``line`` with the value of every secret setting of ``kafka_config`` blotted out,
    as Spark shows them: the last guard of a line that quotes what a client was told."""
    for name, value in kafka_config.items():
        if value and _SECRET_SETTING.search(name):
            line = line.replace(str(value), REDACTED)
    return line


def authentication_failure() -> KafkaError | None:
    """The last authentication failure of any client here."""
    return next(reversed(_authentication_failures.values()), None)


def take_authentication_failure(client: str) -> KafkaError | None:
    """The last authentication failure of the client called ``client`` since it was last
    taken (served by that client's poll): for a long-lived client, whose failure of an
    hour ago must not explain an outage now."""
    return _authentication_failures.pop(client, None)


def authentication_problem(failure: KafkaError, kafka_config: Mapping[str, Any]) -> str:
    """One line naming the principal that failed to authenticate (never its password),
    or the certificate problem: the broker's certificate not verified against the
    client's CA, or the client's certificate refused by the broker, with the settings
    that name the files (paths, never a password or a PEM's text)."""
    if _CERTIFICATE_REFUSED.search(failure.str()):
        return (
            "TLS handshake failed: the broker refused this client's certificate "
            f"({_client_certificate(kafka_config)}): {failure.str()}"
        )
    if failure.code() == KafkaError._SSL:
        trusted = kafka_config.get("ssl.ca.location")
        ca = f"ssl.ca.location={trusted}" if trusted else "no ssl.ca.location: the system's CAs"
        return (
            f"TLS handshake failed: the broker's certificate was not verified ({ca}): "
            f"{failure.str()}"
        )
    return f"authentication failed{_as_whom(kafka_config)}: {failure.str()}"


# The settings that hand librdkafka the client's own certificate (mTLS).
_CERTIFICATE_SETTINGS = ("ssl.keystore.location", "ssl.certificate.location")


def _client_certificate(kafka_config: Mapping[str, Any]) -> str:
    given = [
        f"{name}={kafka_config[name]}" for name in _CERTIFICATE_SETTINGS if kafka_config.get(name)
    ]
    if kafka_config.get("ssl.certificate.pem"):
        given.append("ssl.certificate.pem (inline)")
    return ", ".join(given) or "none given: no ssl.keystore.location or ssl.certificate.location"


def settings_problem(error: KafkaError, kafka_config: Mapping[str, Any]) -> str:
    """One line for a client librdkafka would not make (a setting it does not know, a
    file it cannot read), naming each file setting whose file is not on this machine:
    librdkafka's own words name the setting and OpenSSL's reason, never the path."""
    missing = [
        f"{name}={value} does not exist here"
        for name, value in kafka_config.items()
        if name.endswith((".location", ".keytab")) and value and not os.path.exists(str(value))
    ]
    line = f"invalid Kafka settings: {error.str()}"
    return without_secrets(f"{line} ({'; '.join(missing)})" if missing else line, kafka_config)


# The broker's answers that an ACL refused the request (Kafka's protocol error codes).
_AUTHORIZATION_ERRORS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)


def authorization_problem(
    error: KafkaError, action: str, kafka_config: Mapping[str, Any], group: str | None = None
) -> str | None:
    """One line naming the principal and what it may not do (``action``, e.g. "read
    topic orders") or its consumer's ``group``, if ``error`` is the broker refusing it;
    None for any other error. A missing right is never retried: only an ACL mends it."""
    if error.code() not in _AUTHORIZATION_ERRORS:
        return None
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED and group:
        # A consumer that only reads by assignment still finds its group's coordinator.
        action = f"describe consumer group {group} (to {action})"
    return f"not authorized{_as_whom(kafka_config)} to {action}: {error.str()}"


def _as_whom(kafka_config: Mapping[str, Any]) -> str:
    who = kafka_config.get("sasl.username")
    return f" as {who!r}" if who else ""
