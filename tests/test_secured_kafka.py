"""Apache Kafka with SASL/SCRAM-SHA-512 and Kafka's StandardAuthorizer
(``allow.everyone.if.no.acl.found=false``), and the ACLs of docs/deploy.md applied to it
as written there: only the emitter's and the operators' principals can write the control
topic (issue 23).

One node for the module: its client listener is SASL_PLAINTEXT, the brokers talk to
each other as the super user ``admin``; the controller listener stays PLAINTEXT (its
ANONYMOUS principal is a super user, as KRaft needs for a combined node).
"""

from __future__ import annotations

import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from emitter.control_topic import ControlTopicReader
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus, encode
from tests.conftest import TEST_BROKER_SETTINGS
from tests.emitter_harness import start_emitter
from tests.factories import run_cli, wait_until

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
MECHANISM = "SCRAM-SHA-512"
PASSWORDS = {
    "admin": "admin-secret-0f3a",
    "slackwater-emitter": "emitter-secret-7c1d",
    "ops": "ops-secret-92be",
    "orders-job": "job-secret-4e05",
}
# The names docs/deploy.md's ACLs are written for.
CONTROL, DATA, GROUP = "slackwater.control", "orders", "orders-consumers"
DEADLINE_S = 60.0
IDLE, FINISHED = MarkerStatus.IDLE, MarkerStatus.FINISHED


def credentials(user: str, password: str | None = None) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": PASSWORDS[user] if password is None else password,
    }


def cli_credentials(user: str, password: str | None = None) -> list[str]:
    return [
        argument
        for key, value in credentials(user, password).items()
        for argument in ("--kafka-config", f"{key}={value}")
    ]


def _command_as(
    user: str, node: KafkaBroker, command: str, *arguments: str, password: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``slackwater <command>`` on the control topic, with ``user``'s credentials."""
    return run_cli(
        command,
        "--bootstrap-servers",
        node.bootstrap_servers,
        "--control-topic",
        CONTROL,
        *arguments,
        *cli_credentials(user, password),
        timeout_s=120,
    )


def _one_failure_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one line of its own on stderr and no traceback: that line."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("slackwater")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def acls_of_deploy_md() -> list[AclBinding]:
    """Every ``$ACLS ... --add`` command of docs/deploy.md's ACL section, as Admin API
    bindings: the document itself is what is applied."""
    section = DEPLOY.read_text().split("## Who may write the control topic", 1)[1]
    script = section.split("```sh", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    bindings = []
    for line in script.splitlines():
        if not line.strip().startswith("$ACLS"):
            continue
        words = shlex.split(line)[1:]
        options: dict[str, list[str]] = {}
        for flag, value in zip(words[::2], words[1::2], strict=True):
            options.setdefault(flag, []).append(value)
        kind, name = (
            (ResourceType.TOPIC, options["--topic"][0])
            if "--topic" in options
            else (ResourceType.GROUP, options["--group"][0])
        )
        pattern = ResourcePatternType[
            options.get("--resource-pattern-type", ["literal"])[0].upper()
        ]
        for operation in options["--operation"]:
            bindings.append(
                AclBinding(
                    kind,
                    name,
                    pattern,
                    options["--allow-principal"][0],
                    "*",
                    AclOperation[operation.upper()],
                    AclPermissionType.ALLOW,
                )
            )
    return bindings


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    node = KafkaBroker(
        log_dir=Path(tmp_path_factory.mktemp("kafka-secured")), settings=TEST_BROKER_SETTINGS
    )
    admin_login = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{PASSWORDS["admin"]}";'
    )
    node.settings.update(
        {
            "listeners": (
                f"SASL_PLAINTEXT://{node.host}:{node.port},"
                f"CONTROLLER://{node.host}:{node.controller_port}"
            ),
            "advertised.listeners": f"SASL_PLAINTEXT://{node.host}:{node.port}",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": admin_login,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": "User:admin;User:ANONYMOUS",
        }
    )
    node.format_arguments = [
        argument
        for user, password in PASSWORDS.items()
        for argument in ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")
    ]
    node.client_settings = credentials("admin")
    node.start()
    try:
        admin = AdminClient({"bootstrap.servers": node.bootstrap_servers, **credentials("admin")})
        admin.create_topics([NewTopic(DATA, num_partitions=2)])[DATA].result(30)
        # Made here, as an operator would, so that each test can run alone (the emitter
        # would make it too: its principal may).
        admin.create_topics(
            [NewTopic(CONTROL, num_partitions=1, config={"cleanup.policy": "compact"})]
        )[CONTROL].result(30)
        for future in admin.create_acls(acls_of_deploy_md()).values():
            future.result(30)
        yield node
    finally:
        node.stop()


def _markers(node: KafkaBroker, user: str) -> list[Marker]:
    reader = ControlTopicReader(node.bootstrap_servers, CONTROL, credentials(user), 5.0)
    try:
        return [r for r in reader.read_to_end().records if isinstance(r, Marker)]
    finally:
        reader.close()


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
    secured: KafkaBroker,
) -> None:
    running = start_emitter(
        bootstrap_servers=secured.bootstrap_servers,
        topics=[DATA],
        control_topic=CONTROL,
        group=GROUP,
        kafka_config=credentials("slackwater-emitter"),
    )
    try:
        # The emitter made the control topic and published with its own rights; a job's
        # principal reads what it published.
        wait_until(
            lambda: (
                sorted((m.partition, m.status) for m in _markers(secured, "orders-job"))
                == [(0, IDLE), (1, IDLE)]
            ),
            DEADLINE_S,
            "IDLE markers read by the job's principal",
        )
        # A job's principal forges a well-formed FINISHED: the broker refuses it.
        forged = Marker(
            topic=DATA,
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
            CONTROL, value, key=key, on_delivery=lambda error, _m: outcome.append(error)
        )
        producer.flush(30)
        assert len(outcome) == 1 and outcome[0] is not None
        assert outcome[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # An operator's finish request is allowed; the emitter turns it into FINISHED.
        result = _command_as("ops", secured, "finish", "--topic", DATA, "--partition", "0")
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: (
                [(m.partition, m.status) for m in _markers(secured, "orders-job")][-1:]
                == [(0, FINISHED)]
            ),
            DEADLINE_S,
            "FINISHED for orders:0 after the operator's request",
        )
        markers = _markers(secured, "orders-job")
        assert all(m.emitter_id != "forger" for m in markers)
        # No password in what the emitter serves.
        served = running.metrics_text() + str(running.status())
        assert not any(password in served for password in PASSWORDS.values())
    finally:
        running.stop()


@pytest.mark.parametrize("command", ["finish", "status"])
def test_wrong_credentials_are_one_line_and_a_non_zero_exit(
    secured: KafkaBroker, command: str
) -> None:
    arguments = (
        ["--topic", DATA, "--partition", "0", "--timeout", "10"] if command == "finish" else []
    )
    wrong = f"not-the-password-{uuid.uuid4().hex[:6]}"
    result = _command_as("ops", secured, command, *arguments, password=wrong)
    line = _one_failure_line(result)
    assert line.startswith(f"slackwater {command}: ")
    assert "authentication failed as 'ops'" in line
    assert wrong not in result.stderr + result.stdout


def test_finish_without_the_right_to_write_the_control_topic_is_one_line(
    secured: KafkaBroker,
) -> None:
    result = _command_as(
        "orders-job", secured, "finish", "--topic", DATA, "--partition", "1", "--timeout", "10"
    )
    line = _one_failure_line(result)
    assert "authorization failed" in line.lower(), line
    assert PASSWORDS["orders-job"] not in result.stderr + result.stdout
