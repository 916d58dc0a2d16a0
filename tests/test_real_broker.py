"""What only Apache Kafka itself shows (issue 10, DESIGN §7): consumer-group members and
rebalances, transactions' offset gaps, compaction of the control topic, partitions added
to a watched topic, and a broker that goes away and comes back on the same log directory.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)

from emitter.control_topic import ControlTopicReader
from emitter.kafka_broker import KafkaBroker
from emitter.markers import Marker, MarkerStatus
from tests.conftest import TEST_BROKER_SETTINGS, TopicFactory
from tests.emitter_harness import (
    RunningEmitter,
    control_markers,
    produce_one,
    start_emitter,
    wait_until,
)

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED

pytestmark = pytest.mark.integration


@pytest.fixture
def emitters(broker: KafkaBroker) -> Iterator[Callable[..., RunningEmitter]]:
    started: list[RunningEmitter] = []

    def start(**settings: Any) -> RunningEmitter:
        settings.setdefault("bootstrap_servers", broker.bootstrap_servers)
        running = start_emitter(**settings)
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


def _control() -> str:
    return f"ctl-{uuid.uuid4().hex[:12]}"


def _polls(running: RunningEmitter) -> float:
    """Polls the emitter has finished, from its own /metrics: proof that time has passed."""
    return running.metric("slackwater_emitter_poll_duration_seconds_count") or 0.0


def _after_polls(running: RunningEmitter, count: int) -> None:
    target = _polls(running) + count
    wait_until(lambda: _polls(running) >= target, 60, f"{count} more polls")


# ---------------------------------------------------------------- consumer groups


class GroupMember:
    """A real consumer in a real group, polling in a thread so it stays a member."""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        if protocol == "consumer":
            config["group.protocol"] = "consumer"  # KIP-848: the broker assigns
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.consumer.poll(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()  # leaves the group: a rebalance follows


def _owned_counts(running: RunningEmitter) -> list[int] | None:
    members = running.status()["members"]
    return None if members is None else sorted(len(owned) for owned in members.values())


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_emitter_follows_a_real_groups_members_assignment_and_rebalances(
    broker: KafkaBroker,
    new_topic: TopicFactory,
    emitters: Callable[..., RunningEmitter],
    protocol: str,
) -> None:
    topic, group = new_topic(partitions=4), f"g-{uuid.uuid4().hex[:8]}"
    running = emitters(topics=[topic], control_topic=_control(), group=group)
    # No member yet: every watched partition is without an owner.
    wait_until(lambda: running.status()["partitions_without_owner"] == 4, 30, "4 unowned")
    assert running.status()["members"] == {}
    assert running.metric("slackwater_emitter_partitions_without_owner", group=group) == 4
    assert running.metric("slackwater_emitter_group_members", group=group) == 0

    first = GroupMember(broker.bootstrap_servers, group, topic, protocol)
    members: list[GroupMember] = [first]
    try:
        wait_until(lambda: _owned_counts(running) == [4], 60, "one member owning all 4")
        status = running.status()
        assert status["partitions_without_owner"] == 0 and status["unowned_partitions"] == []
        (member_id,) = status["members"]
        assert {row["owner"] for row in status["partitions"]} == {member_id}

        members.append(GroupMember(broker.bootstrap_servers, group, topic, protocol))
        wait_until(lambda: _owned_counts(running) == [2, 2], 60, "rebalanced to 2 + 2")
        assert running.metric("slackwater_emitter_group_members", group=group) == 2
        assert running.metric("slackwater_emitter_partitions_without_owner", group=group) == 0
        owners = {row["owner"] for row in running.status()["partitions"]}
        assert owners == set(running.status()["members"])

        # Five members for four partitions: one of them owns nothing.
        for _ in range(3):
            members.append(GroupMember(broker.bootstrap_servers, group, topic, protocol))
        wait_until(
            lambda: running.metric("slackwater_emitter_group_members", group=group) == 5,
            60,
            "five members",
        )
        wait_until(
            lambda: running.status()["members_without_partitions"] == 1
            and _owned_counts(running) == [0, 1, 1, 1, 1],
            60,
            "one member without partitions",
        )
        assert running.metric("slackwater_emitter_group_members_without_partitions", group=group) == 1

        for member in members[1:]:
            member.close()
        del members[1:]
        wait_until(lambda: _owned_counts(running) == [4], 60, "back to one member owning all")
        first.close()
        members.clear()
        wait_until(
            lambda: running.status()["partitions_without_owner"] == 4, 60, "all unowned again"
        )
        assert running.status()["unowned_partitions"] == [f"{topic}:{p}" for p in range(4)]
    finally:
        for member in members:
            member.close()


# ------------------------------------------------------------------ transactions


def _log_end(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "log-end-probe"})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return int(high)
    finally:
        consumer.close()


def test_idle_marker_after_committed_and_aborted_transactions_applies_at_the_offset_gap(
    spark: Any, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Any
) -> None:
    from tests.pipeline_harness import BASE_MS, Writer, run_pipeline

    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(30)

    def transaction(seconds: list[int], *, commit: bool) -> None:
        producer.begin_transaction()
        for second in seconds:
            producer.produce(
                topic, key=b"k", value=b"{}", partition=0, timestamp=BASE_MS + second * 1000
            )
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # on the broker, then aborted: a read_committed reader skips it
            producer.abort_transaction(30)

    # p0:  0 1 2 [C]  3' 4' [A]  5 6 [C]   (' aborted, [C]/[A] commit/abort markers)
    # off: 0 1 2  3   4  5   6   7 8  9    -> log end 10, 5 committed records
    transaction([0, 1, 2], commit=True)
    transaction([3, 4], commit=False)
    transaction([5, 6], commit=True)
    write.data(1, *range(0, 20))
    log_end = _log_end(broker.bootstrap_servers, topic, 0)
    assert log_end == 10  # the offset gaps are real: 7 data records, 3 control records

    run = run_pipeline(
        spark,
        tmp_path,
        bootstrap_servers=broker.bootstrap_servers,
        topic=topic,
        control_topic=control,
        kafka_config={"isolation.level": "read_committed"},
    )
    try:
        run.settle()
        # p0 is ACTIVE: its newest committed record (6 s) holds the valve at 5 s.
        assert run.watermark == BASE_MS + 5_000
        # What the emitter publishes for a quiet p0: IDLE at the log end, past the gap.
        write.marker(0, IDLE, offset=log_end)
        run.wait_for(lambda r: r.watermark == BASE_MS + 18_000, 60, "IDLE applied at 10")
        run.settle()
        # The aborted records (3 s, 4 s) count nowhere; nothing was late.
        assert run.window_counts() == {(0, 5): 3 + 5, (5, 10): 2 + 5, (10, 15): 5}
        assert sum(r.records for r in run.reports) == 5 + 20
        assert sum(r.late for r in run.reports) == 0 and run.late() == []
    finally:
        run.stop()
        producer.flush(10)


# -------------------------------------------------------------------- compaction


def _control_records(bootstrap: str, control: str) -> list[object]:
    reader = ControlTopicReader(bootstrap, control, {}, 10.0)
    try:
        return list(reader.read_to_end().records)
    finally:
        reader.close()


def test_compacted_control_topic_keeps_the_latest_marker_per_partition(
    broker: KafkaBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    emitters: Callable[..., RunningEmitter],
) -> None:
    topic, control = new_topic(partitions=2), _control()
    bootstrap = broker.bootstrap_servers
    first = emitters(topics=[topic], control_topic=control)
    # The emitter created the control topic compacted; make the cleaner eager (segments
    # roll every 100 ms, any dirt is worth cleaning), as a test must not wait hours.
    described = admin.describe_configs([ConfigResource("topic", control)])
    config = next(iter(described.values())).result(10)
    assert config["cleanup.policy"].value == "compact"
    resource = ConfigResource("topic", control)
    for name, value in {
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
    }.items():
        resource.add_incremental_config(
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        )
    admin.incremental_alter_configs([resource])[resource].result(10)

    # Partition 0 flips IDLE/ACTIVE three times; partition 1 goes IDLE once. The cleaner
    # may run meanwhile, so the emitter's own counters tell what it published.
    def published(status: MarkerStatus) -> float | None:
        return first.metric("slackwater_emitter_markers_published_total", status=status.value)

    for flip in range(3):
        wait_until(lambda f=flip: published(IDLE) == 2 + f, 60, f"IDLE number {flip + 1}")
        produce_one(bootstrap, topic, 0)
    wait_until(lambda: published(IDLE) == 5, 60, "the last IDLE of partition 0")
    assert published(ACTIVE) == 3  # p0: IDLE@0 ACTIVE@0 IDLE@1 ... ACTIVE@2 IDLE@3; p1: IDLE@0
    latest = {key: state.last_marker for key, state in first.emitter.detector.partitions.items()}
    assert [(m.status, m.offset) for m in latest.values() if m is not None] == [
        (IDLE, 3),
        (IDLE, 0),
    ]
    assert first.stop() == 0

    # A restart claims a new epoch (a new record: the segment holding the last markers
    # rolls), then the cleaner removes every marker but the latest of each partition.
    second = emitters(topics=[topic], control_topic=control)
    assert second.emitter.epoch == 2
    wait_until(
        lambda: len(control_markers(bootstrap, control)) == 2, 120, "compaction to 2 markers"
    )
    survivors = control_markers(bootstrap, control)
    assert {(m.topic, m.partition): m for m in survivors} == latest
    # A new consumer sees the latest marker per partition, and no record contradicts it.
    from emitter.control_topic import last_marker_per_partition

    assert last_marker_per_partition(_control_records(bootstrap, control)) == latest
    # The restarted emitter continues from them: nothing new for quiet partitions ...
    _after_polls(second, 10)
    assert len(control_markers(bootstrap, control)) == 2
    rows = {row["partition"]: row for row in second.status()["partitions"]}
    assert (rows[0]["status"], rows[0]["offset"]) == ("IDLE", 3)
    # ... and the next change follows on: ACTIVE where the data resumes, seq continued.
    produce_one(bootstrap, topic, 0)
    resumed = wait_until(
        lambda: [m for m in control_markers(bootstrap, control) if m.epoch == 2],
        60,
        "ACTIVE of epoch 2",
    )[0]
    assert (resumed.partition, resumed.status, resumed.offset) == (0, ACTIVE, 3)
    assert resumed.seq == latest[(topic, 0)].seq + 1
