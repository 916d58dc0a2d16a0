"""What only Apache Kafka itself shows (issue 10, semantics.md §7): consumer-group members and
rebalances, transactions' offset gaps, compaction of the control topic, partitions added
to a watched topic, and a broker that goes away and comes back on the same log directory.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

from emitter.control_topic import ControlTopicReader
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import ControlRecord, MarkerStatus
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TEST_BROKER_SETTINGS, EmitterFactory, TopicFactory
from tests.harness.emitter import (
    RunningEmitter,
    after_polls,
    control_markers,
    produce_one,
    start_emitter,
)
from tests.harness.factories import wait_until

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED

pytestmark = pytest.mark.integration


def _control() -> str:
    return f"ctl-{uuid.uuid4().hex[:12]}"


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
    emitters: EmitterFactory,
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
            lambda: (
                running.status()["members_without_partitions"] == 1
                and _owned_counts(running) == [0, 1, 1, 1, 1]
            ),
            60,
            "one member without partitions",
        )
        assert (
            running.metric("slackwater_emitter_group_members_without_partitions", group=group) == 1
        )

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
    from tests.harness.kafka_writer import BASE_MS, Writer
    from tests.harness.source_jobs import events, window_job

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

    frame = events(
        spark,
        broker.bootstrap_servers,
        [topic],
        control,
        kafka_config={"isolation.level": "read_committed"},
    )
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        # p0 is ACTIVE: its newest committed record (6 s) holds the valve at 5 s.
        assert job.source_offset()["watermark"] == BASE_MS + 5_000
        # What the emitter publishes for a quiet p0: IDLE at the log end, past the gap.
        write.marker(0, IDLE, offset=log_end)
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 18_000  # IDLE applied at 10
        job.settle()
        # The aborted records (3 s, 4 s) count nowhere; nothing was late.
        assert job.windows() == {(0, 5): 3 + 5, (5, 10): 2 + 5, (10, 15): 5}
        counters = job.source_offset()["counters"]
        assert counters["records"] == 5 + 20
        assert counters.get("records_late", 0) == 0
    finally:
        job.stop()
        producer.flush(10)


# -------------------------------------------------------------------- compaction


def _control_records(bootstrap: str, control: str) -> list[ControlRecord]:
    reader = ControlTopicReader(bootstrap, control, {}, 10.0)
    try:
        return list(reader.read_to_end().records)
    finally:
        reader.close()


def test_compacted_control_topic_keeps_the_latest_marker_per_partition(
    broker: KafkaBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    emitters: EmitterFactory,
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

    def idle_markers_are(count: int) -> Callable[[], bool]:
        return lambda: published(IDLE) == count

    for flip in range(3):
        wait_until(idle_markers_are(2 + flip), 60, f"IDLE number {flip + 1}")
        produce_one(bootstrap, topic, 0)
    wait_until(lambda: published(IDLE) == 5, 60, "the last IDLE of partition 0")
    assert published(ACTIVE) == 3  # p0: IDLE@0 ACTIVE@0 IDLE@1 ... ACTIVE@2 IDLE@3; p1: IDLE@0
    latest = {
        key: state.last_marker
        for key, state in first.emitter.detector.partitions.items()
        if state.last_marker is not None
    }
    assert [(m.status, m.offset) for m in latest.values()] == [
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
    after_polls(second, 10)
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


# ------------------------------------------------------------- partitions added


def test_partitions_added_to_a_watched_topic_are_watched_and_marked(
    broker: KafkaBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    emitters: EmitterFactory,
) -> None:
    topic, control = new_topic(partitions=2), _control()
    bootstrap = broker.bootstrap_servers
    produce_one(bootstrap, topic, 0, count=2)
    running = emitters(topics=[topic], control_topic=control)
    wait_until(lambda: len(control_markers(bootstrap, control)) == 2, 60, "both IDLE")
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    wait_until(lambda: len(running.status()["partitions"]) == 4, 60, "4 partitions watched")
    produce_one(bootstrap, topic, 3, count=3)
    wait_until(
        lambda: (
            sorted((m.partition, m.status, m.offset) for m in control_markers(bootstrap, control))
            == [(0, IDLE, 2), (1, IDLE, 0), (2, IDLE, 0), (3, IDLE, 3)]
        ),
        60,
        "the new partitions marked",
    )
    assert running.metric("slackwater_emitter_watched_partitions") == 4
    assert (
        running.metric("slackwater_emitter_partition_log_end_offset", topic=topic, partition="3")
        == 3
    )


def test_partitions_added_while_spark_reads_join_the_valve(
    spark: Any, broker: KafkaBroker, admin: AdminClient, new_topic: TopicFactory, tmp_path: Any
) -> None:
    from tests.harness.kafka_writer import BASE_MS, Writer
    from tests.harness.source_jobs import events, window_job

    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for partition in (0, 1):
        write.data(partition, *range(0, 11))
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 9_000
        # The source plans on while the new partitions get their leaders (a ListOffsets
        # of a partition not ready yet is retried at the next trigger, not fatal).
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        write = Writer(broker.bootstrap_servers, topic, control)  # a producer that knows p2
        write.data(2, *range(12, 21))  # p2 starts above the output watermark: it aligns
        wait_until(
            lambda: len(SourceOffset.decode(job.source_offset()).statuses()) == 4, 60, "4 channels"
        )
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 9_000  # p0 and p1 still hold it
        for partition in (0, 1):
            write.data(partition, *range(11, 31))
        job.settle()
        offset = job.source_offset()
        assert list(SourceOffset.decode(offset).statuses()) == [f"{topic}:{p}" for p in range(4)]
        # p2 (newest 20 s) holds the min; p3, empty and unaligned at MIN, holds nothing.
        assert offset["watermark"] == BASE_MS + 19_000
        assert offset["counters"].get("records_late", 0) == 0
    finally:
        job.stop()


# ---------------------------------------------------------------- broker outage


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_broker_stopped_and_started_again_gives_no_wrong_marker(tmp_path: Any, how: str) -> None:
    """The idle clock stops while the broker is away; the same emitter resumes after."""
    own = KafkaBroker(log_dir=tmp_path / "kafka", settings=TEST_BROKER_SETTINGS).start()
    running: RunningEmitter | None = None
    try:
        bootstrap, control = own.bootstrap_servers, _control()
        own_admin = AdminClient({"bootstrap.servers": bootstrap})
        own_admin.create_topics([NewTopic("outage", 1, 1)])["outage"].result(30)
        idle_timeout_s = 5.0
        running = start_emitter(
            bootstrap_servers=bootstrap,
            topics=["outage"],
            control_topic=control,
            idle_timeout_ms=int(idle_timeout_s * 1000),
            kafka_config={"reconnect.backoff.ms": "50", "reconnect.backoff.max.ms": "500"},
            # Its group membership outlasts the outage: it stays the active emitter and
            # polls blind (with the default 10 s it may stand down, and start again after).
            session_timeout_ms=120_000,
        )
        produce_one(bootstrap, "outage", 0, count=2)
        # (A topic just created may be listed without its partition at the first polls.)
        wait_until(
            lambda: [p["log_end_offset"] for p in running.status()["partitions"]] == [2],
            60,
            "log end 2",
        )
        errors_before = running.metric("slackwater_emitter_poll_errors_total", request="metadata")
        assert errors_before is not None

        if how == "SIGKILL":
            own.kill()
        else:
            own.stop(remove_log_dir=False)
        wait_until(lambda: running.metric("slackwater_emitter_broker_up") == 0, 60, "up 0")
        assert running.status()["broker_up"] is False
        # Failed polls (each waits out a 1 s request timeout) spanning the idle timeout.
        wait_until(
            lambda: (
                (running.metric("slackwater_emitter_poll_errors_total", request="metadata") or 0)
                >= errors_before + idle_timeout_s + 1
            ),
            120,
            "failed polls spanning the idle timeout",
        )
        assert running.metric("slackwater_emitter_markers_published_total", status="IDLE") == 0

        own.start()  # same log directory, same ports
        wait_until(lambda: running.metric("slackwater_emitter_broker_up") == 1, 120, "up 1")
        after_polls(running, 1)
        # The outage did not count as stillness: no IDLE on the first polls back ...
        assert running.metric("slackwater_emitter_markers_published_total", status="IDLE") == 0
        assert running.status()["partitions"][0]["still_seconds"] < idle_timeout_s
        # ... and the IDLE comes once the log end has been still over successful polls.
        markers = wait_until(lambda: control_markers(bootstrap, control), 60, "IDLE after")
        assert [(m.status, m.offset) for m in markers] == [(IDLE, 2)]
        assert running.thread.is_alive()  # the same emitter, never restarted
    finally:
        if running is not None:
            assert running.stop() == 0
        own.stop()
