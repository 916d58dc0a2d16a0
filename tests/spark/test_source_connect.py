"""The slackwater source from a Spark Connect client (issue 32, item 4): the job is built
in this process, a client of a Connect server, and runs in the server's driver; the
source's planner and readers run in the server's Python workers.

The server is a process of its own (``spark-submit --class SparkConnectServer``, from
pyspark's own jars), one for the module. ``SparkSession.builder.remote("local[2]")``
would start one inside this process instead, from a classic SparkContext, and refuses
when the suite's classic session (the ``spark`` fixture) exists. The client session
marks this process a Connect client (``SPARK_CONNECT_MODE_ENABLED``: every
``pyspark.sql.functions`` call then builds a Connect column, and no SparkContext may
start), so the ``remote`` fixture takes the mark away again after the module.

Each run is checked as ``tests/spark/test_source_available_now.py`` checks it: the windows
the valve allows, against Spark's batch ``groupBy(window)`` over the topic's records
read back with Spark's own Kafka reader (on the server: the Kafka jar is there for that
reference alone; the source does not need it)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from slackwater.jars import SPARK_KAFKA, fetched_jar_files
from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.markers import MarkerStatus
from spark_consumer.consume.job import QUIET_LOG4J, THREAD_STACK
from spark_consumer.source import SlackwaterKafkaSource, serve_source_metrics, with_valve_watermark
from spark_consumer.source.shared.options import (
    EVENT_TIME,
    WATERMARK_DELAY_METADATA,
    WATERMARK_DELAY_MS,
)
from spark_consumer.source.stream import task_options
from tests.harness.factories import ROOT, scrape_metrics
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import wait_while_running
from tests.harness.source_jobs import OUT_OF_ORDERNESS_S, ScheduledJob, batch_windows, window_job

CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
PARTITIONS = 2


@dataclass
class ConnectServer:
    """A Spark Connect server on a loopback port, and the log of its process."""

    process: subprocess.Popen[bytes]
    port: int
    token: str
    log: Path

    @property
    def url(self) -> str:
        # "localhost": with a token and no TLS, pyspark's client sends the token only
        # over a local connection to a host of that name.
        return f"sc://localhost:{self.port}/;token={self.token}"

    def stop(self, timeout_s: float = 60) -> None:
        """SIGTERM to the driver (its shutdown hook stops Spark and its Python workers);
        SIGKILL to the whole process group if it has not ended in time."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_connect_server(log: Path, timeout_s: float = 180) -> ConnectServer:
    """A Connect server from pyspark's own jars and ``spark-submit``, with the settings
    of ``spark_consumer.consume.job.spark_session`` that a server can take (UTC, the
    threads' stack, the quiet log); its Python workers run this interpreter, which
    imports ``spark_consumer`` and ``slackwater`` (also by PYTHONPATH). Returns once its
    port takes connections."""
    spark_home = str(Path(pyspark.__file__).parent)  # pyspark's own, whatever SPARK_HOME says
    port, token = free_port(), uuid.uuid4().hex
    env = {
        **os.environ,
        "SPARK_HOME": spark_home,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        # Read by the server from its environment: not on its command line.
        "SPARK_CONNECT_AUTHENTICATE_TOKEN": token,
    }
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.extraJavaOptions": f"{THREAD_STACK} -Dlog4j2.configurationFile={QUIET_LOG4J}",
        "spark.jars": ",".join(str(jar) for jar in fetched_jar_files(SPARK_KAFKA)),
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    command = [os.path.join(spark_home, "bin", "spark-submit"), "--master", "local[2]"]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command += ["--class", CONNECT_SERVER]
    with log.open("ab") as output:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = ConnectServer(process, port, token, log)
    try:
        wait_while_running(
            lambda: _accepts(port), timeout_s, "the Connect server's port", process, log
        )
    except BaseException:
        server.stop()
        raise
    return server


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One Connect server for the module; stopped also when a test fails."""
    server = start_connect_server(tmp_path_factory.mktemp("connect") / "server.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def remote(connect_server: ConnectServer) -> Iterator[SparkSession]:
    """A Connect client session (``create``: ``getOrCreate`` refuses while a classic
    session exists in the process); this process is a Connect client until the module
    ends, then classic again for the other modules."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
        session = SparkSession.builder.remote(connect_server.url).create()
        try:
            yield session
        finally:
            session.stop()


def _write(writer: Writer, seconds: range) -> None:
    """Records at ``seconds``, dealt round the partitions (each in order)."""
    for second in seconds:
        writer.data(second % PARTITIONS, second)


def _mark_all(writer: Writer, status: MarkerStatus) -> None:
    for partition in range(PARTITIONS):
        writer.marker(partition, status)


def test_a_streaming_job_from_a_connect_client_gets_the_windows_the_valve_allows(
    remote: SparkSession,
    broker: KafkaBroker,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic, control = new_topic(partitions=PARTITIONS), new_topic(prefix="control")
    writer = Writer(broker.bootstrap_servers, topic, control)
    # The two-line form: the DataSource registered from the client, found by its name.
    remote.dataSource.register(SlackwaterKafkaSource)
    frame = (
        remote.readStream.format("slackwater-kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("controlTopic", control)
        .option("maxOutOfOrderness", f"{OUT_OF_ORDERNESS_S}s")
        .load()
    )
    # The delay reaches the client with the column, so with_valve_watermark applies it.
    assert frame.schema[EVENT_TIME].metadata == {WATERMARK_DELAY_METADATA: WATERMARK_DELAY_MS}
    assert task_options(remote) == {}  # no SparkContext: no tasksPerBatch is passed
    writer.data(0, *range(0, 30))
    writer.data(1, *range(0, 10))
    job = window_job(remote, with_valve_watermark(frame), tmp_path, window="10 seconds")
    try:
        job.settle()
        # Partition 1 lags at 9 s: the valve holds at 8 s, no window has closed.
        offset = job.source_offset()
        assert offset["watermark"] == BASE_MS + 8_000
        # The planner's default: its cores (the server's machine is this one).
        assert offset["tasks"] == os.cpu_count()
        assert job.windows() == {}
        writer.marker(1, MarkerStatus.IDLE)  # at its log end
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 28_000  # partition 0's alone
        assert job.watermark_ms() == BASE_MS + 28_000  # Spark's own watermark is the valve's
        assert job.windows() == {(0, 10): 20, (10, 20): 10}
        # The source's /metrics served from the client: it reads the query's progress.
        server = serve_source_metrics(lambda: [job.query], port=free_port(), host="127.0.0.1")
        try:
            metrics = scrape_metrics(f"http://127.0.0.1:{server.port}/metrics")
        finally:
            server.stop()
        assert metrics[f'slackwater_source_up{{query="{job.table}"}}'] == 1
        watermark = metrics[f'slackwater_source_valve_watermark_ms{{query="{job.table}"}}']
        assert watermark == BASE_MS + 28_000
        _mark_all(writer, MarkerStatus.FINISHED)  # every partition ended: every window closes
        job.settle()
        assert job.source_offset()["status"] == "FINISHED"
        assert job.windows() == {(0, 10): 20, (10, 20): 10, (20, 30): 10}
    finally:
        job.stop()


def test_available_now_runs_from_a_connect_client_emit_each_window_once(
    remote: SparkSession,
    broker: KafkaBroker,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic, control = new_topic(partitions=PARTITIONS), new_topic(prefix="control")
    writer = Writer(broker.bootstrap_servers, topic, control)
    job = ScheduledJob(remote, broker.bootstrap_servers, topic, control, tmp_path)
    for run, seconds in enumerate([range(0, 80), range(80, 150)], start=1):
        _write(writer, seconds)
        _mark_all(writer, MarkerStatus.IDLE)
        progress = job.run(maxOffsetsPerTrigger=20)
        # Over Connect a progress has no top-level numInputRows (the server's JSON leaves
        # it out; classic pyspark asks the JVM): its source's has.
        read = [p["sources"][0]["numInputRows"] for p in progress]
        # 70 or 80 records in batches of at most 20 (+1: the synthetic row).
        assert len([r for r in read if r > 1]) >= 4, read
        assert max(read) <= 21, read
        # Every partition IDLE: the valve is the newest partition's watermark.
        newest = max(seconds)
        closed_by = BASE_MS + (newest - OUT_OF_ORDERNESS_S) * 1000
        expected = batch_windows(remote, broker.bootstrap_servers, topic, closed_by)
        assert [start for start, _ in expected] == list(range(0, newest - 10, 10)), run
        assert job.rows() == expected, run  # both runs' rows: each window once
