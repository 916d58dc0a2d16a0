"""librdkafka's log lines through Python logging, each kind at most once per 30 s.

A client that cannot reach its broker logs a failed connection several times a second
(about 15 lines a second from the emitter's three clients); one line saying so, and
again while it lasts, is what an operator needs. Every Kafka client of slackwater gets
``client_logging(name)`` in its configuration.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
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
        logger.addFilter(RedactSecrets())  # what repeats is a broker's answer: redact it
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
        logger.addFilter(RedactSecrets())  # librdkafka's own lines quote what it was told
        logger.addFilter(_not_reported_twice)
        logger.addFilter(OncePerInterval())

    def on_error(error: Any) -> None:
        # librdkafka retries by itself: this says what is wrong, never stops anything.
        logger.warning("Kafka: %s (still retrying)", redact(error.str()))
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


REDACTED = "*********(redacted)"

# The settings whose values are secrets: those librdkafka marks _RK_SENSITIVE
# (src/rdkafka_conf.c of librdkafka 2.16; its CONFIGURATION.md does not say which),
# save those judged not secret below, and the Java clients' that users paste into a
# properties file (librdkafka refuses those by name, but a line may still quote one).
# Not secrets although librdkafka marks them: sasl.username (the principal, named on
# purpose: "authentication failed as 'ops'", as Kafka's ACLs and logs name it), and the
# paths ssl.key.location and sasl.oauthbearer.assertion.private.key.file (the file is the
# secret; its path is what an operator needs when it is missing), as sasl.kerberos.keytab
# (a path too). A private key's PEM text is a secret in any setting (PRIVATE_KEY).
SECRET_SETTINGS = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.config",  # name=value pairs: each value a secret on its own
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",  # its alias
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "ssl.ca.pem",
        "ssl.truststore.password",  # Java's
        "ssl.keystore.key",  # Java's
        "sasl.jaas.config",  # Java's, with a password inside
    }
)
# Any other setting named as a secret: Spark's spark.redaction.regex (its default), PEM
# text and JAAS lines.
_SECRET_SETTING = re.compile(r"(?i)secret|password|token|access[.]?key|pem|jaas")
# librdkafka's unsecured OAUTHBEARER settings, "principal=p scope=s extension_x=v".
_OAUTHBEARER_CONFIG = "sasl.oauthbearer.config"
# A private key in PEM, whatever setting holds it (ssl.certificate.pem may hold the key
# after the certificate), and one cut short (librdkafka's error texts end at 512 bytes).
PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*\Z)",
    re.DOTALL,
)
# A secret this short is blotted out only as a word of its own: everywhere, it would
# blot out the words that name the problem.
_SHORT_SECRET = 4


def is_secret_setting(name: str) -> bool:
    return name in SECRET_SETTINGS or bool(_SECRET_SETTING.search(name))


def secret_values(kafka_config: Mapping[str, Any]) -> set[str]:
    """The secrets in ``kafka_config``: the value of each secret setting, each value of
    sasl.oauthbearer.config's pairs, and every private key's PEM text."""
    found: set[str] = set()
    for name, value in kafka_config.items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            continue  # a callback or a logger, not a setting's text
        text = str(value)
        if is_secret_setting(name):
            found.update({text, text.strip()})  # as given, and as Kafka's clients trim it
            if name == _OAUTHBEARER_CONFIG:
                # librdkafka quotes it from a bad pair on ("beginning at: badkey=..."):
                # the whole value never appears, each pair's value may.
                for word in text.split():
                    _, equals, pair_value = word.partition("=")
                    found.add(pair_value if equals else word)
        found.update(match.group(0) for match in PRIVATE_KEY.finditer(text))
    found.discard("")
    # As a line may quote them: escaped by JSON (an HTTP answer) or by Python's repr
    # (KafkaError's, an exception's args).
    return found | {json.dumps(v)[1:-1] for v in found} | {repr(v)[1:-1] for v in found}


class SecretFilter:
    """Secrets, by value, and one pattern that finds them all, longest first (a secret
    inside another goes with the whole); ``redact`` blots them out of a text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.secrets: frozenset[str] = frozenset()
        self._pattern: re.Pattern[str] | None = None

    def remember(self, kafka_config: Mapping[str, Any]) -> bool:
        """Adds the secrets of ``kafka_config``; whether any was new."""
        found = secret_values(kafka_config)
        if found <= self.secrets:
            return False
        with self._lock:
            secrets = self.secrets | found
            alternatives = [
                re.escape(s)
                if len(s) >= _SHORT_SECRET
                else rf"(?<![0-9A-Za-z]){re.escape(s)}(?![0-9A-Za-z])"
                for s in sorted(secrets, key=len, reverse=True)
            ]
            self._pattern = re.compile("|".join(alternatives))
            self.secrets = secrets
        return True

    def redact(self, text: str) -> str:
        """``text`` with every secret blotted out, wherever it stands, one cut short at
        its end too, and any private key's PEM text."""
        text = PRIVATE_KEY.sub(REDACTED, text)
        pattern, secrets = self._pattern, self.secrets
        if pattern is None:
            return text
        return _without_cut_secret(pattern.sub(REDACTED, text), secrets)


# Every secret of every Kafka client made in this process (client_settings).
_known = SecretFilter()


def remember_secrets(kafka_config: Mapping[str, Any]) -> None:
    """Makes the secrets of ``kafka_config`` known to ``redact``, for the life of the
    process, and from then on every log line of the process passes ``redact``."""
    if _known.remember(kafka_config):
        _redact_every_log_record()


def redact(text: str, kafka_config: Mapping[str, Any] | None = None) -> str:
    """The one filter every text from librdkafka passes before a log line, an error line
    or an HTTP answer: ``text`` with every secret of this process's Kafka clients
    (``remember_secrets``) and of ``kafka_config`` blotted out by value, wherever it
    stands, and any private key."""
    if kafka_config:
        remember_secrets(kafka_config)
    return _known.redact(text)


def _without_cut_secret(text: str, secrets: frozenset[str]) -> str:
    """``text`` without the start of a secret at its end (its first 4 characters at
    least): librdkafka's error texts are cut at 512 bytes, and one may end inside a
    secret it quotes."""
    for secret in secrets:
        head = secret[:_SHORT_SECRET]
        if len(head) < _SHORT_SECRET:
            continue
        cut_at = text.find(head, max(0, len(text) - len(secret)))
        while cut_at >= 0:  # str.find's "not found", not an offset of Kafka's
            if secret.startswith(text[cut_at:]):
                return text[:cut_at] + REDACTED
            cut_at = text.find(head, cut_at + 1)
    return text


def redacted_document(document: Any) -> Any:
    """A JSON document (an HTTP answer) with ``redact`` applied to every string in it."""
    if isinstance(document, str):
        return redact(document)
    if isinstance(document, Mapping):
        return {redact(str(k)): redacted_document(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [redacted_document(v) for v in document]
    return document


def without_secrets(line: str, kafka_config: Mapping[str, Any]) -> str:
    """``line`` through ``redact``, ``kafka_config``'s secrets known: the last guard of a
    line that quotes what a client was told."""
    return redact(line, kafka_config)


_EXCEPTION_TEXT = logging.Formatter()


def redact_record(record: logging.LogRecord) -> None:
    """``record``'s message, traceback and stack through ``redact``; a traceback that
    held a secret is kept only as its redacted text."""
    unformatted = False
    try:
        message = record.getMessage()
    except Exception:  # logging would print msg and args as they are: joined here
        message, unformatted = f"{record.msg} {record.args!r}", True
    clean = redact(message)
    if clean != message or unformatted:
        record.msg, record.args = clean, ()
    if record.exc_info and not record.exc_text:
        text = _EXCEPTION_TEXT.formatException(record.exc_info)
        if redact(text) != text:
            record.exc_text, record.exc_info = redact(text), None
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)


class RedactSecrets(logging.Filter):
    """``redact_record`` as a logger's filter (librdkafka's loggers): their lines pass
    the filter even where another library has replaced the record factory."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


_factory_installed = threading.Event()
_factory_lock = threading.Lock()


def _redact_every_log_record() -> None:
    """Every log record of the process, whatever its logger, passes ``redact`` when it
    is made (the record factory, chained to the one before): a line that quotes a
    librdkafka error (``emitter.service``'s, the Spark source's) needs no filter of its
    own, and a handler the user adds sees no secret."""
    with _factory_lock:
        if _factory_installed.is_set():
            return
        previous = logging.getLogRecordFactory()

        def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            redact_record(record)
            return record

        logging.setLogRecordFactory(redacting_factory)
        _factory_installed.set()


def authentication_failure() -> KafkaError | None:
    """The last authentication failure of any client here."""
    return next(reversed(_authentication_failures.values()), None)


def take_authentication_failure(client: str) -> KafkaError | None:
    """The last authentication failure of the client called ``client`` since it was last
    taken (served by that client's poll): for a long-lived client, whose failure of an
    hour ago must not explain an outage now."""
    return _authentication_failures.pop(client, None)


def take_newest_authentication_failure(clients: Iterable[str]) -> KafkaError | None:
    """The newest of the failures of the clients called ``clients``, each taken (as
    ``take_authentication_failure``): those a step of several clients met since the last
    call, the newest the one that says most."""
    names = set(clients)
    newest = next((f for c, f in reversed(_authentication_failures.items()) if c in names), None)
    for name in names:
        _authentication_failures.pop(name, None)
    return newest


def authentication_problem(failure: KafkaError, kafka_config: Mapping[str, Any]) -> str:
    """One line naming the principal that failed to authenticate (never its password),
    or the certificate problem: the broker's certificate not verified against the
    client's CA, or the client's certificate refused by the broker, with the settings
    that name the files (paths, never a password or a PEM's text). Through ``redact``."""
    if _CERTIFICATE_REFUSED.search(failure.str()):
        line = (
            "TLS handshake failed: the broker refused this client's certificate "
            f"({_client_certificate(kafka_config)}): {failure.str()}"
        )
    elif failure.code() == KafkaError._SSL:
        trusted = kafka_config.get("ssl.ca.location")
        ca = f"ssl.ca.location={trusted}" if trusted else "no ssl.ca.location: the system's CAs"
        line = (
            f"TLS handshake failed: the broker's certificate was not verified ({ca}): "
            f"{failure.str()}"
        )
    else:
        line = f"authentication failed{_as_whom(kafka_config)}: {failure.str()}"
    return redact(line, kafka_config)


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
    return redact(f"{line} ({'; '.join(missing)})" if missing else line, kafka_config)


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
    return redact(
        f"not authorized{_as_whom(kafka_config)} to {action}: {error.str()}", kafka_config
    )


def _as_whom(kafka_config: Mapping[str, Any]) -> str:
    who = kafka_config.get("sasl.username")
    return f" as {who!r}" if who else ""
