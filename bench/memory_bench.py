"""Resident memory, open files, threads and Kafka clients of every process of a long run,
at a warm-up batch and many batches later: issue 33's item 5, "No growth over a long run".

    .venv/bin/python -m bench.memory_bench [--partitions 1000] [--batches 1000] \\
        [--sample-at 100 1000]

A leak that costs a few KiB or one file a batch is invisible in any short bench and
ends a query after days. So: one run as in production, long, and each process looked at
twice (or more), the first sample after a warm-up (Spark's and the Python workers'
start-up, the first sight of every partition), the last at the end.

On Apache Kafka (`slackwater broker`'s launcher): a data topic of ``--partitions``
partitions (``bench.topics.create_led``: topics of 1,000 above it) and a compacted
control topic of one partition. ``slackwater emit`` runs as a subprocess (its memory is
its own) on the data topic and the control topic, no consumer group (it watches the log
ends), ``--poll-interval`` 200 ms and ``--idle-timeout`` 1 s, so that partitions go
IDLE and ACTIVE again and markers keep coming (at 1,000 partitions each gets a record
every 2 s). A thread of this process writes ``--records-per-tick`` records every
``--tick-ms`` (50 every 100 ms), one to each of the next partitions in turn, so every
batch has records and every partition gets some. One local[2] SparkSession
(``spark_session``) runs ``read_stream`` on both topics (progress topic: the source's
default, ``<control>.progress``; checkpoint in a temporary directory) into the no-op
sink every ``--trigger-ms`` (200 ms). The query's last progress is looked at every
0.5 s; when its batch id first reaches a ``--sample-at`` batch, each process is sampled:

* the driver JVM: pyspark's gateway process (``sparkContext._gateway.proc``, the
  ``java`` that ``spark-submit`` execs);
* the planner: the JVM's Python child running ``pyspark.sql.streaming.
  python_streaming_source_runner`` (Spark runs the source's ``SlackwaterStreamReader``
  there, one process per query);
* the task workers: the JVM's ``pyspark.daemon pyspark.worker`` and the workers it
  forks (they read the tasks; a fork keeps the daemon's command line), summed and the
  largest of each number;
* the data source's other daemons (``pyspark.daemon pyspark.sql.worker.*``: lookup,
  create, plan the read; Spark 4 calls them at the query's start) and their forks;
* the emitter subprocess, and this process (the bench's driver and its writer, which
  also fetches ``lastProgress`` every 0.5 s).

Spark ends a Python worker idle for a minute: the data source daemons' forks are gone
by a later sample (their row shrinks), the task workers are reused. The emitter's 1 s
idle timeout at 1,000 partitions writes about 500 markers a second (about 100,000 by
batch 150), which the source reads; the emitter logs each at INFO (its log: a temporary
file, about 10 MB by then). ``--emitter-idle-timeout 30s``: a quiet control topic.

Each: resident memory (RSS, MiB; a forked worker's shares pages with the daemon, so
their sum overstates), open file descriptors, threads, and librdkafka clients, counted
as threads named ``rdk:main`` (librdkafka starts one per client; the JVM has none).
Then a table of each sample and the RSS growth from the first to the last, the
elapsed time and the batches a second, with the machine and the date; at each sample
the driver JVM's heap (used, committed, max) is printed too, as its RSS grows towards
the heap's maximum before the collector holds it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen, TimeoutExpired
from typing import Any

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import SparkSession

from bench.topics import create_led, produce_waiting
from slackwater import kafka_clients
from slackwater.kafka_broker import KafkaBroker, free_port
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream

PLANNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
DAEMON_MODULE, WORKER_MODULE = "pyspark.daemon", "pyspark.worker"
RDKAFKA_MAIN_THREAD = "rdk:main"  # one per librdkafka client
LOOK_EVERY_S = 0.5
STALLED_S = 300.0  # no new batch this long: the run has failed
MIB = 1024 * 1024


@dataclass(frozen=True)
class Usage:
    """One group of processes at one sample: summed, or the largest of each."""

    processes: int
    rss_mib: float
    open_fds: int
    threads: int
    rdkafka_clients: int


def _thread_names(pid: int) -> Counter[str]:
    """The process's threads by name (the kernel's 15 characters), digits as ``#``."""
    names: Counter[str] = Counter()
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            names[re.sub(r"[0-9]+", "#", comm.read_text().strip())] += 1
        except OSError:  # the thread ended while we looked
            continue
    return names


def _usage(processes: list[psutil.Process], combine: Callable[[list[float]], float]) -> Usage:
    """The processes' numbers, each combined (``sum`` or ``max``); one that ended while
    looked at counts for nothing."""
    rows: list[tuple[float, int, int, int]] = []
    for process in processes:
        try:
            with process.oneshot():
                rss_mib = process.memory_info().rss / MIB
                numbers = (rss_mib, process.num_fds(), process.num_threads())
            rows.append((*numbers, _thread_names(process.pid)[RDKAFKA_MAIN_THREAD]))
        except psutil.NoSuchProcess:
            continue
    columns = list(zip(*rows, strict=True)) or [(), (), (), ()]
    rss_mib, open_fds, threads, clients = (
        combine([float(v) for v in column]) if column else 0.0 for column in columns
    )
    return Usage(len(rows), rss_mib, int(open_fds), int(threads), int(clients))


def _spark_children(jvm: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The JVM's Python descendants by their command line (a fork keeps its daemon's):
    the planner; the task workers (``pyspark.daemon pyspark.worker`` and its forks);
    the data source's other daemons (``pyspark.daemon pyspark.sql.worker.*``: lookup,
    create, plan the read, at the query's start) and their forks; any other."""
    found: dict[str, list[psutil.Process]] = {
        kind: [] for kind in ("planner", "workers", "daemons", "other")
    }
    for child in jvm.children(recursive=True):
        try:
            command = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if PLANNER_MODULE in command:
            found["planner"].append(child)
        elif command[-2:] == [DAEMON_MODULE, WORKER_MODULE]:
            found["workers"].append(child)
        elif DAEMON_MODULE in command:
            found["daemons"].append(child)
        else:
            found["other"].append(child)
    return found


def _describe(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            command = " ".join(process.cmdline())[:160]
            lines.append(f"  pid {process.pid} (parent {process.ppid()}): {command}")
        except psutil.NoSuchProcess:
            continue
    return "\n".join(lines)


@dataclass(frozen=True)
class Sample:
    batch: int
    at_s: float  # monotonic
    emitter_polls: float
    rows: dict[str, Usage]
    thread_names: dict[str, Counter[str]]  # of the JVM, the planner, the emitter


@dataclass
class Run:
    """The processes of the run and its samples."""

    spark: SparkSession
    jvm: psutil.Process
    emitter: Popen[bytes]
    emitter_log: Path
    emitter_port: int
    samples: list[Sample]

    def sample(self, batch: int) -> None:
        spark = _spark_children(self.jvm)
        if not self.samples:
            print("the JVM's descendants at the first sample:", flush=True)
            print(_describe([p for group in spark.values() for p in group]), flush=True)
        emitter = [psutil.Process(self.emitter.pid)]
        rows = {
            "driver JVM": _usage([self.jvm], sum),
            "planner (source runner)": _usage(spark["planner"], sum),
            "task workers, sum": _usage(spark["workers"], sum),
            "task workers, largest": _usage(spark["workers"], max),
            "data source daemons, sum": _usage(spark["daemons"], sum),
            "other JVM children": _usage(spark["other"], sum),
            "emitter (slackwater emit)": _usage(emitter, sum),
            "this process (bench, writer)": _usage([psutil.Process()], sum),
        }
        polls = _emitter_polls(self.emitter_port)
        single = {"driver JVM": [self.jvm], "planner": spark["planner"], "emitter": emitter}
        names = {
            name: sum((_thread_names(p.pid) for p in group), Counter[str]())
            for name, group in single.items()
        }
        self.samples.append(Sample(batch, time.monotonic(), polls, rows, names))
        print(
            f"sampled at batch {batch:,}: emitter polls so far {polls:,.0f};"
            f" {_jvm_heap(self.spark)}",
            flush=True,
        )


def _jvm_heap(spark: SparkSession) -> str:
    """The driver JVM's heap now (its RSS grows towards the maximum before the
    collector holds it: read the RSS beside these)."""
    runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()  # type: ignore[union-attr]
    used_mib = (runtime.totalMemory() - runtime.freeMemory()) / MIB
    return (
        f"JVM heap used {used_mib:,.0f} MiB of {runtime.totalMemory() / MIB:,.0f} committed,"
        f" {runtime.maxMemory() / MIB:,.0f} max"
    )


def _jvm(spark: SparkSession) -> psutil.Process:
    """The driver's JVM: the gateway's process (spark-submit execs java), else the java
    among this process's descendants that is not the broker's."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is not None and "java" in psutil.Process(proc.pid).name():
        return psutil.Process(proc.pid)
    for child in psutil.Process().children(recursive=True):
        if "java" in child.name() and "SparkSubmit" in " ".join(child.cmdline()):
            return child
    raise RuntimeError("no driver JVM among this process's descendants")


def _emitter_polls(port: int) -> float:
    """The emitter's finished polls, from its /metrics (0 until it serves them)."""
    name = "slackwater_emitter_poll_duration_seconds_count"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text: str = answer.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0


def _start_emitter(
    bootstrap: str, topics: list[str], control: str, args: argparse.Namespace, log: Path
) -> tuple[Popen[bytes], int]:
    port = free_port()
    command = [sys.executable, "-m", "slackwater.cli", "emit", "--bootstrap-servers", bootstrap]
    for topic in topics:
        command += ["--topic", topic]
    command += [
        "--control-topic", control, "--poll-interval", args.emitter_poll_interval,
        "--idle-timeout", args.emitter_idle_timeout, "--metrics-port", str(port),
        "--emitter-id", "memory-bench",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = Popen(
            command, stdout=out, stderr=out, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    deadline = time.monotonic() + 120
    while _emitter_polls(port) < 1:
        if process.poll() is not None or time.monotonic() > deadline:
            _stop_emitter(process)
            raise RuntimeError(f"the emitter did not poll:\n{log.read_text()[-3000:]}")
        time.sleep(LOOK_EVERY_S)
    return process, port


def _stop_emitter(process: Popen[bytes]) -> int | None:
    """SIGTERM and its exit code (None: killed after 30 s)."""
    process.terminate()
    try:
        return process.wait(30)
    except TimeoutExpired:
        process.kill()
        process.wait(30)
        return None


def _write(
    bootstrap: str, pairs: list[tuple[str, int]], args: argparse.Namespace, stop: threading.Event
) -> None:
    """The writer thread: ``records_per_tick`` records every tick, each to the next
    partition in turn, until ``stop``."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    index = 0
    while not stop.wait(args.tick_ms / 1000):
        for _ in range(args.records_per_tick):
            topic, partition = pairs[index % len(pairs)]
            produce_waiting(producer, topic, value=b"{}", partition=partition)
            index += 1
        producer.poll(0)
    producer.flush(30)


def _create_topics(admin: AdminClient, partitions: int) -> tuple[list[str], int, str]:
    topics, per_topic = create_led(admin, "memory", partitions)
    control = f"memory-ctl-{uuid.uuid4().hex[:8]}"
    compacted = NewTopic(control, 1, 1, config={"cleanup.policy": "compact"})
    kafka_clients.create_topic(admin, compacted, 60)
    return topics, per_topic, control


def _start_query(
    spark: SparkSession, bootstrap: str, topics: list[str], control: str, trigger_ms: int
) -> Any:
    return (
        read_stream(spark, bootstrap_servers=bootstrap, topics=topics, control_topic=control)
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="slackwater-memory-"))
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start()
    )


def _wait_for_batch(query: Any, batch: int, run: Run) -> int:
    """The query's batch id once it reaches ``batch`` (looked at every 0.5 s); fails
    if the query or the emitter ended, or no batch came for ``STALLED_S``."""
    last_id, moved_at = -1, time.monotonic()
    while True:
        if not query.isActive:
            raise RuntimeError(f"the query ended: {query.exception()}")
        if run.emitter.poll() is not None:
            raise RuntimeError(f"the emitter ended:\n{run.emitter_log.read_text()[-3000:]}")
        progress = query.lastProgress
        batch_id = -1 if progress is None else int(progress["batchId"])
        if batch_id >= batch:
            return batch_id
        if batch_id != last_id:
            last_id, moved_at = batch_id, time.monotonic()
        elif time.monotonic() - moved_at > STALLED_S:
            raise RuntimeError(f"no batch after {batch_id} in {STALLED_S:.0f} s")
        time.sleep(LOOK_EVERY_S)


def _wait_quiet(query: Any, timeout_s: float = 120) -> None:
    """Until the query has read everything written and is between triggers (the
    writer and the emitter stopped), so that stopping it kills no task: Spark logs
    each killed task's stack."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = query.status
        if not status["isDataAvailable"] and not status["isTriggerActive"]:
            return
        time.sleep(0.02)


def _growth(first: float, last: float) -> str:
    return "-" if first == 0 else f"{(last - first) / first * 100:+.1f}"


def _table(samples: list[Sample]) -> str:
    header, rule = "| process |", "|---|"
    for sample in samples:
        at = f"@{sample.batch}"
        header += f" procs {at} | RSS MiB {at} | fds {at} | threads {at} | rdkafka {at} |"
        rule += "---:|" * 5
    lines = [header + " RSS growth % |", rule + "---:|"]
    for name in samples[0].rows:
        cells = [sample.rows[name] for sample in samples]
        row = f"| {name} |"
        for usage in cells:
            row += f" {usage.processes} | {usage.rss_mib:,.1f} | {usage.open_fds:,} |"
            row += f" {usage.threads:,} | {usage.rdkafka_clients} |"
        lines.append(row + f" {_growth(cells[0].rss_mib, cells[-1].rss_mib)} |")
    return "\n".join(lines)


def _report(samples: list[Sample], started_s: float, ended: tuple[int, float]) -> None:
    """The table, then the pace: of the whole run and between the first and last sample
    (a batch's milliseconds, to size a longer run), and the emitter's polls a second."""
    print(_table(samples))
    first, last = samples[0], samples[-1]
    ended_batch, ended_s = ended
    whole_s, between_s = ended_s - started_s, last.at_s - first.at_s
    batches = last.batch - first.batch
    print(
        f"\nbatches 0 to {ended_batch:,} in {whole_s:,.0f} s from the query's start"
        f" ({(ended_batch + 1) / whole_s:.2f} batches/s); batches {first.batch:,} to"
        f" {last.batch:,} in {between_s:,.0f} s ({batches / between_s:.2f} batches/s,"
        f" {between_s * 1000 / batches:,.0f} ms a batch); emitter polls meanwhile"
        f" {last.emitter_polls - first.emitter_polls:,.0f}"
        f" ({(last.emitter_polls - first.emitter_polls) / between_s:.1f} a second)"
    )
    print(f"threads by name, changed from batch {first.batch:,} to {last.batch:,}:")
    print(_thread_changes(first, last))


def _thread_changes(first: Sample, last: Sample) -> str:
    """The thread names whose count changed between the samples, per process."""
    lines = []
    for process, before in first.thread_names.items():
        after = last.thread_names[process]
        changed = {
            name: after[name] - before[name]
            for name in before | after
            if after[name] != before[name]
        }
        for name, change in sorted(changed.items(), key=lambda item: -abs(item[1])):
            lines.append(f"  {process}: {name!r} {before[name]} -> {after[name]} ({change:+})")
    return "\n".join(lines) or "  none"


def _log_end(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "memory-bench"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return int(high)
    finally:
        consumer.close()


def _machine(args: argparse.Namespace) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"{now}; {os.cpu_count()} CPUs, Linux {os.uname().release}, load average"
        f" {' '.join(f'{load:.2f}' for load in os.getloadavg())}\n"
        f"command: .venv/bin/python -m bench.memory_bench {' '.join(sys.argv[1:])}\n"
        f"partitions {args.partitions:,}, trigger {args.trigger_ms} ms, writer"
        f" {args.records_per_tick} records every {args.tick_ms} ms, emitter poll"
        f" {args.emitter_poll_interval}, idle timeout {args.emitter_idle_timeout}",
        flush=True,
    )


def _measure(spark: SparkSession, bootstrap: str, args: argparse.Namespace) -> None:
    """The run itself, between the broker's and the session's start and stop."""
    topics, per_topic, control = _create_topics(
        AdminClient({"bootstrap.servers": bootstrap}), args.partitions
    )
    stop_writer = threading.Event()
    pairs = [(topic, p) for p in range(per_topic) for topic in topics]
    writer = threading.Thread(
        target=_write, args=(bootstrap, pairs, args, stop_writer), daemon=True
    )
    writer.start()
    log = Path(tempfile.mkdtemp(prefix="slackwater-memory-emit-")) / "emit.log"
    emitter, port = _start_emitter(bootstrap, topics, control, args, log)
    run = Run(spark, _jvm(spark), emitter, log, port, [])
    query, started_s, code = None, time.monotonic(), None
    try:
        query = _start_query(spark, bootstrap, topics, control, args.trigger_ms)
        for target in sorted(args.sample_at):
            run.sample(_wait_for_batch(query, target, run))
        ended = (_wait_for_batch(query, args.batches, run), time.monotonic())
        stop_writer.set()
        writer.join(60)
        code = _stop_emitter(emitter)
        _wait_quiet(query)
    finally:
        stop_writer.set()
        if query is not None:
            query.stop()
        if emitter.returncode is None:  # stopped above unless the run failed first
            code = _stop_emitter(emitter)
        writer.join(60)
    _report(run.samples, started_s, ended)
    print(
        f"control topic: {_log_end(bootstrap, control):,} records (markers and epoch claims);"
        f" emitter exit code after SIGTERM: {code}; its log: {log}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=1_000)
    parser.add_argument("--batches", type=int, default=1_000, help="the run's last batch id")
    parser.add_argument("--sample-at", type=int, nargs="+", default=[100, 1_000])
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument("--records-per-tick", type=int, default=50)
    parser.add_argument("--tick-ms", type=int, default=100)
    parser.add_argument("--emitter-poll-interval", default="200ms")
    parser.add_argument("--emitter-idle-timeout", default="1s")
    args = parser.parse_args()
    if len(args.sample_at) < 2 or max(args.sample_at) > args.batches:
        parser.error("--sample-at: at least two batches, none past --batches")
    _machine(args)
    with KafkaBroker() as broker:
        spark = spark_session("slackwater-memory")
        try:
            _measure(spark, broker.bootstrap_servers, args)
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
