"""The secured node: Apache Kafka with SASL/SCRAM-SHA-512, SASL_SSL, MTLS and Kafka's
StandardAuthorizer, the ACLs of docs/deploy.md, and its fixtures (registered for every
test by tests/conftest.py); see tests/spark/test_secured_kafka.py."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from emitter.control_topic import ControlTopicReader
from slackwater.java_check import java_executable
from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.markers import Marker, MarkerStatus
from tests.conftest import TEST_BROKER_SETTINGS
from tests.harness.factories import run_cli, wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


MECHANISM = "SCRAM-SHA-512"


PASSWORDS = {
    "admin": "admin-secret-0f3a",
    "slackwater-emitter": "emitter-secret-7c1d",
    "ops": "ops-secret-92be",
    "orders-job": "job-secret-4e05",
}


# The names docs/deploy.md's ACLs are written for; each test applies them to topics of its
# own (the fixture `topics`).
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


def tls_credentials(user: str, ca: Path) -> dict[str, str]:
    """``user``'s credentials on the SASL_SSL listener, trusting the certificate ``ca``
    (librdkafka verifies the broker's name, 127.0.0.1, against it: the default)."""
    return {**credentials(user), "security.protocol": "SASL_SSL", "ssl.ca.location": str(ca)}


@dataclass(frozen=True)
class Certificates:
    """The broker's keystore (PKCS12), its certificate in PEM for clients to trust, and
    another self-signed certificate in PEM that does not sign it; for the MTLS listener,
    the keystore of a client whose certificate (CN=orders-job) the broker's truststore
    holds."""

    keystore: Path
    broker: Path
    other: Path
    client: Path
    truststore: Path
    password: str = "keystore-secret-5a1c"


def _keytool(*arguments: str) -> None:
    keytool = Path(java_executable() or "java").resolve().parent / "keytool"
    subprocess.run([str(keytool), *arguments], check=True, capture_output=True, timeout=60)


def keytool_certificate(keystore: Path, pem: Path, password: str, name: str = "127.0.0.1") -> None:
    store = ["-keystore", str(keystore), "-storetype", "PKCS12", "-storepass", password]
    _keytool(
        "-genkeypair", "-alias", "key", "-keyalg", "RSA", "-keysize", "2048", "-validity", "2",
        "-dname", f"CN={name}", "-ext", "SAN=IP:127.0.0.1,DNS:localhost", "-keypass", password,
        *store,
    )  # fmt: skip
    _keytool("-exportcert", "-alias", "key", "-rfc", "-file", str(pem), *store)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    made = tmp_path_factory.mktemp("tls")
    certificates = Certificates(
        made / "broker.p12",
        made / "broker.pem",
        made / "other.pem",
        made / "orders-job.p12",
        made / "truststore.p12",
    )
    keytool_certificate(certificates.keystore, certificates.broker, certificates.password)
    keytool_certificate(made / "other.p12", certificates.other, certificates.password)
    client_pem = made / "orders-job.pem"
    keytool_certificate(certificates.client, client_pem, certificates.password, "orders-job")
    _keytool(
        "-importcert", "-noprompt", "-alias", "orders-job", "-file", str(client_pem),
        "-keystore", str(certificates.truststore), "-storetype", "PKCS12",
        "-storepass", certificates.password,
    )  # fmt: skip
    return certificates


def listener_address(node: KafkaBroker, name: str) -> str:
    """The address of the node's listener called ``name`` (SASL_SSL, MTLS)."""
    listeners = node.settings["advertised.listeners"].split(",")
    return next(entry for entry in listeners if entry.startswith(f"{name}://"))[len(f"{name}://") :]


def tls_bootstrap(node: KafkaBroker) -> str:
    """The SASL_SSL listener's address."""
    return listener_address(node, "SASL_SSL")


def mtls_credentials(certificates: Certificates) -> dict[str, str]:
    """orders-job's settings on the MTLS listener: its certificate, no password but the
    keystore's."""
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(certificates.broker),
        "ssl.keystore.location": str(certificates.client),
        "ssl.keystore.password": certificates.password,
    }


def cli_config(settings: dict[str, str]) -> list[str]:
    """Kafka client settings as a command's ``--kafka-config`` flags."""
    return [
        argument
        for key, value in settings.items()
        for argument in ("--kafka-config", f"{key}={value}")
    ]


def cli_credentials(user: str, password: str | None = None) -> list[str]:
    return cli_config(credentials(user, password))


def source_config(settings: dict[str, str]) -> dict[str, str]:
    """Kafka client settings as the source's ``kafka.*`` options."""
    return {f"kafka.{key}": value for key, value in settings.items()}


@dataclass(frozen=True)
class Topics:
    """A test's data and control topics, standing for docs/deploy.md's ``orders`` and
    ``slackwater.control``."""

    data: str
    control: str

    def renamed(self, name: str) -> str:
        """docs/deploy.md's resource name as this test's."""
        if name.startswith(CONTROL):
            return self.control + name[len(CONTROL) :]  # the control topic, .progress
        return self.data if name == DATA else name


def command_as(
    user: str,
    node: KafkaBroker,
    topics: Topics,
    command: str,
    *arguments: str,
    password: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``slackwater <command>`` on the control topic, with ``user``'s credentials."""
    return run_cli(
        command,
        "--bootstrap-servers",
        node.bootstrap_servers,
        "--control-topic",
        topics.control,
        *arguments,
        *cli_credentials(user, password),
        timeout_s=120,
    )


def one_failure_line(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one line of its own on stderr and no traceback: that line."""
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("slackwater")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def acls_of_deploy_md(topics: Topics | None = None) -> list[AclBinding]:
    """Every ``$ACLS ... --add`` command of docs/deploy.md's ACL section, as Admin API
    bindings (for ``topics`` instead of its example names): the document itself is what
    is applied."""
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
                    name if topics is None or kind != ResourceType.TOPIC else topics.renamed(name),
                    pattern,
                    options["--allow-principal"][0],
                    "*",
                    AclOperation[operation.upper()],
                    AclPermissionType.ALLOW,
                )
            )
    return bindings


@pytest.fixture(scope="module")
def secured(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[KafkaBroker]:
    node = KafkaBroker(
        log_dir=Path(tmp_path_factory.mktemp("kafka-secured")), settings=TEST_BROKER_SETTINGS
    )
    admin_login = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{PASSWORDS["admin"]}";'
    )
    plain = f"SASL_PLAINTEXT://{node.host}:{node.port}"
    tls = f"SASL_SSL://{node.host}:{free_port(node.host)}"
    mtls = f"MTLS://{node.host}:{free_port(node.host)}"
    node.settings.update(
        {
            "listeners": f"{plain},{tls},{mtls},CONTROLLER://{node.host}:{node.controller_port}",
            "advertised.listeners": f"{plain},{tls},{mtls}",
            "listener.security.protocol.map": (
                "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT"
            ),
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": admin_login,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": admin_login,
            "ssl.keystore.location": str(certificates.keystore),
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.password": certificates.password,
            "ssl.key.password": certificates.password,
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.mtls.ssl.truststore.location": str(certificates.truststore),
            "listener.name.mtls.ssl.truststore.type": "PKCS12",
            "listener.name.mtls.ssl.truststore.password": certificates.password,
            # CN=orders-job is User:orders-job: docs/deploy.md's ACLs apply to it as written.
            "listener.name.mtls.ssl.principal.mapping.rules": "RULE:^CN=([^,]*)$/$1/,DEFAULT",
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
        yield node
    finally:
        node.stop()


@pytest.fixture
def topics(secured: KafkaBroker) -> Topics:
    """Fresh topics with docs/deploy.md's ACLs on them. The control topic is made here,
    as an operator would, so that a test can run without the emitter (its principal may
    make it too)."""
    mine = Topics(f"orders-{uuid.uuid4().hex[:8]}", f"slackwater.control-{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": secured.bootstrap_servers, **credentials("admin")})
    made = admin.create_topics(
        [
            NewTopic(mine.data, num_partitions=2),
            NewTopic(mine.control, num_partitions=1, config={"cleanup.policy": "compact"}),
        ]
    )
    for future in made.values():
        future.result(30)
    for future in admin.create_acls(acls_of_deploy_md(mine)).values():
        future.result(30)
    return mine


def markers_read(node: KafkaBroker, topics: Topics, user: str) -> list[Marker]:
    reader = ControlTopicReader(node.bootstrap_servers, topics.control, credentials(user), 5.0)
    try:
        return [r for r in reader.read_to_end().records if isinstance(r, Marker)]
    finally:
        reader.close()


def statuses(node: KafkaBroker, topics: Topics, user: str) -> list[tuple[int, MarkerStatus]]:
    """Each marker's partition and status, in partition order, as ``user`` reads them."""
    return sorted((m.partition, m.status) for m in markers_read(node, topics, user))


def wait_for_idle_markers(node: KafkaBroker, topics: Topics, user: str) -> None:
    wait_until(
        lambda: statuses(node, topics, user) == [(0, IDLE), (1, IDLE)],
        DEADLINE_S,
        f"IDLE markers on both partitions, read as {user}",
    )


def rights(
    topics: Topics, principal: str, name: str, operations: set[AclOperation] | None = None
) -> list[AclBinding]:
    """docs/deploy.md's bindings of ``principal`` on the resource ``name`` (its example
    name: this test's topics stand for it), those of ``operations`` if given."""
    return [
        b
        for b in acls_of_deploy_md(topics)
        if b.principal == principal
        and b.name == topics.renamed(name)
        and (operations is None or b.operation in operations)
    ]


def sees(node: KafkaBroker, settings: dict[str, str], topic: str) -> bool:
    """Whether a client with ``settings`` authenticates and is shown ``topic`` (ACLs just
    made reach the broker's authorizer a moment later)."""
    client = AdminClient({"bootstrap.servers": node.bootstrap_servers, **settings, "log_level": 0})
    try:
        return topic in client.list_topics(timeout=5).topics
    except KafkaException:
        return False


def change_acls(admin: AdminClient, present: bool, bindings: list[AclBinding]) -> None:
    """``bindings`` created (``present``) or deleted, returning once the broker's
    authorizer shows the change (DescribeAcls is answered from it): the next request
    meets the new rights."""
    filters = [acl_filter(b) for b in bindings]
    change = admin.create_acls(bindings) if present else admin.delete_acls(filters)
    for future in change.values():
        future.result(30)
    wait_until(
        lambda: all(bool(admin.describe_acls(f).result(30)) == present for f in filters),
        DEADLINE_S,
        f"ACLs {'created' if present else 'deleted'}",
    )


def acl_filter(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )
