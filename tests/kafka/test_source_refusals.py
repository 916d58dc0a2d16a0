"""Issue 31, finding 8: executors that Kafka refuses.

Credentials or a truststore can work on the driver and not on the executors: a password
rotated after the driver's connections were made, a CA file or a keystore missing on the
executors. A reader refused ends its task at once (readTimeoutMs is 10 minutes here: only
the refusal can end these tasks) with one line naming the reader and the principal, or
the certificate problem; never a password. On the secured node of
tests/spark/test_secured_kafka.py (its fixtures: SASL/SCRAM, SASL_SSL, and an MTLS listener
whose clients are known by their certificates).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import (
    AclBinding,
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source.executor import reader_clients, readers
from spark_consumer.source.shared.options import SourceError, SourceOptions
from spark_consumer.source.wire.splits import TaskPartition
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import Writer
from tests.harness.secured import (
    CONTROL,
    DATA,
    DEADLINE_S,
    PASSWORDS,
    Certificates,
    Topics,
    change_acls,
    credentials,
    listener_address,
    mtls_credentials,
    rights,
    sees,
    source_config,
    tls_bootstrap,
    tls_credentials,
)
from tests.harness.source_driver import Driven, options

# Far longer than any of these tests may take: only the refusal ends their tasks.
READ_TIMEOUT_MS = "600000"


def _planned_task(driven: Driven) -> TaskPartition:
    """The first batch's one reader task (its data: partition 0's records)."""
    end = driven.plan()
    tasks = [
        t for t in driven.reader.partitions(driven.offset, end) if isinstance(t, TaskPartition)
    ]
    assert len(tasks) == 1, tasks
    return tasks[0]


def _read_refused(reader_options: dict[str, str], task: TaskPartition) -> str:
    """The one line a reader task with these options ends with (an executor's read)."""
    with pytest.raises(SourceError) as ended:
        list(readers.read(SourceOptions.parse(reader_options), task))
    line = str(ended.value)
    assert "\n" not in line, line
    return line


def _user_with_the_jobsrights(node: KafkaBroker, topics: Topics, password: str) -> str:
    """A SCRAM user made for the test, with docs/deploy.md's rights of orders-job."""
    user = f"job-{uuid.uuid4().hex[:6]}"
    _set_password(node, user, password)
    admin = AdminClient({"bootstrap.servers": node.bootstrap_servers, **credentials("admin")})
    bindings = [
        AclBinding(
            b.restype, b.name, b.resource_pattern_type, f"User:{user}", b.host, b.operation,
            b.permission_type,
        )
        for name in (DATA, CONTROL, f"{CONTROL}.progress", "slackwater-")
        for b in rights(topics, "User:orders-job", name)
    ]  # fmt: skip
    change_acls(admin, True, bindings)
    return user


def _set_password(node: KafkaBroker, user: str, password: str) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap_servers, **credentials("admin")})
    scram = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    made = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, scram, password.encode())]
    )
    for future in made.values():
        future.result(30)


@pytest.mark.timeout(300)  # before the fix: the task waited readTimeoutMs (10 minutes)
def test_a_password_rotated_after_the_driver_connected_ends_the_reader_task_in_one_line(
    secured: KafkaBroker, topics: Topics
) -> None:
    """The driver's connections were authenticated before the rotation and keep working;
    an executor's new consumer offers the old password and is refused."""
    old, new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    user = _user_with_the_jobsrights(secured, topics, old)
    settings = {**credentials("orders-job"), "sasl.username": user, "sasl.password": old}
    wait_until(lambda: sees(secured, settings, topics.control), DEADLINE_S, f"{user}'s rights")
    Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin")).data(0, 1)
    given = options(
        secured.bootstrap_servers,
        topics.data,
        topics.control,
        readTimeoutMs=READ_TIMEOUT_MS,
        **source_config(settings),
    )
    driven = Driven.start(given)
    try:
        _set_password(secured, user, new)
        wait_until(lambda: not sees(secured, settings, topics.control), DEADLINE_S, "the rotation")
        task = _planned_task(driven)  # planned by the driver's clients, still answered
        line = _read_refused(given, task)
    finally:
        driven.stop()
    assert line.startswith(f"reader (executor): authentication failed as '{user}': "), line
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in line, line
    assert old not in line and new not in line


def _tls_case(
    node: KafkaBroker, certificates: Certificates, missing: Path, case: str
) -> tuple[str, dict[str, str], dict[str, str], str]:
    """A listener, the driver's settings, an executor's, and how its line begins."""
    sasl_ssl = tls_credentials("orders-job", certificates.broker)
    mtls = mtls_credentials(certificates)
    no_certificate = {
        k: v for k, v in mtls.items() if k not in ("ssl.keystore.location", "ssl.keystore.password")
    }
    return {
        "the CA file missing on the executor": (
            tls_bootstrap(node),
            sasl_ssl,
            {**sasl_ssl, "ssl.ca.location": str(missing)},
            "reader (executor): invalid Kafka settings: Failed to create consumer: "
            "ssl.ca.location failed: ",
        ),
        "another CA on the executor": (
            tls_bootstrap(node),
            sasl_ssl,
            {**sasl_ssl, "ssl.ca.location": str(certificates.other)},
            "reader (executor): TLS handshake failed: the broker's certificate was not "
            f"verified (ssl.ca.location={certificates.other}): ",
        ),
        "no client certificate on the executor (mTLS)": (
            listener_address(node, "MTLS"),
            mtls,
            no_certificate,
            "reader (executor): TLS handshake failed: the broker refused this client's "
            "certificate (none given: no ssl.keystore.location or "
            "ssl.certificate.location): ",
        ),
    }[case]


TLS_CASES = [
    "the CA file missing on the executor",
    "another CA on the executor",
    "no client certificate on the executor (mTLS)",
]
# What else each case's line says: librdkafka's reason, and the missing file by path.
TLS_REASONS = {
    "the CA file missing on the executor": "does not exist here)",
    "another CA on the executor": "certificate verify failed",
    "no client certificate on the executor (mTLS)": "alert bad certificate",
}


@pytest.mark.timeout(300)  # before the fix: waited readTimeoutMs, or a bare KafkaException
@pytest.mark.parametrize("case", TLS_CASES)
def test_an_executor_whose_tls_fails_ends_its_task_in_one_line_naming_the_certificate_problem(
    secured: KafkaBroker, topics: Topics, certificates: Certificates, tmp_path: Path, case: str
) -> None:
    missing = tmp_path / "not-on-this-executor" / "ca.pem"
    bootstrap, driver, executor, begins = _tls_case(secured, certificates, missing, case)
    Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin")).data(0, 1)
    planned = options(bootstrap, topics.data, topics.control, readTimeoutMs=READ_TIMEOUT_MS)
    driven = Driven.start({**planned, **source_config(driver)})
    try:
        task = _planned_task(driven)
        line = _read_refused({**planned, **source_config(executor)}, task)
    finally:
        driven.stop()
    assert line.startswith(begins), line
    assert TLS_REASONS[case] in line, line
    if case == "the CA file missing on the executor":
        assert f"ssl.ca.location={missing} does not exist here" in line, line
    assert certificates.password not in line and PASSWORDS["orders-job"] not in line


@pytest.mark.timeout(300)  # before the fix: waited out as an outage, for ever
def test_a_driver_whose_certificate_the_broker_refuses_ends_the_query_in_one_line(
    secured: KafkaBroker, topics: Topics, certificates: Certificates
) -> None:
    untrusted = {
        **mtls_credentials(certificates),
        "ssl.keystore.location": str(certificates.keystore),  # the broker's own: not trusted
    }
    given = options(
        listener_address(secured, "MTLS"),
        topics.data,
        topics.control,
        **source_config(untrusted),
    )
    with pytest.raises(SourceError) as ended:
        Driven.start(given).stop()
    line = str(ended.value)
    assert line.startswith(
        "planner (driver): TLS handshake failed: the broker refused this client's certificate "
        f"(ssl.keystore.location={certificates.keystore}): "
    ), line
    # librdkafka sends no certificate whose issuer the broker does not name as trusted:
    # "bad certificate" (none); one it sends and the broker does not trust: "unknown".
    assert re.search("alert (bad certificate|certificate unknown)", line), line
    assert certificates.password not in line


class _RefusedGroup:
    """A reader's consumer whose group the principal may not describe: librdkafka's
    FindCoordinator error, as the secured node gives it, as the first event."""

    def __init__(self, consumer: Any) -> None:
        self.real = consumer
        self.told = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if not self.told:
            self.told = True
            refused = KafkaError(
                KafkaError.GROUP_AUTHORIZATION_FAILED,
                "FindCoordinator response error: Group authorization failed.",
            )
            # A client-wide error event, as confluent-kafka gives it: no topic, no partition.
            return [Message(error=refused)]
        return list(self.real.consume(num_messages=num_messages, timeout=timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_reader_refused_its_group_ends_its_task_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client-wide refusal (no topic) was logged and waited past, the consumer spoiled
    at every task; it is a missing ACL, named like the others."""
    import contextlib
    from collections.abc import Iterator

    given = options("127.0.0.1:1", "orders", None, readTimeoutMs=READ_TIMEOUT_MS)
    given["kafka.sasl.username"] = "orders-job"
    real_borrowed = reader_clients.borrowed_consumer

    @contextlib.contextmanager
    def borrowed(config: dict[str, Any]) -> Iterator[reader_clients.Lease]:
        with real_borrowed(config) as lease:
            lease.consumer = _RefusedGroup(lease.consumer)
            yield lease

    monkeypatch.setattr(reader_clients, "borrowed_consumer", borrowed)
    task = TaskPartition((("orders", 0, 0, 5),), late_threshold_ms=0)
    line = _read_refused(given, task)
    assert line == (
        "reader (executor): not authorized as 'orders-job' to describe consumer group "
        "slackwater-reader (to read topic orders): FindCoordinator response error: Group "
        "authorization failed."
    )
