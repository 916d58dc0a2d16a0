"""Shared fixtures: one Apache Kafka broker per test session, fresh topics per test.

The tests live in folders by what they start (``pure``, ``kafka``, ``spark``, ``cluster``);
their harness in ``harness``. The folder sets the marks: ``pytest tests/pure`` (``make
quick``) runs the tests that start nothing, in under a minute.
"""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from slackwater import kafka_clients
from slackwater.kafka_broker import KafkaBroker
from slackwater.kafka_cluster import KafkaCluster
from spark_consumer.source.executor import reader_clients

if TYPE_CHECKING:
    from tests.harness.emitter import RunningEmitter


# The secured node's fixtures (``secured``, ``certificates``, ``topics``) for the tests
# that need one, beside this module's.
pytest_plugins = ["tests.harness.secured"]

# A test's folder says what it starts, and marks it so: ``pure`` starts nothing (no
# broker, no Spark; ``make quick``), ``kafka`` starts Apache Kafka, ``spark`` Spark on
# Kafka, ``cluster`` three Kafka nodes.
INTEGRATION_FOLDERS = {"kafka", "spark", "cluster"}


# The order the folders run in: the longest files first, so that under ``make test``'s
# two processes (pytest-xdist, a file to a process) the many short tests of ``pure``
# fill the end instead of one process running a long Spark file alone.
FOLDER_ORDER = {"spark": 0, "cluster": 1, "kafka": 2, "pure": 3}
# Files of a minute or more of one test (SIGKILLs and restarts of Spark jobs): first.
LONGEST_FILES = {
    "test_consume_command.py",
    "test_consume_backfill.py",
    "test_examples.py",
    "test_demo.py",
    "test_cluster_faults.py",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """make test's two processes (``--dist loadfile``) take a file whole, with its module
    fixtures made once, and the cluster folder whole: never two three-node clusters at
    once on two cores (its tests are written for one beside Spark). (xdist's own
    ``loadgroup`` does not group under pytest 9: the group it appends to a test's id
    does not reach the id.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class FilesAndTheClusterFolder(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return (
                CLUSTER_SCOPE if nodeid.startswith(CLUSTER_SCOPE) else super()._split_scope(nodeid)
            )

    return FilesAndTheClusterFolder(config, log)


CLUSTER_SCOPE = "tests/cluster/"


def _run_order(item: pytest.Item) -> tuple[int, bool]:
    path = Path(str(item.fspath))
    return FOLDER_ORDER.get(path.parent.name, 0), path.name not in LONGEST_FILES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in INTEGRATION_FOLDERS:
            item.add_marker(pytest.mark.integration)
        if folder == "cluster":
            item.add_marker(pytest.mark.cluster)
    # (A stable sort: each file's tests keep their order.)
    items.sort(key=_run_order)


# Everything not here is Apache Kafka's default.
TEST_BROKER_SETTINGS = {
    # Tests write fixed event times (2023, tests/harness/kafka_writer.BASE_MS) as record
    # timestamps; time-based retention (7 days) would delete them 30 s after start.
    "log.retention.ms": "-1",
    # The log cleaner looks for dirty logs every 15 s; the compaction test need not wait.
    "log.cleaner.backoff.ms": "200",
    # The emitters' election tests use a 2 s session (Kafka's floor is 6 s): their
    # takeovers wait for the group's verdict, this only shortens them.
    "group.min.session.timeout.ms": "1000",
}


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """Apache Kafka on a free loopback port; stopped even when tests fail."""
    log_dir = Path(tmp_path_factory.mktemp("kafka"))
    kafka = KafkaBroker(log_dir=log_dir, settings=TEST_BROKER_SETTINGS).start()
    try:
        yield kafka
    finally:
        # Kafka clients that tests left for the garbage collector go first, while the
        # broker still answers; else librdkafka logs refused connections at exit.
        gc.collect()
        reader_clients.close_all()  # the readers' pooled clients (tests read in-process)
        kafka.stop()


CLUSTER_SETTINGS = {
    **TEST_BROKER_SETTINGS,
    # A killed node is fenced, and its partitions led by another, after 3 s instead of
    # Kafka's 9 s: the fault tests wait for events, this only shortens them.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three Apache Kafka KRaft nodes for the tests of one module (three JVMs are not
    kept beside the rest of the suite); a test that kills nodes gets them back from
    ``all_nodes_running``."""
    log_dir = Path(tmp_path_factory.mktemp("kafka-cluster"))
    kafka = KafkaCluster(3, log_dir=log_dir, settings=CLUSTER_SETTINGS).start()
    try:
        yield kafka
    finally:
        gc.collect()
        kafka.stop()


@pytest.fixture
def all_nodes_running(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The cluster, with every node it lost during the test started again after it."""
    yield cluster
    cluster.start_nodes([node.node_id for node in cluster.nodes if not node.running])


@pytest.fixture(scope="session")
def admin(broker: KafkaBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


TopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(admin: AdminClient) -> TopicFactory:
    """Creates a topic with a fresh uuid name and returns the name once it is usable.

    CreateTopics answers when the controller has the topic; the broker serves it a moment
    later (metadata without it, or partitions without a leader). Tests that read offsets
    at once wait here for every partition's leader, not in product code.
    """

    def create(partitions: int = 1, prefix: str = "t", **config: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)]
        )
        futures[name].result(10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if kafka_clients.all_partitions_led(admin, name, partitions) and _offsets_served(
                admin, name, partitions
            ):
                return name
            time.sleep(0.05)
        raise AssertionError(f"topic {name} has no leader for every partition after 30 s")

    return create


def _offsets_served(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Every partition's leader answers ListOffsets (NOT_LEADER for a moment after creation)."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets({TopicPartition(topic, p): latest for p in range(partitions)})
    try:
        for future in futures.values():
            future.result(timeout=10)
    except KafkaException:
        return False
    return True


EmitterFactory = Callable[..., "RunningEmitter"]


@pytest.fixture
def emitters(broker: KafkaBroker) -> Iterator[EmitterFactory]:
    """Starts emitters on the session broker; stops every one, also when a test fails."""
    from tests.harness.emitter import start_emitter

    started: list[RunningEmitter] = []

    def start(**settings: object) -> RunningEmitter:
        settings.setdefault("bootstrap_servers", broker.bootstrap_servers)
        running = start_emitter(**settings)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


@pytest.fixture(scope="session")
def spark(broker: KafkaBroker) -> Iterator[object]:
    """One local SparkSession for every Spark test (starting one takes seconds).

    It depends on ``broker`` so that it stops first, with the clients its queries hold.
    """
    from spark_consumer.consume.job import spark_session

    session = spark_session("slackwater-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def jvm_stderr(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """A file that receives what the Python processes Spark starts during the test write
    to stderr (the JVM copies a process's stderr to its ``System.err`` of the time the
    process starts)."""
    jvm: Any = spark._jvm
    path = tmp_path / "stderr.txt"
    stream = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(str(path)), True)
    before = jvm.java.lang.System.err
    jvm.java.lang.System.setErr(stream)
    try:
        yield path
    finally:
        jvm.java.lang.System.setErr(before)
        stream.close()
