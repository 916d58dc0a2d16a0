"""A query on the source stops cleanly (issue 31, finding 12), whether the stop finds it
planning (the planner waiting in ``latestOffset``) or reading (its foreachBatch function's
own Spark job running the readers).

Before: a stop while the function's job ran printed ``Exception in thread "stream execution
thread ..." java.lang.StackOverflowError`` (Spark's regex over the py4j error's JVM stack
trace ran out of the thread's stack; every such stop here), and the source's ``stop``
never ran (Spark's SIGTERM ended the planner's process first; every stop).
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.types import StructType

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SlackwaterKafkaSource, stream_options
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.shared.options import SourceOptions
from tests.conftest import TopicFactory
from tests.harness.factories import wait_until
from tests.harness.kafka_writer import Writer

# Stops of each kind. Before the fix a stop while reading printed the StackOverflowError
# every time (15 of 15), and no stop ran the source's stop (6 of 6 here).
STOPS = 3


def test_a_query_stops_cleanly_while_it_plans_and_while_it_reads(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for partition in range(2):
        write.data(partition, *range(20))
    marks = tmp_path / "marks"
    marks.mkdir()
    source = _marked_source(marks)
    spark.dataSource.register(source)
    frame = (
        spark.readStream.format(source.name())
        .options(**stream_options(bootstrap_servers=broker.bootstrap_servers, topics=[topic]))
        .option("controlTopic", control)
        .option("progressTimeoutMs", "300000")  # a plan waits for progress until stopped
        .load()
    )
    threads_before = set(threading.enumerate())
    log = tmp_path / "spark.log"
    not_stopped = []
    with _spark_log(spark, log):
        for run in range(STOPS):
            for phase in ("plans", "reads"):
                _stop_while(spark, phase, frame, write, tmp_path / f"checkpoint-{phase}-{run}")
                planners = _pids(marks, "planned")
                assert planners, "no planner seen"
                for pid in planners:
                    # The planner's process ends, and every Kafka client of the planner
                    # with it; the source's stop began in it before.
                    _wait_ended(pid)
                    if not (marks / f"stopped-{pid}").exists():
                        not_stopped.append(f"the {phase} stop {run}'s (planner {pid})")
                    (marks / f"planned-{pid}").unlink()
        # No task of the stopped queries still runs in a Python worker.
        tracker = spark.sparkContext.statusTracker()
        wait_until(lambda: not tracker.getActiveJobsIds(), 30, "the stopped queries' jobs to end")
    problems = _errors(log.read_text()) + [f"the source's stop never ran: {s}" for s in not_stopped]
    assert problems == [], "\n".join(problems[:40])
    assert _new_threads(threads_before) == []


def _stop_while(
    spark: SparkSession, phase: str, frame: DataFrame, write: Writer, checkpoint: Path
) -> None:
    """Starts a query with a foreachBatch sink and stops it while it plans or reads."""
    called = threading.Event()

    def each(batch: DataFrame, batch_id: int) -> None:
        called.set()
        if phase == "reads":
            batch.count()  # the stop finds this job reading

    query = (
        frame.writeStream.foreachBatch(each)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        assert called.wait(120), f"no batch reached foreachBatch ({phase})"
        if phase == "plans":
            # The batch was not read: the next plan, which sees one more record, waits
            # for the readers' progress of that batch until the stop ends it.
            write.data(0, 100)
            wait_until(lambda: query.status["message"].startswith("Getting offsets"), 60, "a plan")
        query.stop()
        assert query.exception() is None
        stream_threads = [name for name in _jvm_threads(spark) if str(query.runId) in name]
        assert stream_threads == [], stream_threads
    finally:
        if query.isActive:
            query.stop()


def _marked_source(marks: Path) -> type[SlackwaterKafkaSource]:
    """The source under a name of its own, its planner leaving a mark when it plans and
    when its stop begins (a class made here is shipped to Spark's planner by value)."""

    class MarkedReader(SlackwaterStreamReader):
        def initialOffset(self) -> dict[str, Any]:  # noqa: N802
            (marks / f"planned-{os.getpid()}").touch()
            return super().initialOffset()

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
            (marks / f"planned-{os.getpid()}").touch()
            return super().latestOffset(start, limit)

        def stop(self) -> None:
            (marks / f"stopped-{os.getpid()}").touch()
            super().stop()

    named = f"slackwater-stop-{uuid.uuid4().hex[:6]}"

    class MarkedSource(SlackwaterKafkaSource):
        @classmethod
        def name(cls) -> str:
            return named

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
            return MarkedReader(SourceOptions.parse(dict(self.options)))

    return MarkedSource


def _pids(marks: Path, kind: str) -> list[int]:
    return sorted(int(path.name.rsplit("-", 1)[1]) for path in marks.glob(f"{kind}-*"))


def _wait_ended(pid: int) -> None:
    process = Path(f"/proc/{pid}")
    wait_until(lambda: not process.exists(), 30, f"planner {pid} to end")


@contextlib.contextmanager
def _spark_log(spark: SparkSession, path: Path) -> Iterator[None]:
    """The JVM's stderr (an uncaught exception's ``Exception in thread``, the output of the
    Python processes Spark starts meanwhile) and its log's errors, into ``path``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    system, core = jvm.java.lang.System, jvm.org.apache.logging.log4j.core
    stream = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(str(path), True), True)
    layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c: %m%n%ex").build()
    appender = (
        core.appender.OutputStreamAppender.newBuilder()
        .setName("source-stop-test")
        .setTarget(stream)
        .setLayout(layout)
        .build()
    )
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    root = context.getConfiguration().getRootLogger()
    original = system.err
    appender.start()
    root.addAppender(appender, None, None)
    context.updateLoggers()
    system.setErr(stream)
    try:
        yield
    finally:
        system.setErr(original)
        root.removeAppender("source-stop-test")
        context.updateLoggers()
        appender.stop()
        stream.close()


# What the pyspark daemon prints when a stop kills a Python worker's task as the worker
# starts or writes: Spark's own, for any Python worker (a UDF's too), never the source's.
DAEMONS_KILLED_WORKER = ("EOFError", "BrokenPipeError:", "ConnectionResetError:")


def _errors(log: str) -> list[str]:
    """The log's error lines and tracebacks, but the pyspark daemon's reports of a worker
    whose task the stop killed (a traceback from daemon.py's manager ending in one of
    DAEMONS_KILLED_WORKER)."""
    lines, errors, at = log.splitlines(), [], 0
    while at < len(lines):
        end = at + 1
        if lines[at].startswith("Traceback (most recent call last):"):
            while end < len(lines) and lines[end].startswith(" "):
                end += 1
            end = min(end + 1, len(lines))  # the exception's line
        block = lines[at:end]
        daemons = (
            len(block) > 2
            and "pyspark/daemon.py" in block[1]
            and block[1].endswith("in manager")
            and block[-1].startswith(DAEMONS_KILLED_WORKER)
        )
        if not daemons and any(_an_error(line) for line in block):
            errors += block
        at = end
    return errors


def _an_error(line: str) -> bool:
    signs = ("Exception in thread", "StackOverflowError", "ERROR", "Traceback", "Error:")
    return any(sign in line for sign in signs)


def _jvm_threads(spark: SparkSession) -> list[str]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return [str(thread.getName()) for thread in jvm.java.lang.Thread.getAllStackTraces().keySet()]


def _new_threads(before: set[threading.Thread]) -> list[str]:
    """This process's threads started since ``before``, but py4j's: its callback server,
    started by the session's first foreachBatch, and in pinned-thread mode a connection to
    every JVM thread that called Python (each query's stream thread), and a thread serving
    it, kept as long as the session lives."""
    return [t.name for t in threading.enumerate() if t not in before and not _py4js(t)]


def _py4js(thread: threading.Thread) -> bool:
    serves = getattr(getattr(thread, "_target", None), "__self__", None)
    return type(serves).__module__.startswith("py4j.")
