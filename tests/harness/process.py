"""Helpers for tests that run slackwater as a user would: waiting on a running process,
stopping it in its tracks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from slackwater.kafka_broker import KafkaBroker
from tests.harness.spark_checkpoint import batch_ids


def wait_while_running(
    predicate: Callable[[], object],
    timeout_s: float,
    what: str,
    process: subprocess.Popen[bytes],
    log: Path,
) -> None:
    """Until ``predicate()``; fails at once, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"process exited: {log.read_text()[-3000:]}"
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:]}")


@contextlib.contextmanager
def frozen(process: subprocess.Popen[bytes], within_s: float = 0.2) -> Iterator[bool]:
    """Stops every process of ``process``'s group (SIGSTOP: the Python driver and Spark's
    JVM) and yields True once every thread of them has stopped, so that nothing they
    write changes while the body runs; False if one had not within ``within_s`` (a
    thread can wait uninterruptibly for a child it is spawning, which is stopped too):
    then the body must not rely on anything. Continues them afterwards (SIGCONT,
    harmless if the body killed them). The process must lead its own group
    (``start_new_session=True``)."""
    os.killpg(process.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + within_s
        while _running_threads(process.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        yield not _running_threads(process.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the body may have killed them all
            os.killpg(process.pid, signal.SIGCONT)


def _running_threads(group: int) -> list[str]:
    """The threads of the group's processes that have not stopped: "pid/tid state"."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields is None or int(fields[2]) != group:  # state, ppid, pgrp, ...
            continue
        for task in (stat.parent / "task").glob("*/stat"):
            task_fields = _stat_fields(task)
            if task_fields is not None and task_fields[0] not in ("T", "t", "Z", "X"):
                running.append(f"{stat.parent.name}/{task.parent.name} {task_fields[0]}")
    return running


def _running_tasks(pid: int) -> list[str]:
    """The threads of one process that have not stopped: "tid state"."""
    running = []
    for task in Path(f"/proc/{pid}/task").glob("*/stat"):
        fields = _stat_fields(task)
        if fields is not None and fields[0] not in ("T", "t", "Z", "X"):
            running.append(f"{task.parent.name} {fields[0]}")
    return running


def _stat_fields(stat: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (None: the process is gone)."""
    try:
        return stat.read_text().rpartition(")")[2].split()
    except OSError:
        return None


def kill_inside_a_batch(process: subprocess.Popen[bytes], checkpoint: Path, log: Path) -> int:
    """SIGKILLs the run (its process group) while a batch it planned (offsets/N under
    ``checkpoint``) is not committed yet (no commits/N), every thread stopped while it
    looks; returns that batch. Fails if the run ends first."""
    deadline = time.monotonic() + 600  # a Spark start on a machine busy with other work
    while time.monotonic() < deadline:
        assert process.poll() is None, (
            "the run ended before a batch was caught:\n" + (log.read_text()[-3000:])
        )
        if batch_ids(checkpoint, "offsets") - batch_ids(checkpoint, "commits"):
            with frozen(process) as stopped:
                in_flight = batch_ids(checkpoint, "offsets") - batch_ids(checkpoint, "commits")
                if stopped and in_flight:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(30)
                    return max(in_flight)
        time.sleep(0.005)
    raise AssertionError("no batch planned in 600 s")


def node_pid(node: KafkaBroker) -> int:
    """The node's JVM, found by its configuration file (the launcher's own argument).
    (tests/kafka/test_observer.py has the same: a test imports no other test.)"""
    assert node.log_dir is not None
    wanted = str(node.log_dir / "server.properties").encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if wanted in cmdline.read_bytes().split(b"\0"):
                return int(cmdline.parent.name)
    raise AssertionError(f"no process for node {node.node_id}")


@contextlib.contextmanager
def stopped_node(node: KafkaBroker) -> Iterator[None]:
    """The node SIGSTOPped for the body, continued after it, whatever happens: its
    connections stay open and its answers do not come."""
    pid = node_pid(node)
    os.kill(pid, signal.SIGSTOP)
    try:
        # The stop takes each thread when it is next scheduled: on a busy machine the
        # JVM went on answering for a moment after kill() returned (a ListOffsets sent
        # "while stopped" was answered). The body starts once every thread has stopped.
        deadline = time.monotonic() + 30.0
        while _running_tasks(pid):
            assert time.monotonic() < deadline, f"node {node.node_id}: {_running_tasks(pid)}"
            time.sleep(0.001)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
