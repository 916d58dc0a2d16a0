"""No IDLE from a slow answer (issue 42, finding 1), on three Apache Kafka nodes.

A log end counts as seen when its answer came, never at the end of a poll that waited
on something slower. Each kind of request is slowed in turn by a node SIGSTOPped past the
request timeout: the group's (OffsetFetch, DescribeGroups: its coordinator), ListOffsets
(the leader of another partition of the topic) and DescribeTopics (the node librdkafka
sends it to). The slowed node holds no replica of the measured partition, nor of the
control topic, so the emitter can still see the partition and publish. The scenario is
the issue's: one record, the node stopped some seconds later, a second record before
the idle timeout. An IDLE marker is valid only after ``idle_timeout`` of real stillness:
its ``emitted_at`` at least that long after the append of the record before its offset,
and the record at its offset, if any, acknowledged at least that long after that append
(LogAppendTime: the broker's clock, which is the test's). Markers on the control topic and
every IDLE row the emitter's /status showed meanwhile are held to it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_cluster import KafkaCluster
from slackwater.markers import Marker, MarkerStatus
from tests.conftest import CLUSTER_SETTINGS
from tests.harness.cluster import FAULT_DEADLINE_S, in_sync, leader_now
from tests.harness.emitter import RunningEmitter, commit, control_markers, start_emitter
from tests.harness.factories import wait_until
from tests.harness.process import stopped_node

IDLE = MarkerStatus.IDLE
IDLE_TIMEOUT_MS = 6_000
REQUEST_TIMEOUT_MS = 3_000
# The scenario, by the test's clock from the first record's acknowledgement: the node is
# stopped once the partition has been still this long, the second record written this
# long after the first, the node continued past the request timeout after that. A poll
# stamped at its end (the bug) credits the stopped poll's wait: 3.5 s + 3 s >= 6 s.
STOP_AFTER_S = 3.5
SECOND_RECORD_AFTER_S = 4.5
EMITTER = {
    "idle_timeout_ms": IDLE_TIMEOUT_MS,
    "request_timeout_ms": REQUEST_TIMEOUT_MS,
    "poll_interval_ms": 200,
    # The emitter's own metadata requests would pick another DescribeTopics target
    # (below); every other refresh (a leader that moved) still happens.
    "metadata_interval_ms": 60_000,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three nodes whose brokers are fenced only after 30 s without a heartbeat: a node
    stopped here stays the leader and the coordinator it was, slow, not replaced. (A
    coordinator replaced while stopped answers the OffsetFetch it held NOT_COORDINATOR
    once continued, and librdkafka's admin client then dies of SIGSEGV:
    confluentinc/librdkafka#5040, emitter/observer.py. That is not this test's fault.)"""
    log_dir = Path(tmp_path_factory.mktemp("kafka-cluster"))
    settings = {**CLUSTER_SETTINGS, "broker.session.timeout.ms": "30000"}
    kafka = KafkaCluster(3, log_dir=log_dir, settings=settings).start()
    try:
        yield kafka
    finally:
        gc.collect()
        kafka.stop()


def _until(at_s: float) -> None:
    """Waits until the test's monotonic clock reads ``at_s`` (a step of the scenario,
    never what an assertion waits for)."""
    time.sleep(max(0.0, at_s - time.monotonic()))


@dataclass
class Writer:
    """Records acknowledged by every in-sync replica, each with the wall time (ms) its
    acknowledgement reached the test."""

    bootstrap: str
    topic: str
    acked_ms: dict[tuple[int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._producer = Producer(
            {"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 0}
        )

    def write(self, partition: int) -> float:
        """One record; returns the monotonic time of its acknowledgement."""
        failures: list[str] = []

        def delivered(error: Any, message: Any) -> None:
            if error is not None:
                failures.append(str(error))
            else:
                key = (message.partition(), message.offset())
                self.acked_ms[key] = time.time_ns() // 1_000_000

        self._producer.produce(self.topic, b"{}", partition=partition, on_delivery=delivered)
        assert self._producer.flush(FAULT_DEADLINE_S) == 0 and not failures, failures
        return time.monotonic()


class StatusWatch:
    """Every IDLE row the emitter's /status shows, read again and again in a thread."""

    def __init__(self, running: RunningEmitter) -> None:
        self._idle_rows: set[tuple[int, int, str]] = set()  # (partition, offset, since)
        self._lock = threading.Lock()
        self._running = running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError):
                for row in self._running.status()["partitions"]:
                    if row["status"] == "IDLE":
                        with self._lock:
                            self._idle_rows.add((row["partition"], row["offset"], row["since"]))

    def idle_rows(self) -> set[tuple[int, int, str]]:
        with self._lock:
            return set(self._idle_rows)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _appended_ms(
    bootstrap: str, topic: str, written: set[tuple[int, int]]
) -> dict[tuple[int, int], int]:
    """The append time (LogAppendTime) of each record ``written``, by (partition, offset)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in {p for p, _ in written}])
    appended: dict[tuple[int, int], int] = {}
    try:
        deadline = time.monotonic() + FAULT_DEADLINE_S
        while not written <= appended.keys():
            assert time.monotonic() < deadline, f"records not read back: {written}"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                key = (int(message.partition() or 0), int(message.offset() or 0))
                appended[key] = message.timestamp()[1]
    finally:
        consumer.close()
    return appended


def _too_early(
    idle: list[tuple[int, int, int]],
    appended: dict[tuple[int, int], int],
    acked: dict[tuple[int, int], int],
) -> list[str]:
    """The IDLE markers (partition, offset, emitted_at ms) that came before
    ``idle_timeout`` of real stillness: emitted sooner after the append of the record
    before their offset, or the log moved sooner (the record at their offset acked)."""
    wrong = []
    for partition, offset, emitted_ms in idle:
        before = appended.get((partition, offset - 1))
        if before is None:
            continue  # an empty partition's IDLE@0: no record to date its stillness by
        moved_ms = acked.get((partition, offset))
        if emitted_ms - before < IDLE_TIMEOUT_MS or (
            moved_ms is not None and moved_ms - before < IDLE_TIMEOUT_MS
        ):
            wrong.append(
                f"IDLE@{offset} on partition {partition} emitted {emitted_ms - before} ms "
                f"after the record before it"
                + ("" if moved_ms is None else f", the log moved {moved_ms - before} ms after")
            )
    return wrong


def _iso_ms(since: str) -> int:
    return int(datetime.fromisoformat(since).timestamp() * 1000)


def _idle_at(control: str, data: str, partition: int, bootstrap: str) -> int | None:
    """The offset of the partition's latest marker if it is an IDLE, else None."""
    latest: Marker | None = None
    for marker in control_markers(bootstrap, control):
        if marker.topic == data and marker.partition == partition:
            latest = marker
    return latest.offset if latest is not None and latest.status is IDLE else None


@dataclass
class Layout:
    """Where the data and the control topic live, which node is stopped, which partition
    is measured (records at 0 and 1) and which gets a record while the node is stopped."""

    replicas: list[list[int]]
    stop: int
    quiet: int
    nudged: int | None = None
    group: str | None = None


def _topic(admin: AdminClient, replicas: list[list[int]], **config: str) -> str:
    """A topic on the given replicas (as many for every partition), each partition led by
    its first one, every replica in sync."""
    name = f"s-{uuid.uuid4().hex[:12]}"
    topic = NewTopic(name, len(replicas), replica_assignment=replicas, config=config)
    admin.create_topics([topic])[name].result(30)
    wait_until(
        lambda: (
            in_sync(admin, name) == {len(replicas[0])}
            and all(leader_now(admin, name, p) == nodes[0] for p, nodes in enumerate(replicas))
        ),
        FAULT_DEADLINE_S,
        f"{name} on {replicas}, led by the first of each, all in sync",
    )
    return name


def _group_led_by_one_node(cluster: KafkaCluster, topic: str) -> tuple[str, int]:
    """A group that exists (an offset committed) and its coordinator (the leader of its
    __consumer_offsets partition)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    name = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": name})

    def committed() -> bool:
        try:
            commit(consumer, [TopicPartition(topic, 0, 0)])
        except KafkaException as error:  # a new cluster: __consumer_offsets still loading
            if error.args[0].code() != KafkaError.COORDINATOR_LOAD_IN_PROGRESS:
                raise
            return False
        return True

    try:
        wait_until(committed, FAULT_DEADLINE_S, f"an offset committed for {name}")
    finally:
        consumer.close()
    described_group = admin.describe_consumer_groups([name], request_timeout=10)[name].result(30)
    return name, int(described_group.coordinator.id)


def _layout(kind: str, cluster: KafkaCluster, admin: AdminClient) -> Layout:
    if kind == "group":
        # The coordinator first (whichever node leads the group's partition), the data on
        # the two others.
        probe = _topic(admin, [[1, 2, 3]])
        group, coordinator = _group_led_by_one_node(cluster, probe)
        others = [n for n in (1, 2, 3) if n != coordinator]
        return Layout([others], stop=coordinator, quiet=0, group=group)
    if kind == "list_offsets":
        # Partition 0 led by the stopped node; the measured partition 1 on the others.
        return Layout([[1, 3], [2, 3]], stop=1, quiet=1)
    # describe_topics: a record on partition 0 while node 3 is stopped asks for the
    # topic's id; partition 1, unchanged, is measured.
    return Layout([[1, 2], [1, 2]], stop=3, quiet=1, nudged=0)


def _log_end(running: RunningEmitter, partition: int) -> int | None:
    rows = running.status()["partitions"]
    return next((row["log_end_offset"] for row in rows if row["partition"] == partition), None)


def _describe_topics_sent_to(running: RunningEmitter, node: int) -> None:
    """librdkafka sends DescribeTopics to the controller its latest metadata answer named,
    and a KRaft broker names a random live broker in each answer (DescribeTopics' own
    included): the emitter's own client is asked for metadata until it names ``node``.
    Nothing asks it again before the next DescribeTopics: no log end changes meanwhile,
    and its metadata interval is long."""
    admin: AdminClient = running.emitter._admin  # the emitter's own client
    wait_until(
        lambda: admin.list_topics(timeout=10).controller_id == node,
        FAULT_DEADLINE_S,
        f"the emitter's client to name node {node} as the controller",
    )


@pytest.mark.parametrize("kind", ["group", "list_offsets", "describe_topics"])
def test_no_idle_before_idle_timeout_of_real_stillness_while_a_request_is_slowed(
    all_nodes_running: KafkaCluster, kind: str
) -> None:
    cluster = all_nodes_running
    bootstrap = cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    layout = _layout(kind, cluster, admin)
    stays_up = sorted({1, 2, 3} - {layout.stop})
    data = _topic(admin, layout.replicas, **{"message.timestamp.type": "LogAppendTime"})
    control = _topic(admin, [stays_up], **{"cleanup.policy": "compact"})
    writer = Writer(bootstrap, data)
    running = start_emitter(
        bootstrap_servers=bootstrap,
        topics=[data],
        control_topic=control,
        group=layout.group,
        **EMITTER,
    )
    watch = StatusWatch(running)
    node = cluster.node(layout.stop)
    try:
        # The emitter has seen the partition: the clock of the scenario starts.
        wait_until(lambda: len(running.status()["partitions"]) == len(layout.replicas), 60, "rows")
        acked_s = writer.write(layout.quiet)
        if kind == "describe_topics":
            # Once the poll that took the record (and asked the topic's id) is done.
            wait_until(lambda: _log_end(running, layout.quiet) == 1, STOP_AFTER_S, "seen")
            _describe_topics_sent_to(running, layout.stop)
        _until(acked_s + STOP_AFTER_S)
        with stopped_node(node):
            if layout.nudged is not None:
                writer.write(layout.nudged)  # its changed log end asks the topic's id
            _until(acked_s + SECOND_RECORD_AFTER_S)
            writer.write(layout.quiet)
            # Past the request timeout: every request the node holds times out.
            _until(time.monotonic() + 2 * REQUEST_TIMEOUT_MS / 1000)
        if kind != "group":  # (the group's round is carried, not failed: no error)
            # The request was slowed indeed: it failed at least once.
            assert (running.metric("slackwater_emitter_poll_errors_total", request=kind) or 0) > 0
        # The emitter still works: the partition's real stillness gets its IDLE@2, on
        # the control topic and in /status.
        wait_until(
            lambda: _idle_at(control, data, layout.quiet, bootstrap) == 2,
            FAULT_DEADLINE_S,
            f"IDLE@2 for {data}[{layout.quiet}]",
        )
        wait_until(
            lambda: any(row[:2] == (layout.quiet, 2) for row in watch.idle_rows()),
            FAULT_DEADLINE_S,
            "IDLE@2 in /status",
        )
    finally:
        watch.stop()
        running.stop()
    appended = _appended_ms(bootstrap, data, set(writer.acked_ms))
    markers = [m for m in control_markers(bootstrap, control) if m.topic == data]
    idle = [(m.partition, m.offset, m.emitted_at) for m in markers if m.status is IDLE]
    assert _too_early(idle, appended, writer.acked_ms) == []
    shown = [(p, offset, _iso_ms(since)) for p, offset, since in watch.idle_rows()]
    assert _too_early(shown, appended, writer.acked_ms) == []
