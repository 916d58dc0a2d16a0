"""Apache Kafka itself on a loopback port: one KRaft node, broker and controller in one JVM.

What `slackwater broker`, the integration tests and `make demo` run (semantics.md §7), from the jars
set-up fetched (`slackwater.jars`). Start formats the log directory (unless it already holds a
formatted one), launches `kafka.Kafka` with its log in a file, and waits until the broker
answers metadata requests. Stop sends SIGTERM (Kafka's controlled shutdown) and, for a
temporary log directory, removes it. The same object can be started again on the same log
directory and ports: that is how tests take the broker away and bring it back.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO

from slackwater.cli_types import ensure_port_free
from slackwater.jars import KAFKA_BROKER, MissingJarsError, jar_files

_PR_SET_PDEATHSIG = 1
_HEAP = "-Xmx512m"

# Settings of every node (broker and controller in one JVM); anything else not in
# replication_settings is Apache Kafka's default.
_NODE_SETTINGS = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    # A lone consumer need not wait 3 s for others to join its group.
    "group.initial.rebalance.delay.ms": "0",
}


def replication_settings(nodes: int) -> dict[str, str]:
    """Replication for a cluster of ``nodes``: three replicas where there are three nodes,
    and a write acknowledged by all in-sync replicas needs two of them, as production
    clusters run; one node holds one replica of everything (internal topics included:
    Kafka's default of three cannot be placed on it)."""
    replicas = min(3, nodes)
    in_sync = min(2, replicas)
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(in_sync),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(in_sync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(in_sync),
    }


_LOG4J2_PROPERTIES = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class BrokerError(RuntimeError):
    """The broker could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on ``host``; BrokerError (one line) if ``host`` cannot be listened on
    at all (not an address, a name that does not resolve, not this machine's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as error:  # socket.gaierror for a name or address that is none
            raise BrokerError(f"cannot listen on {host!r}: {error.strerror or error}") from None
        port: int = sock.getsockname()[1]
        return port


def _check_port_free(host: str, port: int) -> None:
    problem = ensure_port_free(host, port)
    if problem is not None:
        raise BrokerError(f"port in use: {problem}")


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when its parent dies (no orphans)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: stop() still ends the child on every normal path


def cluster_id() -> str:
    """Kafka's cluster id format: a UUID as 22 characters of URL-safe base64.

    Never starting with "-" (as Kafka's own Uuid.randomUuid), which the format tool's
    argument parser would take for an option: one start in 64 would fail.
    """
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


class KafkaBroker:
    """One Apache Kafka KRaft node (broker + controller) on a loopback port: a cluster of
    its own, or one of a KafkaCluster's (which sets ``node_id``, ``cluster_id`` and
    ``quorum_voters`` for all its nodes)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        log_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
        log_level: str = "WARN",
        node_id: int = 1,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise BrokerError(f"invalid port {port}: must be between 1 and 65535")
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.controller_port = free_port(host)
        self.node_id = node_id
        # The quorum: this node alone unless a cluster says otherwise.
        self.quorum_voters = f"{node_id}@{host}:{self.controller_port}"
        self.cluster_id: str | None = None  # made at the first format unless given
        self.expected_brokers = 1  # ready when this many brokers are registered
        # For a secured node: the launcher's own clients' settings (its readiness check),
        # and more arguments to the format tool (SCRAM credentials: --add-scram).
        self.client_settings: dict[str, str] = {}
        self.format_arguments: list[str] = []
        self._keep_log_dir = log_dir is not None
        self.log_dir = log_dir
        self.settings = {**replication_settings(1), **(settings or {})}
        self.log_level = log_level
        self._process: subprocess.Popen[bytes] | None = None
        self._stdout: IO[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def server_log(self) -> Path:
        """The broker's own log (log4j); the JVM's stdout/stderr go beside it."""
        assert self.log_dir is not None
        return self.log_dir / "server.log"

    def start(self, timeout_s: float = 60.0) -> KafkaBroker:
        self.launch()
        try:
            self.wait_until_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Starts the node's process without waiting for it (a node of a three-voter
        quorum cannot be ready before the others have started too)."""
        if self._process is not None:
            raise BrokerError("broker already started")
        _check_port_free(self.host, self.port)
        _check_port_free(self.host, self.controller_port)
        try:
            classpath = os.pathsep.join(str(jar) for jar in jar_files(KAFKA_BROKER))
        except MissingJarsError as error:
            raise BrokerError(str(error)) from None
        made_here = self.log_dir is None
        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="slackwater-kafka-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        properties = self._write_config()
        if not (self.log_dir / "data" / "meta.properties").exists():
            try:
                self._format(classpath, properties)
            except BrokerError:
                if made_here:  # a temporary directory of ours: nothing to keep in it
                    shutil.rmtree(self.log_dir, ignore_errors=True)
                    self.log_dir = None
                raise
        self._stdout = open(self.log_dir / "stdout.log", "ab")  # noqa: SIM115
        self._process = subprocess.Popen(
            [*self._java(classpath), "kafka.Kafka", str(properties)],
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )

    def _java(self, classpath: str) -> list[str]:
        assert self.log_dir is not None
        java_home = os.environ.get("JAVA_HOME")
        return [
            os.path.join(java_home, "bin", "java") if java_home else "java",
            _HEAP,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log_dir / 'log4j2.properties'}",
            "-cp",
            classpath,
        ]

    def _write_config(self) -> Path:
        assert self.log_dir is not None
        settings = {
            **_NODE_SETTINGS,
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.quorum_voters,
            "listeners": (
                f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "log.dirs": str(self.log_dir / "data"),
            **self.settings,
        }
        properties = self.log_dir / "server.properties"
        properties.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.log_dir / "log4j2.properties").write_text(
            _LOG4J2_PROPERTIES.format(log_path=self.server_log, level=self.log_level)
        )
        return properties

    def _format(self, classpath: str, properties: Path) -> None:
        """KRaft needs a formatted log directory (kafka-storage.sh format) before a first
        start; every node of a cluster with the same cluster id."""
        if self.cluster_id is None:
            self.cluster_id = cluster_id()
        command = [
            *self._java(classpath),
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self.cluster_id,
            "--config",
            str(properties),
            *self.format_arguments,
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise BrokerError(f"formatting {self.log_dir} failed: {detail[-1] if detail else ''}")

    def wait_until_ready(self, timeout_s: float) -> None:
        """Ready when the broker's metadata answer lists the cluster's brokers, itself among
        them (its listener alone is not)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        admin = AdminClient(
            {**self.client_settings, "bootstrap.servers": self.bootstrap_servers, "log_level": 0}
        )
        while time.monotonic() < deadline:
            self.check_running()
            with contextlib.suppress(Exception):
                brokers = admin.list_topics(timeout=1).brokers
                if self.node_id in brokers and len(brokers) >= self.expected_brokers:
                    return
            time.sleep(0.1)
        raise BrokerError(f"broker not ready on {self.bootstrap_servers} in {timeout_s}s")

    def check_running(self) -> None:
        """BrokerError if the node's process has exited (its log named)."""
        assert self._process is not None
        if self._process.poll() is not None:
            raise BrokerError(
                f"broker exited with code {self._process.returncode} while starting"
                f" (log: {self.server_log})"
            )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        """Blocks until the broker process exits; returns its exit code."""
        assert self._process is not None
        return self._process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no controlled shutdown; the log directory stays."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
        self._release()

    def terminate(self) -> None:
        """SIGTERM without waiting (a cluster stops its nodes together)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()

    def stop(self, timeout_s: float = 30.0, *, remove_log_dir: bool | None = None) -> None:
        """SIGTERM (controlled shutdown); removes a temporary log directory unless told not to."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._release()
        remove = not self._keep_log_dir if remove_log_dir is None else remove_log_dir
        if remove and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None

    def restart(self, timeout_s: float = 60.0) -> KafkaBroker:
        """Stops (keeping the data) and starts again on the same log directory and ports."""
        self.stop(remove_log_dir=False)
        return self.start(timeout_s)

    def _release(self) -> None:
        self._process = None
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def __enter__(self) -> KafkaBroker:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
