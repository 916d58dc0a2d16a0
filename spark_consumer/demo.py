"""``slackwater demo``: the story end to end on the embedded broker.

Until the emitter (issue 3) and the Spark consumer (issue 4) exist, the demo
plays both parts in a scripted way, with real parts underneath:

* a real Tansu broker on a loopback port, a 4-partition data topic and a
  compacted control topic;
* markers written with the real protocol (``emitter.markers``), at the exact
  log end offsets, standing in for the emitter;
* a confluent-kafka consumer that reads both topics, holds each marker until
  its read position reaches the marker's offset, and feeds per-partition
  watermarks (newest event time - max out-of-orderness) and statuses into the
  real :class:`StatusWatermarkValve`, printing every element it emits.

Timeline of the script (event time in seconds, p = partition):

    phase 1   p0..p3 all produce            -> watermark = min of the four
    phase 2   p3 quiet, IDLE@log_end(p3)    -> watermark follows p0..p2
    phase 3   p2 FINISHED@log_end(p2)       -> p2 leaves the min; never MAX
    phase 4   p0, p1 IDLE as well           -> flush to max of p0, p1, p3; IDLE
    phase 5   p3 resumes: ACTIVE@log_end    -> ACTIVE, then p3 drives the output
    phase 6   p0, p1, p3 FINISHED           -> MAX_WATERMARK, FINISHED
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from emitter.embedded_broker import EmbeddedBroker
from emitter.markers import Marker, MarkerStatus, decode, encode
from spark_consumer.valve import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    StatusWatermarkValve,
    Watermark,
    WatermarkStatus,
)

PARTITIONS = 4
MAX_OUT_OF_ORDERNESS_MS = 2_000
BASE_EVENT_TIME_MS = 1_700_000_000_000


def _describe(element: Watermark | WatermarkStatus) -> str:
    if isinstance(element, WatermarkStatus):
        return f"status {element.value}"
    if element.timestamp == MAX_WATERMARK:
        return "watermark MAX_WATERMARK"
    return f"watermark t={(element.timestamp - BASE_EVENT_TIME_MS) / 1000:+.1f}s"


@dataclass
class _Scenario:
    """Writes data and markers; remembers log end offsets (exact: one record per batch)."""

    bootstrap: str
    data_topic: str
    control_topic: str
    emitter_id: str = field(default_factory=lambda: f"demo-{uuid.uuid4().hex[:8]}")
    log_end: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(PARTITIONS), 0))
    seq: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(PARTITIONS), 0))

    def __post_init__(self) -> None:
        # One record per request: the embedded broker's log end is exact then (DESIGN §7).
        self._producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "enable.idempotence": True,
            }
        )

    def produce(self, partition: int, event_seconds: float) -> None:
        self._producer.produce(
            self.data_topic,
            key=f"k{partition}".encode(),
            value=b"{}",
            partition=partition,
            timestamp=BASE_EVENT_TIME_MS + int(event_seconds * 1000),
        )
        self._producer.flush(10)
        self.log_end[partition] += 1

    def marker(self, partition: int, status: MarkerStatus) -> Marker:
        marker = Marker(
            topic=self.data_topic,
            partition=partition,
            status=status,
            offset=self.log_end[partition],
            emitted_at=int(time.time() * 1000),
            emitter_id=self.emitter_id,
            epoch=1,
            seq=self.seq[partition],
        )
        self.seq[partition] += 1
        key, value = encode(marker)
        self._producer.produce(self.control_topic, key=key, value=value)
        self._producer.flush(10)
        return marker


class _Reader:
    """Reads data and control topics; aligns markers to read positions; drives the valve."""

    def __init__(self, bootstrap: str, data_topic: str, control_topic: str) -> None:
        self.data_topic = data_topic
        self.valve = StatusWatermarkValve(range(PARTITIONS))
        self.newest_event_ms = dict.fromkeys(range(PARTITIONS), MIN_WATERMARK)
        self.read_position = dict.fromkeys(range(PARTITIONS), 0)
        self.pending: dict[int, list[Marker]] = {p: [] for p in range(PARTITIONS)}
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"demo-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        assignment = [TopicPartition(data_topic, p, 0) for p in range(PARTITIONS)]
        assignment.append(TopicPartition(control_topic, 0, 0))
        self._consumer.assign(assignment)

    def poll_until_quiet(self, quiet_s: float = 0.6) -> list[str]:
        lines: list[str] = []
        last_record = time.monotonic()
        while time.monotonic() - last_record < quiet_s:
            message = self._consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            last_record = time.monotonic()
            partition, offset = message.partition(), message.offset()
            if message.topic() == self.data_topic and partition is not None and offset is not None:
                lines += self._on_data(partition, offset, message.timestamp()[1])
            else:
                record = decode(message.key(), message.value())
                if isinstance(record, Marker):
                    self.pending[record.partition].append(record)
            for partition in range(PARTITIONS):
                lines += self._apply_due_markers(partition)
        return lines

    def _on_data(self, partition: int, offset: int, event_ms: int) -> list[str]:
        self.read_position[partition] = offset + 1
        lines = []
        if self.valve.channel_status(partition) is WatermarkStatus.IDLE:
            # Data beats markers: a record on an IDLE partition makes it ACTIVE at once.
            lines += self._feed(partition, WatermarkStatus.ACTIVE, "data on an IDLE partition")
        self.newest_event_ms[partition] = max(self.newest_event_ms[partition], event_ms)
        watermark = self.newest_event_ms[partition] - MAX_OUT_OF_ORDERNESS_MS
        for element in self.valve.input_watermark(partition, watermark):
            lines.append(f"  valve emits {_describe(element)}   (p{partition} read to {offset})")
        return lines

    def _apply_due_markers(self, partition: int) -> list[str]:
        lines = []
        while self.pending[partition]:
            marker = self.pending[partition][0]
            # IDLE@X / FINISHED@X wait until the read position reaches X; ACTIVE applies at once.
            if (
                marker.status is not MarkerStatus.ACTIVE
                and self.read_position[partition] < marker.offset
            ):
                break
            self.pending[partition].pop(0)
            status = WatermarkStatus(marker.status.value)
            lines += self._feed(partition, status, f"marker {marker.status.value}@{marker.offset}")
        return lines

    def _feed(self, partition: int, status: WatermarkStatus, why: str) -> list[str]:
        if self.valve.channel_status(partition) is status:
            return [f"  p{partition} already {status.value} ({why}: nothing to do)"]
        lines = [f"  p{partition} -> {status.value:<8} ({why})"]
        for element in self.valve.input_status(partition, status):
            lines.append(f"  valve emits {_describe(element)}")
        return lines

    def close(self) -> None:
        self._consumer.close()


def run_demo() -> int:
    started = time.monotonic()
    with EmbeddedBroker() as broker:
        print(f"embedded broker (Tansu) on {broker.bootstrap_servers}")
        # Every client lives inside _play, so all are gone before the broker stops.
        valve = _play(broker.bootstrap_servers)
    print(
        f"\nfinal valve status {valve.status.value}, "
        f"{_describe(Watermark(valve.watermark))}; {time.monotonic() - started:.1f}s"
    )
    ok = valve.status is WatermarkStatus.FINISHED and valve.watermark == MAX_WATERMARK
    return 0 if ok else 1


def _play(bootstrap: str) -> StatusWatermarkValve:
    data_topic, control_topic = "demo-events", "demo-control"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(data_topic, num_partitions=PARTITIONS, replication_factor=1),
            NewTopic(
                control_topic,
                num_partitions=1,
                replication_factor=1,
                config={"cleanup.policy": "compact"},
            ),
        ]
    )
    for future in futures.values():
        future.result(10)
    print(f"topics: {data_topic} ({PARTITIONS} partitions), {control_topic} (compacted)")
    scenario = _Scenario(bootstrap, data_topic, control_topic)
    reader = _Reader(bootstrap, data_topic, control_topic)
    try:
        for title, action in _phases(scenario):
            print(f"\n== {title}")
            action()
            for line in reader.poll_until_quiet():
                print(line)
    finally:
        reader.close()
    return reader.valve


def _phases(s: _Scenario) -> list[tuple[str, Callable[[], None]]]:
    def steady(partitions: list[int], start: int, stop: int) -> None:
        for second in range(start, stop):
            for partition in partitions:
                # Out of order within bounds: every third record is 1.5 s old.
                s.produce(partition, second - (1.5 if second % 3 == 0 else 0))

    def phase1() -> None:
        steady([0, 1, 2, 3], 0, 5)

    def phase2() -> None:
        print(f"  p3 goes quiet; IDLE@{s.marker(3, MarkerStatus.IDLE).offset}")
        steady([0, 1, 2], 5, 10)

    def phase3() -> None:
        print(f"  p2 ends for good; FINISHED@{s.marker(2, MarkerStatus.FINISHED).offset}")
        steady([0, 1], 10, 13)

    def phase4() -> None:
        s.produce(0, 13)  # p0 ends a second ahead of p1: the flush below jumps to it
        for partition in (0, 1):
            marker = s.marker(partition, MarkerStatus.IDLE)
            print(f"  p{partition} goes quiet; IDLE@{marker.offset}")

    def phase5() -> None:
        print(f"  p3 resumes; ACTIVE@{s.marker(3, MarkerStatus.ACTIVE).offset}")
        steady([3], 14, 18)

    def phase6() -> None:
        for partition in (0, 1, 3):
            marker = s.marker(partition, MarkerStatus.FINISHED)
            print(f"  p{partition} ends for good; FINISHED@{marker.offset}")

    return [
        ("phase 1: all four partitions produce", phase1),
        ("phase 2: p3 goes quiet (IDLE); windows keep closing on p0..p2", phase2),
        ("phase 3: p2 FINISHED while p3 IDLE: p2 leaves the min, no MAX (FLINK-38477)", phase3),
        (
            "phase 4: p0 and p1 IDLE too: flush to the max of unfinished partitions, then IDLE",
            phase4,
        ),
        ("phase 5: p3 resumes (ACTIVE); its watermark drives the output again", phase5),
        ("phase 6: every partition FINISHED: MAX_WATERMARK, then FINISHED", phase6),
    ]
