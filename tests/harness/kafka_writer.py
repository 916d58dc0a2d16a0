"""Writing a test's data records and markers to Kafka, with exact log ends."""

from __future__ import annotations

from confluent_kafka import Producer

from slackwater.markers import Marker, MarkerStatus, encode

BASE_MS = 1_700_000_000_000  # event times are BASE_MS + seconds * 1000


class Writer:
    """Data records and markers, one record per request (exact log ends, semantics.md §7)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        control_topic: str,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.topic, self.control_topic = topic, control_topic
        # A test that deletes its topic must not see this producer make it again.
        self.producer = Producer(
            {
                **(settings or {}),
                "bootstrap.servers": bootstrap,
                "linger.ms": 0,
                "allow.auto.create.topics": False,
            }
        )
        self.log_end: dict[int, int] = {}
        self.seq = 0

    def data(self, partition: int, *seconds: float, key: str = "k") -> None:
        for second in seconds:
            self.producer.produce(
                self.topic,
                key=key.encode(),
                value=b"{}",
                partition=partition,
                timestamp=BASE_MS + int(second * 1000),
            )
            assert self.producer.flush(10) == 0
            self.log_end[partition] = self.log_end.get(partition, 0) + 1

    def marker(self, partition: int, status: MarkerStatus, offset: int | None = None) -> None:
        marker = Marker(
            topic=self.topic,
            partition=partition,
            status=status,
            offset=self.log_end.get(partition, 0) if offset is None else offset,
            emitted_at=0,
            emitter_id="test",
            epoch=1,
            seq=self.seq,
        )
        self.seq += 1
        self.raw_control(*encode(marker))

    def raw_control(self, key: bytes | None, value: bytes | None) -> None:
        self.producer.produce(self.control_topic, key=key, value=value)
        assert self.producer.flush(10) == 0
