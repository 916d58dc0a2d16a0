"""The emitter against Apache Kafka: markers, finish, restarts, fencing, lag, metrics."""

from __future__ import annotations

import subprocess
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from tests.conftest import EmitterFactory, TopicFactory
from tests.harness.emitter import (
    DEADLINE_S,
    FAST,
    POLLS_PAST_IDLE_TIMEOUT,
    after_polls,
    commit,
    control_markers,
    polls_done,
    produce_one,
)
from tests.harness.factories import SLACKWATER, run_cli, wait_until

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED
POLL_S = FAST["poll_interval_ms"] / 1000


def _finish(
    broker: KafkaBroker, control: str, topic: str, partition: int
) -> subprocess.CompletedProcess[str]:
    """Runs ``slackwater finish`` as a user would."""
    return run_cli(
        "finish",
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--control-topic",
        control,
        "--topic",
        topic,
        "--partition",
        str(partition),
    )


def _control() -> str:
    return f"ctl-{uuid.uuid4().hex[:12]}"


def _markers_of(bootstrap: str, control: str, partition: int) -> list[tuple[MarkerStatus, int]]:
    return [
        (m.status, m.offset)
        for m in control_markers(bootstrap, control)
        if m.partition == partition
    ]


def test_quiet_partition_goes_idle_at_exact_log_end_then_active_at_exact_offset(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=2), _control()
    produce_one(broker.bootstrap_servers, topic, 0, count=3)
    started_ms = time.time_ns() // 1_000_000
    running = emitters(topics=[topic], control_topic=control)
    markers = wait_until(
        lambda: _markers_of(broker.bootstrap_servers, control, 0), DEADLINE_S, "IDLE marker"
    )
    assert markers == [(IDLE, 3)]
    idle_marker = next(
        m for m in control_markers(broker.bootstrap_servers, control) if m.partition == 0
    )
    # Never before idle_timeout (a lower bound: a slow machine cannot break it).
    assert idle_marker.emitted_at - started_ms >= FAST["idle_timeout_ms"]
    assert idle_marker.epoch == 1 and idle_marker.seq == 0
    produce_one(broker.bootstrap_servers, topic, 0, count=2)
    wait_until(
        lambda: len(_markers_of(broker.bootstrap_servers, control, 0)) >= 3,
        DEADLINE_S,
        "ACTIVE then IDLE",
    )
    assert _markers_of(broker.bootstrap_servers, control, 0) == [
        (IDLE, 3),
        (ACTIVE, 3),
        (IDLE, 5),
    ]
    assert _markers_of(broker.bootstrap_servers, control, 1) == [(IDLE, 0)]
    status = running.status()
    row = next(p for p in status["partitions"] if p["partition"] == 0)
    assert (row["status"], row["offset"], row["log_end_offset"]) == ("IDLE", 5, 5)
    assert running.metric("slackwater_emitter_markers_published_total", status="IDLE") == 3
    assert running.metric("slackwater_emitter_markers_published_total", status="ACTIVE") == 1
    assert (
        running.metric(
            "slackwater_emitter_partition_status", topic=topic, partition="0", status="IDLE"
        )
        == 1
    )
    assert (
        running.metric("slackwater_emitter_partition_log_end_offset", topic=topic, partition="0")
        == 5
    )
    assert running.stop() == 0


def test_finish_publishes_finished_and_nothing_after(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=1), _control()
    produce_one(broker.bootstrap_servers, topic, 0, count=4)
    running = emitters(topics=[topic], control_topic=control, idle_timeout_ms=60_000)
    result = _finish(broker, control, topic, 0)
    assert result.returncode == 0, result.stderr
    wait_until(lambda: _markers_of(broker.bootstrap_servers, control, 0), DEADLINE_S, "FINISHED")
    assert _markers_of(broker.bootstrap_servers, control, 0) == [(FINISHED, 4)]
    produce_one(broker.bootstrap_servers, topic, 0, count=2)  # data after FINISHED
    after_polls(running, POLLS_PAST_IDLE_TIMEOUT)
    assert _markers_of(broker.bootstrap_servers, control, 0) == [(FINISHED, 4)]
    status = run_cli(
        "status", "--bootstrap-servers", broker.bootstrap_servers, "--control-topic", control
    )
    assert status.returncode == 0
    assert f"{topic}:0" in status.stdout and "FINISHED" in status.stdout
    assert "offset=4" in status.stdout and "epoch=1" in status.stdout


def test_finish_for_unknown_partition_fails_clearly(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=1), _control()
    emitters(topics=[topic], control_topic=control)
    result = _finish(broker, control, topic, 7)
    assert result.returncode == 1
    assert f"no partition {topic}:7" in result.stderr


def test_restart_continues_state_without_duplicates_and_with_a_new_epoch(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=2), _control()
    produce_one(broker.bootstrap_servers, topic, 0, count=2)
    first = emitters(topics=[topic], control_topic=control)
    wait_until(
        lambda: len(control_markers(broker.bootstrap_servers, control)) == 2,
        DEADLINE_S,
        "two IDLE markers",
    )
    assert first.stop() == 0
    second = emitters(topics=[topic], control_topic=control)
    assert second.emitter.epoch == 2
    after_polls(second, POLLS_PAST_IDLE_TIMEOUT)  # it would have published duplicates by now
    markers = control_markers(broker.bootstrap_servers, control)
    assert sorted((m.partition, m.status, m.offset) for m in markers) == [
        (0, IDLE, 2),
        (1, IDLE, 0),
    ]
    produce_one(broker.bootstrap_servers, topic, 1)
    wait_until(
        lambda: len(control_markers(broker.bootstrap_servers, control)) == 3,
        DEADLINE_S,
        "ACTIVE after restart",
    )
    resumed = control_markers(broker.bootstrap_servers, control)[-1]
    assert (resumed.partition, resumed.status, resumed.offset) == (1, ACTIVE, 0)
    assert (resumed.epoch, resumed.seq) == (2, 1)  # new epoch; seq continues per partition


def test_newer_emitter_fences_the_older_one(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=1), _control()
    # Fenced, it pauses for one session before it claims again: longer than this test.
    old = emitters(
        topics=[topic], control_topic=control, idle_timeout_ms=60_000, session_timeout_ms=120_000
    )
    # An emitter outside the old one's group (another election_group: a second
    # deployment, an older version): both are active in their groups.
    new = emitters(
        topics=[topic], control_topic=control, idle_timeout_ms=60_000, election_group=_control()
    )
    assert (old.emitter.epoch, new.emitter.epoch) == (1, 2)
    # The new emitter's epoch claim alone fences the old one, before any marker; it
    # stands by (ready no more, live still) and does not claim again at once.
    wait_until(
        lambda: old.metric("slackwater_emitter_fenced") == 1, DEADLINE_S, "old emitter fenced"
    )
    assert new.metric("slackwater_emitter_fenced") == 0
    assert (old.status()["role"], new.status()["role"]) == ("fenced", "active")
    assert old.status()["partitions"] == []  # it reports no state it would not publish
    assert (old.probe("/ready"), old.probe("/live")) == (503, 200)
    assert (new.probe("/ready"), new.probe("/live")) == (200, 200)
    produce_one(broker.bootstrap_servers, topic, 0)
    assert _finish(broker, control, topic, 0).returncode == 0
    wait_until(lambda: control_markers(broker.bootstrap_servers, control), DEADLINE_S, "FINISHED")
    old_polls = polls_done(old)
    after_polls(new, 4)  # the old emitter would have published too by now
    assert polls_done(old) == old_polls  # it stands by: it does not even poll the broker
    markers = control_markers(broker.bootstrap_servers, control)
    assert [(m.status, m.offset, m.epoch) for m in markers] == [(FINISHED, 1, 2)]


def test_malformed_control_records_are_counted_and_skipped(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=1), _control()
    running = emitters(topics=[topic], control_topic=control)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for key, value in [
        (b"x", b"not json"),
        (f"{topic}:0".encode(), b'{"v": 9}'),
        (b"y", b'{"kind": "future_kind"}'),
    ]:
        producer.produce(control, key=key, value=value)
        producer.flush(10)
    wait_until(
        lambda: running.metric("slackwater_emitter_control_records_malformed_total") == 2,
        DEADLINE_S,
        "two malformed records counted",
    )
    wait_until(
        lambda: _markers_of(broker.bootstrap_servers, control, 0) == [(IDLE, 0)],
        DEADLINE_S,
        "the emitter still publishes",
    )


def test_topic_missing_at_start_is_reported_then_picked_up(
    broker: KafkaBroker, admin: AdminClient, emitters: EmitterFactory
) -> None:
    topic, control = f"late-{uuid.uuid4().hex[:12]}", _control()
    running = emitters(topics=[topic], control_topic=control)
    wait_until(
        lambda: running.metric("slackwater_emitter_topic_missing", topic=topic) == 1,
        DEADLINE_S,
        "missing topic reported",
    )
    assert running.status()["missing_topics"] == [topic]
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(10)
    wait_until(lambda: len(running.status()["partitions"]) == 3, DEADLINE_S, "partitions tracked")
    assert running.status()["missing_topics"] == []
    assert running.metric("slackwater_emitter_topic_missing", topic=topic) is None


def test_deleted_topic_partitions_become_finished(
    broker: KafkaBroker, admin: AdminClient, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=2), _control()
    produce_one(broker.bootstrap_servers, topic, 1, count=3)
    running = emitters(topics=[topic], control_topic=control, idle_timeout_ms=60_000)
    wait_until(lambda: len(running.status()["partitions"]) == 2, DEADLINE_S, "partitions tracked")
    admin.delete_topics([topic])[topic].result(10)
    wait_until(
        lambda: len(control_markers(broker.bootstrap_servers, control)) == 2,
        DEADLINE_S,
        "FINISHED markers",
    )
    assert sorted(
        (m.partition, m.status, m.offset)
        for m in control_markers(broker.bootstrap_servers, control)
    ) == [(0, FINISHED, 0), (1, FINISHED, 3)]


def test_group_lag_in_offsets_and_seconds(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control, group = new_topic(partitions=1), _control(), f"g-{uuid.uuid4().hex[:8]}"
    produce_one(broker.bootstrap_servers, topic, 0, count=2)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    commit(consumer, [TopicPartition(topic, 0, 2)])
    running = emitters(topics=[topic], control_topic=control, group=group, idle_timeout_ms=60_000)
    wait_until(
        lambda: (
            running.metric(
                "slackwater_emitter_group_lag_offsets", group=group, topic=topic, partition="0"
            )
            == 0
        ),
        DEADLINE_S,
        "lag 0",
    )
    after_polls(running, 3)
    produced_at = time.monotonic()
    produce_one(broker.bootstrap_servers, topic, 0, count=4)  # the group falls 4 behind
    wait_until(
        lambda: (
            running.metric(
                "slackwater_emitter_group_lag_offsets", group=group, topic=topic, partition="0"
            )
            == 4
        ),
        DEADLINE_S,
        "lag 4",
    )

    def lag_seconds() -> float | None:
        return running.metric(
            "slackwater_emitter_group_lag_seconds", group=group, topic=topic, partition="0"
        )

    first_lag_s = wait_until(lag_seconds, DEADLINE_S, "lag in seconds above 0")
    after_polls(running, 3)
    later_lag_s = lag_seconds()
    # While the group stands still its lag in seconds grows, and it can never exceed the
    # time since record 2 was produced (measured here, around the emitter's estimate).
    assert later_lag_s is not None and first_lag_s < later_lag_s
    assert later_lag_s <= time.monotonic() - produced_at + 2 * POLL_S
    commit(consumer, [TopicPartition(topic, 0, 6)])
    consumer.close()
    wait_until(
        lambda: (
            running.metric(
                "slackwater_emitter_group_lag_seconds", group=group, topic=topic, partition="0"
            )
            == 0
        ),
        DEADLINE_S,
        "caught up",
    )
    row = running.status()["partitions"][0]
    assert (row["lag_offsets"], row["lag_seconds"]) == (0, 0.0)


def test_emit_command_serves_metrics_and_exits_0_on_sigterm(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    from slackwater.kafka_broker import free_port

    topic, control, port = new_topic(partitions=1), _control(), free_port()
    process = subprocess.Popen(
        [
            *SLACKWATER,
            "emit",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--control-topic",
            control,
            "--idle-timeout",
            "1s",
            "--poll-interval",
            "200ms",
            "--metrics-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import urllib.request

        def scrape() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text: str = r.read().decode()
                    return text
            except OSError:
                return None

        text = wait_until(
            lambda: (t := scrape()) and "broker_up 1.0" in t and t, 15, "metrics with broker up"
        )
        assert "slackwater_emitter_poll_duration_seconds_count" in text
        wait_until(
            lambda: _markers_of(broker.bootstrap_servers, control, 0) == [(IDLE, 0)],
            5,
            "IDLE from the command",
        )
        process.terminate()
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_status_prints_on_a_polluted_topic_with_skips_by_reason_and_writers(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    import json

    from slackwater.markers import Marker, encode

    control = new_topic(partitions=1, prefix="ctl")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    good = Marker(
        topic="orders", partition=0, status=IDLE, offset=7, emitted_at=1, emitter_id="e1",
        epoch=3, seq=0,
    )  # fmt: skip
    huge = json.loads(encode(good)[1])
    huge["emitted_at"] = 10**23  # once an OverflowError in status
    for key, value in [
        encode(good),
        (b"orders:0", None),  # a tombstone
        (b"orders:0", b"not json"),
        (b"orders:0", json.dumps(huge).encode()),
        (b"orders:9", encode(good)[1]),  # the key does not match the value
    ]:
        producer.produce(control, key=key, value=value)
    assert producer.flush(10) == 0
    status = run_cli(
        "status", "--json", "--bootstrap-servers", broker.bootstrap_servers,
        "--control-topic", control,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert [(r["partition"], r["status"], r["offset"]) for r in document["partitions"]] == [
        (0, "IDLE", 7)
    ]
    assert document["skipped"] == {
        "invalid emitted_at": 1,
        "key does not match value": 1,
        "not JSON": 1,
        "tombstone": 1,
    }
    assert (document["malformed_records"], document["tombstones"]) == (3, 1)
    assert document["emitters"] == {"e1": [3]}
    assert "Traceback" not in status.stderr


def test_markers_for_topics_not_watched_do_not_become_partitions(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    from slackwater.markers import Marker, encode

    topic, control = new_topic(partitions=1), new_topic(partitions=1, prefix="ctl")
    forged = Marker(
        topic="someone-elses", partition=3, status=FINISHED, offset=0, emitted_at=1,
        emitter_id="forger", epoch=1, seq=0,
    )  # fmt: skip
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    key, value = encode(forged)
    producer.produce(control, key=key, value=value)
    assert producer.flush(10) == 0
    running = emitters(topics=[topic], control_topic=control)
    wait_until(lambda: _markers_of(broker.bootstrap_servers, control, 0), DEADLINE_S, "IDLE")
    assert [(p["topic"], p["partition"]) for p in running.status()["partitions"]] == [(topic, 0)]
    assert running.metric("slackwater_emitter_watched_partitions") == 1


def test_metrics_per_partition_false_serves_per_topic_aggregates(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory
) -> None:
    topic, control = new_topic(partitions=3), _control()
    produce_one(broker.bootstrap_servers, topic, 1, count=2)
    running = emitters(topics=[topic], control_topic=control, metrics_per_partition=False)
    after_polls(running, 2)
    assert running.metric("slackwater_emitter_partition_status") is None
    assert running.metric("slackwater_emitter_topic_partitions", topic=topic, status="ACTIVE") == 3
    assert running.metric("slackwater_emitter_watched_partitions") == 3
