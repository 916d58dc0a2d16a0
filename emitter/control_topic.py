"""The control topic: create it, read it back, append markers and requests to it."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from slackwater import kafka_clients, kafka_evidence
from slackwater.list_offsets import retriable
from slackwater.markers import (
    CONTROL_PARTITION,
    ControlRecord,
    EpochClaim,
    FinishRequest,
    MalformedControlRecord,
    Marker,
    MarkerStatus,
    Tombstone,
    decode,
    encode,
    in_protocol_order,
    rejection,
    skip_reason,
)

log = logging.getLogger(__name__)


class ControlTopicError(RuntimeError):
    """The control topic could not be created, read or written."""


def ensure_control_topic(admin: AdminClient, name: str, timeout_s: float) -> bool:
    """Creates the topic compacted if missing; returns True if it had to be created.

    An existing topic that is not compacted is used as it is, with a warning:
    changing a topic's retention is the operator's decision, not ours.
    """
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics.get(name)
    if existing is not None and existing.error is None:
        _warn_unless_compacted(admin, name, timeout_s)
        return False
    topic = NewTopic(
        name, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"}
    )
    try:
        return kafka_clients.create_topic(admin, topic, timeout_s)
    except KafkaException as error:
        raise ControlTopicError(f"cannot create control topic {name!r}: {error}") from error


def _warn_unless_compacted(admin: AdminClient, name: str, timeout_s: float) -> None:
    resource = ConfigResource(ResourceType.TOPIC, name)
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource]
        policy = kafka_clients.answer(configs, timeout_s).get("cleanup.policy")
    except Exception as error:
        log.info("could not read cleanup.policy of %s: %s", name, error)
        return
    if policy is not None and "compact" not in str(policy.value):
        log.warning(
            "control topic %s has cleanup.policy=%s, not compact: old markers may "
            "expire and a restarted consumer would not see a partition's status",
            name,
            policy.value,
        )


@dataclass
class ReadBack:
    """Records read from the control topic, in log order, and the malformed count."""

    records: list[ControlRecord] = field(default_factory=list)
    malformed: int = 0
    # Null values: compaction's deletions, skipped and counted apart from malformed ones.
    tombstones: int = 0
    # Skipped records by reason (skip_reason), tombstones included.
    skipped: dict[str, int] = field(default_factory=dict)


class ControlTopicReader:
    """Reads every partition of the control topic from the beginning, then follows it."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        kafka_config: dict[str, str],
        timeout_s: float,
        on_malformed: Callable[[str], None] | None = None,
    ) -> None:
        self._topic = topic
        self._timeout_s = timeout_s
        self._on_malformed = on_malformed
        self._consumer = kafka_clients.consumer(
            "control-reader",
            bootstrap_servers,
            kafka_config,
            {
                "group.id": f"slackwater-control-reader-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
            },
        )
        try:
            metadata = self._consumer.list_topics(topic, timeout=timeout_s)
            refused = getattr(metadata.topics.get(topic), "error", None)
            if refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                # Refused, the topic has no partitions to read: an empty read-back would
                # let an emitter claim epoch 1 over markers it cannot see.
                raise KafkaException(refused)
        except KafkaException:
            # Serves the error callback first: a failed authentication is reported there
            # (kafka_logging.authentication_failure), the request only as a transport error.
            self._consumer.poll(0)
            self._consumer.close()
            raise
        partitions = metadata.topics[topic].partitions
        self._partitions = [TopicPartition(topic, p, 0) for p in partitions]
        self._consumer.assign(self._partitions)

    def follow(self, partition_count: int) -> None:
        """Reads the partitions added to the topic since (``partition_count``, from its
        metadata), each from its start: a record written there (an old emitter's hashed
        key, a user's write) is read as any other, and a newer claim fences this one."""
        added = [
            TopicPartition(self._topic, p, 0) for p in range(len(self._partitions), partition_count)
        ]
        if added:
            self._consumer.incremental_assign(added)
            self._partitions += added

    def start_again(self) -> None:
        """Reads the topic again from the start of every partition it has now: it was
        made again (a new log), so the positions in the old one mean nothing. Raises
        ControlTopicError if the broker does not list it before the read deadline."""
        deadline = time.monotonic() + max(30.0, self._timeout_s * 6)
        while True:
            try:
                listed = self._consumer.list_topics(self._topic, timeout=self._timeout_s)
                described = listed.topics.get(self._topic)
                if described is not None and described.error is None and described.partitions:
                    break
            except KafkaException as error:
                if not retriable(error.args[0]):
                    raise
            if time.monotonic() > deadline:
                raise ControlTopicError(f"control topic {self._topic!r} is not listed again")
            time.sleep(0.2)
        self._consumer.unassign()
        self._partitions = [TopicPartition(self._topic, p, 0) for p in described.partitions]
        self._consumer.assign(self._partitions)

    def read_to_end(self) -> ReadBack:
        """Everything up to the end of every partition as of now, in the protocol's order
        (``markers.in_protocol_order``: one partition's log order; several merged by
        (epoch, seq), however their records interleaved as they were read)."""
        deadline = time.monotonic() + max(30.0, self._timeout_s * 6)
        ends = {tp.partition: self._log_end(tp, deadline) for tp in self._partitions}
        positions = dict.fromkeys(ends, 0)
        read = ReadBack()
        placed: list[tuple[int, ControlRecord]] = []
        while any(positions[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise ControlTopicError(f"timed out reading back control topic {self._topic!r}")
            message = self._consumer.poll(0.2)
            if message is None:
                continue
            taken = len(read.records)
            self._take(message, read)
            partition, offset = message.partition(), message.offset()
            if partition is not None and offset is not None:
                positions[partition] = offset + 1
                placed += [(partition, record) for record in read.records[taken:]]
        read.records = in_protocol_order(placed)
        return read

    def _log_end(self, partition: TopicPartition, deadline: float) -> int:
        """The partition's log end, asked again, leaders fetched anew, while the answer may
        change (a leader moving after a broker died: NOT_LEADER_FOR_PARTITION until the
        client learns the new one, OFFSET_NOT_AVAILABLE while its high watermark catches
        up)."""
        while True:
            try:
                _, high = self._consumer.get_watermark_offsets(partition, timeout=self._timeout_s)
                if kafka_evidence.known_offset(int(high)):
                    return int(high)
                if time.monotonic() > deadline:  # no leader answered (kafka_evidence rule 5)
                    raise KafkaException(
                        KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"log end unknown ({high})")
                    )
            except KafkaException as error:
                if not retriable(error.args[0]) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)
            remaining_s = max(0.1, deadline - time.monotonic())
            kafka_clients.refresh_leaders(self._consumer, min(remaining_s, self._timeout_s))

    def read_until(
        self,
        predicate: Callable[[ControlRecord], bool],
        timeout_s: float,
    ) -> ReadBack:
        """Reads on until a record matching ``predicate`` arrives (included)."""
        read = ReadBack()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self._consumer.poll(0.1)
            if message is None:
                continue
            before = len(read.records)
            self._take(message, read)
            if len(read.records) > before and predicate(read.records[-1]):
                return read
        raise ControlTopicError(f"timed out reading control topic {self._topic!r}")

    def poll_new(self, max_records: int = 1_000) -> ReadBack:
        """Whatever arrived since the last call; does not wait."""
        read = ReadBack()
        for message in self._consumer.consume(num_messages=max_records, timeout=0):
            self._take(message, read)
        return read

    def _take(self, message: Message, read: ReadBack) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("control topic read error: %s", error)
            return
        try:
            read.records.append(decode(message.key(), message.value()))
        except Tombstone as tombstone:
            read.tombstones += 1
            read.skipped["tombstone"] = read.skipped.get("tombstone", 0) + 1
            log.debug("skipping tombstone at %s: %s", message.offset(), tombstone)
        except MalformedControlRecord as malformed:
            read.malformed += 1
            reason = skip_reason(malformed)
            read.skipped[reason] = read.skipped.get(reason, 0) + 1
            # One line per malformed record only while they are few: a polluted topic
            # must not flood the log (the counts are in metrics and `status`).
            (log.warning if read.malformed <= 10 else log.debug)(
                "skipping malformed control record at %s[%s]@%s: %s",
                message.topic(),
                message.partition(),
                message.offset(),
                malformed,
            )
            if self._on_malformed is not None:
                self._on_malformed(str(malformed))

    def close(self) -> None:
        self._consumer.close()


class ControlTopicWriter:
    """Appends markers and requests one at a time, each confirmed before the next."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        kafka_config: dict[str, str],
        delivery_timeout_s: float,
    ) -> None:
        self._topic = topic
        self._delivery_timeout_s = delivery_timeout_s
        self._producer = kafka_clients.producer(
            "control-writer",
            bootstrap_servers,
            kafka_config,
            {
                "enable.idempotence": True,
                "acks": "all",
                # Markers are rare and ordered: each its own request (semantics.md §4).
                "linger.ms": 0,
                "message.timeout.ms": int(delivery_timeout_s * 1000),
            },
        )

    def write(self, record: Marker | FinishRequest | EpochClaim) -> None:
        """Returns once the broker acknowledged the record; raises ControlTopicError if not."""
        key, value = encode(record)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def delivered(error: KafkaError | None, message: Message) -> None:
            outcome["error"] = error
            done.set()

        try:
            # One partition whatever the key (markers.CONTROL_PARTITION): its log order
            # is the order of every claim, marker and request, for every reader.
            self._producer.produce(
                self._topic,
                key=key,
                value=value,
                partition=CONTROL_PARTITION,
                on_delivery=delivered,
            )
        except (BufferError, KafkaException) as error:
            raise ControlTopicError(f"cannot queue control record: {error}") from error
        # Wait for the delivery report itself (success or failure), never just a
        # flush timeout: a record still queued could land after we gave up on it.
        deadline = time.monotonic() + self._delivery_timeout_s + 5
        while not done.is_set() and time.monotonic() < deadline:
            self._producer.poll(0.1)
        if not done.is_set():
            raise ControlTopicError("no delivery report for a control record")
        if outcome["error"] is not None:
            raise ControlTopicError(f"control record not delivered: {outcome['error']}")

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)


def claim_epoch(
    reader: ControlTopicReader,
    writer: ControlTopicWriter,
    emitter_id: str,
    history: list[ControlRecord],
    *,
    wall_ms: int,
    timeout_s: float,
    epoch_floor: int = 0,
    may_claim: Callable[[], bool] = lambda: True,
) -> tuple[int, ReadBack]:
    """Takes an epoch above every epoch in ``history`` and above ``epoch_floor`` (the
    highest this process saw: a control topic deleted and created again holds none of
    the old epochs, which consumers still hold); the first claim of an epoch wins.

    Returns the epoch and what was read while claiming (other records may
    have arrived meanwhile: finish requests, say). ``may_claim`` is asked before every
    claim: an emitter that lost the election meanwhile claims no more (else it would
    claim above the new active one's claim and fence it).
    """
    seen = list(history)
    read_meanwhile = ReadBack()
    for _ in range(10):
        epoch = 1 + max(
            (r.epoch for r in seen if isinstance(r, Marker | EpochClaim)), default=epoch_floor
        )
        epoch = max(epoch, epoch_floor + 1)
        if not may_claim():
            raise ControlTopicError("no longer the elected emitter: no epoch claimed")
        writer.write(EpochClaim(emitter_id=emitter_id, epoch=epoch, claimed_at=wall_ms))
        read = reader.read_until(
            lambda r, e=epoch: (
                isinstance(r, EpochClaim)  # type: ignore[misc]
                and r.emitter_id == emitter_id
                and r.epoch == e
            ),
            timeout_s,
        )
        read_meanwhile.records += read.records
        read_meanwhile.malformed += read.malformed
        rivals = [
            r for r in read.records[:-1] if isinstance(r, Marker | EpochClaim) and r.epoch >= epoch
        ]
        if not rivals:
            return epoch, read_meanwhile
        seen += read.records
    raise ControlTopicError("could not claim an epoch: other emitters keep claiming")


def last_marker_per_partition(records: Iterable[ControlRecord]) -> dict[tuple[str, int], Marker]:
    """The marker a consumer would hold last for each partition, ``records`` taken in
    the protocol's order (``markers.in_protocol_order``, as ``read_to_end`` gives them):
    records of several control partitions give the same answer however they were read.

    A marker the protocol's acceptance rules reject (``markers.rejection``: an older
    epoch, anything after FINISHED) is ignored, as consumers ignore it.
    """
    latest: dict[tuple[str, int], Marker] = {}
    for record in records:
        if not isinstance(record, Marker):
            continue
        key = (record.topic, record.partition)
        held = latest.get(key)
        if (
            held is None
            or rejection(record, held.epoch, held.status is MarkerStatus.FINISHED) is None
        ):
            latest[key] = record
    return latest
