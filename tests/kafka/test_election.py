"""Several emitters on one control topic: one active, the others standing by, through
SIGKILLs and a SIGSTOP past the session (election.py), on Apache Kafka."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from emitter.control_topic import ControlTopicReader
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import ControlRecord, EpochClaim, Marker, MarkerStatus
from tests.conftest import EmitterFactory, TopicFactory
from tests.harness.emitter_processes import EmitterProcess, probe, start_emitter_process
from tests.harness.factories import run_cli, wait_until

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED
# Bounds a wait that spans a session timeout (2 s) and a start; no outcome depends on it.
TAKEOVER_DEADLINE_S = 60.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Writes:
    """Records written one at a time, each with when it was sent and acknowledged (wall
    ms, the clock the emitters stamp markers with)."""

    bootstrap: str
    topic: str
    sent_ms: dict[int, list[int]] = field(default_factory=dict)
    acked_ms: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})

    def write(self, *counts: tuple[int, int]) -> None:
        """(partition, records) pairs, in order."""
        for partition, count in counts:
            self._write(partition, count)

    def _write(self, partition: int, count: int) -> None:
        for _ in range(count):
            self.sent_ms.setdefault(partition, []).append(_now_ms())
            self._producer.produce(self.topic, value=b"{}", partition=partition)
            assert self._producer.flush(10) == 0
            self.acked_ms.setdefault(partition, []).append(_now_ms() + 1)

    def end(self, partition: int) -> int:
        return len(self.sent_ms.get(partition, []))

    def valid(self, marker: Marker) -> bool:
        """The marker is true of the data as written when it was emitted: an IDLE or
        FINISHED offset is a log end of that moment (at least every record acknowledged
        before it, at most every record sent before it); an ACTIVE offset is below the
        records sent before it (new data starts there)."""
        sent = sum(1 for t in self.sent_ms.get(marker.partition, []) if t <= marker.emitted_at)
        acked = sum(1 for t in self.acked_ms.get(marker.partition, []) if t < marker.emitted_at)
        if marker.status is ACTIVE:
            return marker.offset < sent
        return acked <= marker.offset <= sent


def _records(bootstrap: str, control: str) -> list[ControlRecord]:
    reader = ControlTopicReader(bootstrap, control, {}, 5.0)
    try:
        return reader.read_to_end().records
    finally:
        reader.close()


def _markers(bootstrap: str, control: str) -> list[Marker]:
    return [r for r in _records(bootstrap, control) if isinstance(r, Marker)]


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[EmitterProcess]]:
    running: list[EmitterProcess] = []
    yield running
    for emitter in running:
        emitter.terminate()


def _the_active(emitters: list[EmitterProcess], above_epoch: int) -> EmitterProcess:
    """The one emitter that is active at an epoch above ``above_epoch``, once every other
    live one stands by."""

    def one_active() -> EmitterProcess | None:
        roles = [(e, e.status()) for e in emitters if e.process.poll() is None and not e.stopped]
        active = [e for e, s in roles if s is not None and s["role"] == "active"]
        standing_by = [e for e, s in roles if s is not None and s["role"] == "standby"]
        if len(active) == 1 and len(active) + len(standing_by) == len(roles):
            epoch = active[0].epoch()
            if epoch is not None and epoch > above_epoch:
                return active[0]
        return None

    try:
        found: EmitterProcess = wait_until(one_active, TAKEOVER_DEADLINE_S, "one active emitter")
    except AssertionError as error:
        logs = "\n".join(f"{e.emitter_id}: {e.log.read_text()[-1500:]}" for e in emitters)
        raise AssertionError(f"{error}\n{logs}") from None
    return found


def _idle_at_ends(
    bootstrap: str, control: str, writes: Writes, partitions: list[int], epoch: int
) -> None:
    """Waits for an IDLE at each partition's log end, published at ``epoch`` or later."""

    def done() -> bool:
        markers = _markers(bootstrap, control)
        return all(
            any(
                m.partition == p
                and m.status is IDLE
                and m.offset == writes.end(p)
                and m.epoch >= epoch
                for m in markers
            )
            for p in partitions
        )

    wait_until(done, TAKEOVER_DEADLINE_S, f"IDLE of {partitions} at epoch {epoch} or later")


def test_three_emitters_take_over_through_two_kills_and_a_freeze_and_publish_one_per_epoch(
    broker: KafkaBroker, new_topic: TopicFactory, replicas: list[EmitterProcess], tmp_path: Path
) -> None:
    bootstrap, topic = broker.bootstrap_servers, new_topic(partitions=4)
    control = f"ctl-{uuid.uuid4().hex[:12]}"
    writes = Writes(bootstrap, topic)

    def start(name: str) -> EmitterProcess:
        replicas.append(start_emitter_process(bootstrap, topic, control, name, tmp_path))
        return replicas[-1]

    for name in ("e1", "e2", "e3"):
        start(name)
    active = _the_active(replicas, above_epoch=0)
    epochs = [active.epoch() or 0]
    standby = next(e for e in replicas if e is not active)
    # Only the active one is ready; every one is live; a standby reports no partition.
    assert (probe(active.port, "/ready"), probe(standby.port, "/ready")) == (200, 503)
    assert (probe(active.port, "/live"), probe(standby.port, "/live")) == (200, 200)
    assert (standby.status() or {}).get("partitions") == []

    writes.write((0, 2), (1, 1), (2, 3), (3, 2))
    _idle_at_ends(bootstrap, control, writes, [0, 1, 2, 3], epochs[-1])
    # A finish requested, and the active one killed before it may have published it.
    assert (
        run_cli(
            "finish",
            "--bootstrap-servers",
            bootstrap,
            "--control-topic",
            control,
            "--topic",
            topic,
            "--partition",
            "3",
        ).returncode
        == 0
    )
    active.kill()
    active = _the_active(replicas, above_epoch=epochs[-1])
    epochs.append(active.epoch() or 0)
    start("e4")  # the replica the deployment starts again
    writes.write((0, 3), (1, 2))  # resume, then quiet: IDLE again at the new epoch
    _idle_at_ends(bootstrap, control, writes, [0, 1], epochs[-1])

    active.kill()
    active = _the_active(replicas, above_epoch=epochs[-1])
    epochs.append(active.epoch() or 0)
    start("e5")
    writes.write((0, 1), (2, 2))
    _idle_at_ends(bootstrap, control, writes, [0, 2], epochs[-1])

    frozen = active
    frozen.freeze()  # cut off past its session: the group evicts it
    active = _the_active(replicas, above_epoch=epochs[-1])
    epochs.append(active.epoch() or 0)
    writes.write((1, 2))
    _idle_at_ends(bootstrap, control, writes, [1], epochs[-1])
    frozen.thaw()  # back: it stands by instead of exiting or publishing
    wait_until(lambda: frozen.role() == "standby", TAKEOVER_DEADLINE_S, "the old one stands by")
    assert frozen.process.poll() is None
    writes.write((0, 1), (2, 1))
    _idle_at_ends(bootstrap, control, writes, [0, 1, 2], epochs[-1])
    assert _the_active(replicas, above_epoch=epochs[-2]) is active

    records = _records(bootstrap, control)
    # Exactly one emitter publishes at any epoch: the first to claim it.
    owner: dict[int, str] = {}
    for record in records:
        if isinstance(record, EpochClaim):
            owner.setdefault(record.epoch, record.emitter_id)
    markers = [r for r in records if isinstance(r, Marker)]
    assert all(owner.get(m.epoch) == m.emitter_id for m in markers), markers
    assert set(epochs) <= set(owner) and len(set(epochs)) == 4  # four terms, four epochs
    # Every marker is true of the data as written when it was published.
    assert [m for m in markers if not writes.valid(m)] == []
    # No FINISHED lost: the finish requested before the first kill was published, at
    # the partition's end, and nothing followed it.
    finished = [m for m in markers if m.partition == 3 and m.status is FINISHED]
    assert [m.offset for m in finished] == [writes.end(3)]
    assert markers.index(finished[0]) == max(i for i, m in enumerate(markers) if m.partition == 3)


def test_a_claim_goes_above_the_last_epoch_even_when_the_control_topic_was_deleted_meanwhile(
    broker: KafkaBroker, new_topic: TopicFactory, emitters: EmitterFactory, admin: AdminClient
) -> None:
    topic, control = new_topic(partitions=1), f"ctl-{uuid.uuid4().hex[:12]}"
    first = emitters(topics=[topic], control_topic=control)
    assert first.stop() == 0
    second = emitters(topics=[topic], control_topic=control)
    last_epoch = second.emitter.epoch
    assert last_epoch == 2
    assert second.stop() == 0
    # Deleted while no emitter runs: nothing on Kafka's data side holds epoch 2 any more,
    # but consumers do (they ignore a marker of an older epoch than one they hold).
    admin.delete_topics([control])[control].result(30)
    wait_until(
        lambda: control not in admin.list_topics(timeout=10).topics, 30, "control topic deleted"
    )
    third = emitters(topics=[topic], control_topic=control)
    assert third.emitter.epoch == last_epoch + 1  # the group's kept offset is the floor
