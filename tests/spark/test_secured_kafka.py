"""Apache Kafka with SASL/SCRAM-SHA-512 and Kafka's StandardAuthorizer
(``allow.everyone.if.no.acl.found=false``), and the ACLs of docs/deploy.md applied to it
as written there: only the emitter's and the operators' principals can write the control
topic (issue 23).

One node for the module: its client listeners are SASL_PLAINTEXT, SASL_SSL (a
self-signed certificate made by the JDK's keytool for the module) and MTLS (SSL with
``ssl.client.auth=required``: a client's certificate is its principal, CN=orders-job as
User:orders-job), the brokers talk to each other as the super user ``admin``; the
controller listener stays PLAINTEXT (its ANONYMOUS principal is a super user, as KRaft
needs for a combined node).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker
from slackwater.kafka_clients import create_topic
from slackwater.markers import Marker, MarkerStatus, encode
from spark_consumer.consume.job import committed_rows
from spark_consumer.source.shared.options import SourceError
from tests.harness.emitter import after_polls, start_emitter
from tests.harness.factories import SLACKWATER, run_cli, wait_until
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import wait_while_running
from tests.harness.secured import (
    CONTROL,
    DATA,
    DEADLINE_S,
    FINISHED,
    GROUP,
    IDLE,
    PASSWORDS,
    Certificates,
    Topics,
    acls_of_deploy_md,
    change_acls,
    cli_config,
    cli_credentials,
    command_as,
    credentials,
    markers_read,
    one_failure_line,
    rights,
    sees,
    source_config,
    statuses,
    tls_bootstrap,
    tls_credentials,
    wait_for_idle_markers,
)
from tests.harness.source_driver import Driven, options, real
from tests.harness.source_jobs import events, iso_ms, window_job


def test_the_acls_of_deploy_md_are_kafka_acls() -> None:
    bindings = acls_of_deploy_md()
    writers = {
        b.principal
        for b in bindings
        if b.name == CONTROL and b.operation in (AclOperation.WRITE, AclOperation.ALL)
    }
    assert writers == {"User:slackwater-emitter", "User:ops"}
    assert not any(b.principal == "User:*" for b in bindings)


def test_only_the_emitter_and_operators_write_markers_and_every_job_reads_them(
    secured: KafkaBroker, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every line the emitter and its clients log
    running = start_emitter(
        bootstrap_servers=secured.bootstrap_servers,
        topics=[topics.data],
        control_topic=topics.control,
        group=GROUP,
        kafka_config=credentials("slackwater-emitter"),
    )
    try:
        # The emitter made the control topic and published with its own rights; a job's
        # principal reads what it published.
        wait_for_idle_markers(secured, topics, "orders-job")
        # A job's principal forges a well-formed FINISHED: the broker refuses it.
        forged = Marker(
            topic=topics.data,
            partition=1,
            status=FINISHED,
            offset=0,
            emitted_at=int(time.time() * 1000),
            emitter_id="forger",
            epoch=99,
            seq=0,
        )
        outcome: list[KafkaError | None] = []
        producer = Producer(
            {
                "bootstrap.servers": secured.bootstrap_servers,
                **credentials("orders-job"),
                "message.timeout.ms": 10_000,
                "log_level": 0,
            }
        )
        key, value = encode(forged)
        producer.produce(
            topics.control, value, key=key, on_delivery=lambda error, _m: outcome.append(error)
        )
        producer.flush(30)
        assert len(outcome) == 1 and outcome[0] is not None
        assert outcome[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # An operator's finish request is allowed; the emitter turns it into FINISHED.
        result = command_as(
            "ops", secured, topics, "finish", "--topic", topics.data, "--partition", "0"
        )
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: (
                [(m.partition, m.status) for m in markers_read(secured, topics, "orders-job")][-1:]
                == [(0, FINISHED)]
            ),
            DEADLINE_S,
            "FINISHED for orders:0 after the operator's request",
        )
        markers = markers_read(secured, topics, "orders-job")
        assert all(m.emitter_id != "forger" for m in markers)
        # slackwater status as a consumer's principal lists what the emitter published.
        status = command_as("orders-job", secured, topics, "status")
        assert status.returncode == 0, status.stderr
        listed = {tuple(line.split()[:2]) for line in status.stdout.splitlines()}
        assert {(f"{topics.data}:0", "FINISHED"), (f"{topics.data}:1", "IDLE")} <= listed
        # No password in what the emitter serves or logs.
        served = running.metrics_text() + str(running.status()) + caplog.text
        assert caplog.text
        assert not any(password in served for password in PASSWORDS.values())
    finally:
        running.stop()


def test_an_emitter_refused_a_topic_it_watched_publishes_nothing_for_it_and_says_so(
    secured: KafkaBroker, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    """A watched topic a broker stops listing for the emitter's principal (an ACL taken
    away) is not a deleted topic: no FINISHED, one line naming principal and topic."""
    running = start_emitter(
        bootstrap_servers=secured.bootstrap_servers,
        topics=[topics.data],
        control_topic=topics.control,
        kafka_config=credentials("slackwater-emitter"),
    )
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    describe = rights(topics, "User:slackwater-emitter", DATA, {AclOperation.DESCRIBE})
    try:
        wait_for_idle_markers(secured, topics, "admin")
        change_acls(admin, False, describe)
        # Twice the polls after which a topic not listed any more counts as deleted.
        after_polls(running, 2 * running.emitter.config.deleted_topic_polls + 2)
        refused = (
            f"not authorized as 'slackwater-emitter' to describe topic {topics.data}: "
            "Broker: Topic authorization failed"
        )
        # No FINISHED for the topic it may no longer see.
        assert statuses(secured, topics, "admin") == [(0, IDLE), (1, IDLE)]
        assert refused in caplog.text
        assert (running.metric("slackwater_emitter_poll_errors_total", request="metadata") or 0) > 0
        # The right given back: the emitter follows the topic again.
        change_acls(admin, True, describe)
        write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
        write.data(0, 1)
        wait_until(
            lambda: (
                [(m.partition, m.status) for m in markers_read(secured, topics, "admin")][-1:]
                == [(0, MarkerStatus.ACTIVE)]
            ),
            DEADLINE_S,
            "ACTIVE for partition 0 after its record",
        )
        assert all(m.status is not FINISHED for m in markers_read(secured, topics, "admin"))
    finally:
        running.stop()


def test_the_emitter_status_and_the_source_work_over_sasl_ssl_with_a_keytool_certificate(
    secured: KafkaBroker, topics: Topics, certificates: Certificates
) -> None:
    bootstrap = tls_bootstrap(secured)
    running = start_emitter(
        bootstrap_servers=bootstrap,
        topics=[topics.data],
        control_topic=topics.control,
        kafka_config=tls_credentials("slackwater-emitter", certificates.broker),
    )
    try:
        wait_for_idle_markers(secured, topics, "admin")  # published over TLS
    finally:
        running.stop()
    as_job = tls_credentials("orders-job", certificates.broker)
    status = run_cli(
        "status", "--bootstrap-servers", bootstrap, "--control-topic", topics.control,
        *cli_config(as_job),
        timeout_s=120,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert {(f"{topics.data}:0", "IDLE"), (f"{topics.data}:1", "IDLE")} <= {
        tuple(line.split()[:2]) for line in status.stdout.splitlines()
    }
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.data(0, 1, 2)
    given = options(bootstrap, topics.data, topics.control, **source_config(as_job))
    driven = Driven.start(given)
    try:
        rows = driven.step()
        # The data, and both markers the emitter published over TLS, read over TLS (the
        # status comes from markers alone: no emitter runs to see partition 0 move).
        assert sorted((r["partition"], r["offset"]) for r in real(rows)) == [(0, 0), (0, 1)]
        assert driven.statuses() == {f"{topics.data}:0": "IDLE", f"{topics.data}:1": "IDLE"}
    finally:
        driven.stop()


def test_a_broker_certificate_the_client_cannot_verify_is_one_line(
    secured: KafkaBroker, topics: Topics, certificates: Certificates
) -> None:
    bootstrap = tls_bootstrap(secured)
    untrusting = tls_credentials("orders-job", certificates.other)
    given = options(bootstrap, topics.data, topics.control, **source_config(untrusting))
    with pytest.raises(SourceError) as failed:
        Driven.start(given).stop()
    assert str(failed.value).startswith(
        "planner (driver): TLS handshake failed: the broker's certificate was not verified "
        f"(ssl.ca.location={certificates.other}): "
    ), failed.value
    assert "certificate verify failed" in str(failed.value)
    status = run_cli(
        "status", "--bootstrap-servers", bootstrap, "--control-topic", topics.control,
        *cli_config(untrusting),
        timeout_s=120,
    )  # fmt: skip
    line = one_failure_line(status)
    assert line.startswith("slackwater status: "), line
    assert "TLS handshake failed: " in line and "certificate verify failed" in line, line
    assert PASSWORDS["orders-job"] not in status.stderr + status.stdout


def properties_file(path: Path, settings: dict[str, str]) -> Path:
    """Kafka client settings as a properties file for ``--kafka-config-file``, readable by
    its owner alone (docs/deploy.md): a backslash escaped, anything else as it is."""
    escaped = {name: value.replace("\\", "\\\\") for name, value in settings.items()}
    path.write_text("".join(f"{name}={value}\n" for name, value in escaped.items()))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("command", ["finish", "status"])
def test_wrong_credentials_are_one_line_and_a_non_zero_exit(
    secured: KafkaBroker, topics: Topics, command: str, tmp_path: Path
) -> None:
    """Exactly one line on stderr: librdkafka's own (the refused authentication, "1/1
    brokers are down") are not printed; the command's line says it all."""
    arguments = (
        ["--topic", topics.data, "--partition", "0", "--timeout", "10"]
        if command == "finish"
        else []
    )
    wrong = f"not-the-password-{uuid.uuid4().hex[:6]}"
    client = properties_file(tmp_path / "ops.properties", credentials("ops", wrong))
    result = run_cli(
        command, "--bootstrap-servers", secured.bootstrap_servers,
        "--control-topic", topics.control, *arguments, "--kafka-config-file", str(client),
        timeout_s=120,
    )  # fmt: skip
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"slackwater {command}: "), lines[0]
    assert "authentication failed as 'ops': " in lines[0], lines[0]
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in lines[0], lines[0]
    assert wrong not in result.stderr + result.stdout


def test_status_reads_a_password_of_commas_equals_signs_and_backslashes_from_a_file(
    secured: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """A user made for the test with such a password, the rights of docs/deploy.md's job
    principal, and its settings in a properties file: status authenticates and lists."""
    user = f"job-{uuid.uuid4().hex[:6]}"
    password = f"p,a=s:s#w!o\\r d,sasl.username=x-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    scram = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    made = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(user, scram, password.encode())]
    )
    for future in made.values():
        future.result(30)
    bindings = [
        AclBinding(
            b.restype, b.name, b.resource_pattern_type, f"User:{user}", b.host, b.operation,
            b.permission_type,
        )
        for name in (CONTROL, "slackwater-")
        for b in rights(topics, "User:orders-job", name)
    ]  # fmt: skip
    change_acls(admin, True, bindings)
    settings = {**credentials("orders-job"), "sasl.username": user, "sasl.password": password}
    wait_until(lambda: sees(secured, settings, topics.control), DEADLINE_S, f"{user}'s rights")
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.marker(1, IDLE)
    client = properties_file(tmp_path / "job.properties", settings)
    status = run_cli(
        "status", "--bootstrap-servers", secured.bootstrap_servers,
        "--control-topic", topics.control, "--kafka-config-file", str(client),
        timeout_s=120,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert [tuple(line.split()[:2]) for line in status.stdout.splitlines()][:1] == [
        (f"{topics.data}:1", "IDLE")
    ]
    assert password not in status.stdout + status.stderr


def test_finish_takes_every_setting_from_the_environment_and_the_file(
    secured: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    """As in the emitter's container: SLACKWATER_* variables, the password in a file."""
    client = properties_file(tmp_path / "ops.properties", credentials("ops"))
    wait_until(lambda: sees(secured, credentials("ops"), topics.control), DEADLINE_S, "ops' rights")
    environment = {
        **os.environ,
        "SLACKWATER_BOOTSTRAP_SERVERS": secured.bootstrap_servers,
        "SLACKWATER_CONTROL_TOPIC": topics.control,
        "SLACKWATER_KAFKA_CONFIG_FILE": str(client),
    }
    result = subprocess.run(
        [*SLACKWATER, "finish", "--topic", topics.data, "--partition", "1"],
        capture_output=True, text=True, timeout=120, check=False, env=environment,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"finish requested for {topics.data}:1"), result.stdout
    assert result.stderr == ""


def test_finish_without_the_right_to_write_the_control_topic_is_one_line(
    secured: KafkaBroker, topics: Topics
) -> None:
    result = command_as(
        "orders-job",
        secured,
        topics,
        "finish",
        "--topic",
        topics.data,
        "--partition",
        "1",
        "--timeout",
        "10",
    )
    line = one_failure_line(result)
    assert "authorization failed" in line.lower(), line
    assert PASSWORDS["orders-job"] not in result.stderr + result.stdout


@pytest.mark.timeout(900)  # a Spark start on a busy machine
def test_a_job_on_the_source_reads_data_and_markers_with_its_own_principal(
    secured: KafkaBroker, topics: Topics, spark: SparkSession, tmp_path: Path
) -> None:
    # Data and markers written by the super user (standing for producers and the emitter).
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    for partition in (0, 1):
        write.data(partition, *range(7))
    frame = events(
        spark,
        secured.bootstrap_servers,
        [topics.data],
        topics.control,
        kafka_config=credentials("orders-job"),
    )
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        assert job.windows() == {(0, 5): 10}  # the watermark at 6 - 1 s
        write.marker(0, FINISHED)
        write.marker(1, FINISHED)
        job.settle()
        assert job.windows() == {(0, 5): 10, (5, 10): 4}
    finally:
        job.stop()


@pytest.mark.timeout(900)
def test_a_job_with_a_wrong_password_fails_in_one_line_naming_the_principal(
    secured: KafkaBroker, topics: Topics, spark: SparkSession, tmp_path: Path
) -> None:
    wrong = f"not-the-password-{uuid.uuid4().hex[:6]}"
    frame = events(
        spark,
        secured.bootstrap_servers,
        [topics.data],
        topics.control,
        kafka_config=credentials("orders-job", wrong),
    )
    job = window_job(spark, frame, tmp_path)
    try:
        # The query ends (it would wait for ever for a broker it "cannot reach")...
        with pytest.raises(StreamingQueryException) as ended:
            job.query.awaitTermination(int(DEADLINE_S * 2))
    finally:
        job.stop()
    # ... with the source's one line inside Spark's report, naming the principal.
    failure = str(ended.value)
    lines = [line for line in failure.splitlines() if "authentication failed" in line]
    assert len(lines) == 1, failure
    assert "SourceError: planner (driver): authentication failed as 'orders-job': " in lines[0], (
        failure
    )
    assert wrong not in failure


@pytest.mark.timeout(900)
def test_consume_runs_with_its_own_principal_and_logs_no_password(
    secured: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    for partition in (0, 1):
        write.data(partition, *range(7))
        write.marker(partition, FINISHED)
    log = tmp_path / "consume.log"
    output = tmp_path / "out"
    process = subprocess.Popen(
        [*SLACKWATER, *_consume_as("orders-job", secured, topics, tmp_path), "--log-level=DEBUG"],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_while_running(
            lambda: len(committed_rows(output)) == 2, 300, "both windows", process, log
        )
        process.terminate()
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    counts = sorted(
        (iso_ms(str(r["window_start"])) - BASE_MS, r["count"]) for r in committed_rows(output)
    )
    assert counts == [(0, 10), (5_000, 4)]
    assert PASSWORDS["orders-job"] not in log.read_text()


@pytest.mark.timeout(900)
def test_consume_with_a_wrong_password_exits_non_zero_in_one_line(
    secured: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    wrong = f"not-the-password-{uuid.uuid4().hex[:6]}"
    result = run_cli(*_consume_as("orders-job", secured, topics, tmp_path, wrong), timeout_s=300)
    line = one_failure_line(result)
    assert line.startswith(
        "slackwater consume: the streaming query failed: planner (driver): authentication "
        "failed as 'orders-job': "
    ), line
    assert wrong not in result.stderr + result.stdout


@pytest.mark.timeout(900)
def test_consume_without_the_right_to_read_the_data_topic_exits_non_zero_in_one_line(
    secured: KafkaBroker, topics: Topics, tmp_path: Path
) -> None:
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    read_data = rights(topics, "User:orders-job", DATA, {AclOperation.READ})
    change_acls(admin, False, read_data)
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.data(0, 1, 2)
    # Planned (Describe is allowed), then refused in an executor's reader task.
    result = run_cli(*_consume_as("orders-job", secured, topics, tmp_path), timeout_s=300)
    line = one_failure_line(result)
    assert line == (
        "slackwater consume: the streaming query failed: reader (executor): not authorized as "
        f"'orders-job' to read topic {topics.data} (partition 0): Fetch from broker 1 failed: "
        "Broker: Topic authorization failed"
    ), line


def _consume_as(
    user: str, node: KafkaBroker, topics: Topics, tmp: Path, password: str | None = None
) -> list[str]:
    """``slackwater consume``'s arguments for 5-second windows of ``topics``, as ``user``."""
    return [
        "consume",
        "--bootstrap-servers", node.bootstrap_servers,
        "--topic", topics.data, "--control-topic", topics.control,
        "--window", "5s", "--max-out-of-orderness", "1s", "--trigger", "300ms",
        "--output", str(tmp / "out"), "--checkpoint", str(tmp / "checkpoint"),
        *cli_credentials(user, password),
    ]  # fmt: skip


# A right of docs/deploy.md's job principal taken away (resource, operations), and what
# the source's one line then says it may not do.
MISSING_RIGHTS = {
    "read the data topic": (DATA, {AclOperation.READ}, "read topic {data} (partition 0)"),
    "read the control topic": (CONTROL, {AclOperation.READ}, "read control topic {control}"),
    "describe the control topic": (
        CONTROL, {AclOperation.READ, AclOperation.DESCRIBE}, "describe control topic {control}",
    ),
    "create the progress topic": (
        f"{CONTROL}.progress", {AclOperation.CREATE}, "create progress topic {control}.progress",
    ),
    "describe the progress topic an earlier run made": (
        f"{CONTROL}.progress",
        {AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE},  # each lets describe
        "describe progress topic {control}.progress",
    ),
    "write the progress topic": (
        f"{CONTROL}.progress", {AclOperation.WRITE}, "write progress topic {control}.progress",
    ),
    "describe its consumer groups": (
        "slackwater-", {AclOperation.DESCRIBE}, "describe consumer group slackwater-",
    ),
}  # fmt: skip


# The rights whose refusal an executor's reader meets (the planner's clients, the others).
READERS_RIGHTS = {"read the data topic", "write the progress topic"}


def _as_orders_job(node: KafkaBroker, topics: Topics) -> dict[str, str]:
    """The source's options on ``topics`` as docs/deploy.md's job principal."""
    return options(
        node.bootstrap_servers,
        topics.data,
        topics.control,
        **source_config(credentials("orders-job")),
    )


@pytest.mark.parametrize("missing", sorted(MISSING_RIGHTS))
def test_a_source_without_a_right_it_needs_fails_in_one_line_naming_it(
    secured: KafkaBroker, topics: Topics, missing: str
) -> None:
    name, operations, action = MISSING_RIGHTS[missing]
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    taken = rights(topics, "User:orders-job", name, operations)
    assert taken
    change_acls(admin, False, taken)
    if "an earlier run made" in missing:
        progress = NewTopic(f"{topics.control}.progress", num_partitions=1)
        assert create_topic(admin, progress, 30)
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.data(0, 1, 2)
    write.marker(1, IDLE)
    given = _as_orders_job(secured, topics)
    try:
        # The first plan, or the first batch's reading, ends with one line; never a wait
        # for a topic "not created yet", and never a query without markers.
        with pytest.raises(SourceError) as failed:
            driven = Driven.start(given)
            try:
                for _ in range(3):
                    driven.step()
            finally:
                driven.stop()
    finally:
        change_acls(admin, True, taken)  # the group ACL is shared by the module
    line = str(failed.value)
    assert "\n" not in line
    by = "reader (executor)" if missing in READERS_RIGHTS else "planner (driver)"
    assert line.startswith(
        f"{by}: not authorized as 'orders-job' to {action.format(**vars(topics))}"
    ), line
    assert "authorization failed" in line.lower(), line
    assert PASSWORDS["orders-job"] not in line


def test_a_data_topic_the_source_may_not_describe_is_waited_for_until_read_then_ends_it(
    secured: KafkaBroker, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka refuses a topic the principal may not describe whether it exists or not: a
    topic the query has not read yet may be one whose ACL comes with it, and is waited
    for (loudly); one it has read ends the query."""
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    data_rights = rights(topics, "User:orders-job", DATA)
    change_acls(admin, False, data_rights)
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.data(0, 1, 2)
    given = _as_orders_job(secured, topics)
    refused = f"not authorized as 'orders-job' to describe topic {topics.data}: "
    driven = Driven.start(given)
    try:
        assert driven.step() == []  # no partition of it: nothing planned, nothing read
        assert f"{refused}Broker: Topic authorization failed: waiting for it" in caplog.text
        change_acls(admin, True, data_rights)
        rows = driven.step()
        assert sorted((r["partition"], r["offset"]) for r in real(rows)) == [(0, 0), (0, 1)]
        change_acls(admin, False, data_rights)
        with pytest.raises(SourceError, match=f"^{re.escape(f'planner (driver): {refused}')}"):
            driven.step()
    finally:
        driven.stop()
        change_acls(admin, True, data_rights)


def _refused_read(node: KafkaBroker, topic: str) -> bool:
    """Whether orders-job is refused a read of ``topic`` now (a consumer of its own)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": node.bootstrap_servers,
            "group.id": f"slackwater-probe-{uuid.uuid4().hex[:6]}",
            **credentials("orders-job"),
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        messages = consumer.consume(10, timeout=3)
        errors = [error for m in messages if (error := m.error()) is not None]
        return any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors)
    finally:
        consumer.close()


def test_progress_refused_between_plans_then_allowed_again_ends_no_plan(
    secured: KafkaBroker, topics: Topics
) -> None:
    """The planner's progress consumer stays assigned between plans (issue 33), and a
    refusal it met there, the right given back before the next plan, is read again on an
    assignment of its own: it ends nothing. A refusal that lasts ends a plan in one line,
    as before: the first that needs a record fetched since."""
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    progress = f"{topics.control}.progress"
    read_progress = rights(topics, "User:orders-job", f"{CONTROL}.progress", {AclOperation.READ})
    assert read_progress
    write = Writer(secured.bootstrap_servers, topics.data, topics.control, credentials("admin"))
    write.data(0, 1, 2)
    given = _as_orders_job(secured, topics)
    driven = Driven.start(given)
    try:
        driven.step()  # reads [0, 2); its progress is written
        write.data(0, 3, 4)
        driven.step()  # takes that progress; the assignment stays, fetching
        assert driven.reader.progress._assigned is not None
        change_acls(admin, False, read_progress)
        wait_until(lambda: _refused_read(secured, progress), DEADLINE_S, "the read refused")
        time.sleep(2)  # the kept consumer's own fetches, every 500 ms, are refused too
        change_acls(admin, True, read_progress)
        wait_until(lambda: not _refused_read(secured, progress), DEADLINE_S, "the read back")
        for offset in (4, 5, 6):  # the refusal queued meanwhile is met in one of these
            write.data(0, offset + 1)
            rows = real(driven.step())  # no refusal ends it: it is read again on its own
            assert [(r["partition"], r["offset"]) for r in rows] == [(0, offset)]
        change_acls(admin, False, read_progress)
        wait_until(lambda: _refused_read(secured, progress), DEADLINE_S, "the read refused")
        with pytest.raises(SourceError) as refused:
            for offset in (7, 8, 9):  # records it fetched before the refusal come first
                write.data(0, offset + 1)
                driven.step()
        line = str(refused.value)
        assert line.startswith(
            f"planner (driver): not authorized as 'orders-job' to read progress topic {progress}"
        ), line
    finally:
        driven.stop()
        change_acls(admin, True, read_progress)
