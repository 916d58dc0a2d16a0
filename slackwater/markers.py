"""The control-topic protocol, version 1 (semantics.md §3).

One record per status change of one data partition:

    key   = "<topic>:<partition>"                    (UTF-8)
    value = {"v": 1, "topic", "partition", "status", "offset",
             "watermark_hint", "emitted_at", "emitter_id", "epoch", "seq"}

Other record kinds may travel on the same topic. They carry a ``kind`` field
that no marker has, and a key of their own, so that compaction never lets
them replace a partition's last marker. Two are defined here: the finish
request that ``slackwater finish`` writes and the emitter turns into a
FINISHED marker (the emitter stays the only writer of markers), keyed
``finish_request:<topic>:<partition>``; and the epoch claim an emitter writes
at start, keyed ``epoch_claim``. Consumers skip every record with a ``kind``;
they do not count it as malformed.

Decoding is strict: no type coercion, no unknown fields, and every rejection
raises :class:`MalformedControlRecord` with a one-line reason.
"""

from __future__ import annotations

import enum
import heapq
import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

PROTOCOL_VERSION = 1
FINISH_REQUEST_KIND = "finish_request"
EPOCH_CLAIM_KIND = "epoch_claim"
# Every record slackwater writes to the control topic goes to this partition, whatever
# its key and however many partitions the topic has: one log, so its order is the order
# of the writes (a claim fences every reader, a partition's markers never move).
CONTROL_PARTITION = 0

# Kafka topic names: 1-249 characters of [a-zA-Z0-9._-] (no ':' so keys split cleanly).
TOPIC_NAME_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
TopicName = Annotated[str, StringConstraints(pattern=TOPIC_NAME_PATTERN)]
# A data partition, as every reader of the protocol keys its state.
TopicPartitionKey = tuple[str, int]
# Every integer is one a JVM consumer can parse: a signed 64-bit value.
INT64_MAX = 2**63 - 1
NonNegativeInt = Annotated[int, Field(ge=0, le=INT64_MAX)]
# Kafka partitions are non-negative int32.
PartitionNumber = Annotated[int, Field(ge=0, le=2**31 - 1)]
# Epochs leave room for the next one (an emitter takes the highest seen + 1).
Epoch = Annotated[int, Field(ge=0, le=INT64_MAX - 1)]
# Wall-clock and event times in ms that a timestamp can hold (years 1 to 9999).
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999
TimestampMs = Annotated[int, Field(ge=MIN_TIMESTAMP_MS, le=MAX_TIMESTAMP_MS)]
WallClockMs = Annotated[int, Field(ge=0, le=MAX_TIMESTAMP_MS)]


_Model = TypeVar("_Model", bound=BaseModel)


class MalformedControlRecord(ValueError):
    """A control record that is not a valid marker or request; the message says why."""


class Tombstone(MalformedControlRecord):
    """A null value: compaction's deletion, not a marker. Skipped, counted apart."""


class MarkerStatus(enum.StrEnum):
    """The status a marker announces for its partition from its offset on."""

    ACTIVE = "ACTIVE"
    IDLE = "IDLE"
    FINISHED = "FINISHED"


_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)


class Marker(BaseModel):
    """A status change of one data partition, aligned to a data offset."""

    model_config = _STRICT

    v: Literal[1] = 1
    topic: TopicName
    partition: PartitionNumber
    status: MarkerStatus
    # IDLE@X / FINISHED@X: no data after the record before X (applies once the
    # consumer's read position reaches X). ACTIVE@X: new data starts at X.
    offset: NonNegativeInt
    # Newest record timestamp the emitter knows of (ms); display only.
    watermark_hint: TimestampMs | None = None
    emitted_at: WallClockMs
    emitter_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    # Emitter generation: markers of an older epoch than one seen are ignored.
    epoch: Epoch
    # Per partition, strictly increasing within an epoch.
    seq: NonNegativeInt

    @property
    def key(self) -> str:
        return partition_key(self.topic, self.partition)


class FinishRequest(BaseModel):
    """Asks the emitter to declare a partition FINISHED for ever."""

    model_config = _STRICT

    kind: Literal["finish_request"] = "finish_request"
    topic: TopicName
    partition: PartitionNumber
    requested_at: WallClockMs
    requested_by: Annotated[str, StringConstraints(min_length=1, max_length=256)]

    @property
    def key(self) -> str:
        return f"{FINISH_REQUEST_KIND}:{partition_key(self.topic, self.partition)}"


class EpochClaim(BaseModel):
    """An emitter taking a generation number before it writes any marker.

    All claims share one key, so compaction keeps the newest; the first claim
    of an epoch in log order owns it, and an emitter that sees a newer claim
    than its own knows it is fenced.
    """

    model_config = _STRICT

    kind: Literal["epoch_claim"] = "epoch_claim"
    emitter_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    epoch: Epoch
    claimed_at: WallClockMs

    @property
    def key(self) -> str:
        return EPOCH_CLAIM_KIND


class OtherRecord(BaseModel):
    """A record of a kind this version does not know: skipped, not counted as malformed."""

    model_config = ConfigDict(frozen=True)

    kind: str


ControlRecord = Marker | FinishRequest | EpochClaim | OtherRecord
# A record as a reader took it: a marker (the source reads only those), or any kind.
_Read = TypeVar("_Read", Marker, ControlRecord)


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def encode(record: Marker | FinishRequest | EpochClaim) -> tuple[bytes, bytes]:
    """The control-topic key and value of a marker, finish request or epoch claim."""
    return record.key.encode(), record.model_dump_json(exclude_none=False).encode()


def decode(key: bytes | str | None, value: bytes | str | None) -> ControlRecord:
    """Parses one control record; raises MalformedControlRecord saying what is wrong."""
    if value is None:
        raise Tombstone("null value (tombstone)")
    try:
        document: Any = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedControlRecord(f"value is not JSON: {error}") from None
    except ValueError as error:  # an integer of more digits than Python parses (4,300)
        raise MalformedControlRecord(f"value is not JSON: {str(error)[:80]}") from None
    except RecursionError:
        raise MalformedControlRecord("value is not JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise MalformedControlRecord(f"value is a JSON {type(document).__name__}, not an object")
    if "kind" in document:
        kind = document["kind"]
        if kind == FINISH_REQUEST_KIND:
            request = _validate(FinishRequest, value)
            _check_key(key, request.key)
            return request
        if kind == EPOCH_CLAIM_KIND:
            claim = _validate(EpochClaim, value)
            _check_key(key, claim.key)
            return claim
        if not isinstance(kind, str):
            raise MalformedControlRecord(f"kind: must be a string, got {kind!r}")
        return OtherRecord(kind=kind)
    version = document.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        raise MalformedControlRecord(f"v: unknown protocol version {version!r}")
    status = document.get("status")
    if isinstance(status, str) and status not in MarkerStatus.__members__:
        raise MalformedControlRecord(f"status: unknown status {status!r}")
    marker = _validate(Marker, value)
    _check_key(key, marker.key)
    return marker


def skip_reason(error: MalformedControlRecord) -> str:
    """A short, stable class of why a record was skipped, for counts by reason."""
    text = str(error)
    if isinstance(error, Tombstone):
        return "tombstone"
    for prefix, reason in (
        ("value is not JSON", "not JSON"),
        ("value is a JSON", "not a JSON object"),
        ("key ", "key does not match value"),
        ("v: ", "unknown version"),
        ("status: unknown", "unknown status"),
        ("kind: ", "invalid kind"),
        ("not a marker", "not a marker"),
    ):
        if text.startswith(prefix):
            return reason
    return f"invalid {text.split(':', 1)[0]}"


def _validate(model: type[_Model], value: bytes | str) -> _Model:
    try:
        # JSON mode: strict types, but enum members from their string values.
        return model.model_validate_json(value)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "value"
        raise MalformedControlRecord(f"{field}: {first['msg']}") from None


def _check_key(key: bytes | str | None, expected: str) -> None:
    if isinstance(key, bytes):
        try:
            key = key.decode()
        except UnicodeDecodeError:
            raise MalformedControlRecord("key is not UTF-8") from None
    if key != expected:
        raise MalformedControlRecord(f"key {key!r} does not match value (expected {expected!r})")


class Rejection(enum.StrEnum):
    """Why a partition's next marker is ignored (semantics.md §3); consumers count these."""

    STALE_EPOCH = "stale_epoch"
    AFTER_FINISHED = "after_finished"


def rejection(marker: Marker, epoch_seen: int, finished: bool) -> Rejection | None:
    """The acceptance rules of a partition's next marker, for every reader of the control
    topic (the emitter restoring, ``slackwater status``, the consumer's aligner): None
    when accepted. ``epoch_seen`` is the highest epoch accepted for the partition so far
    (-1 for none), ``finished`` whether a FINISHED marker was accepted. "Next" is in the
    protocol's order (``in_protocol_order``), never in the order the control topic's
    partitions happened to be read in."""
    # Markers of an older epoch than one seen for the partition are ignored.
    if marker.epoch < epoch_seen:
        return Rejection.STALE_EPOCH
    # FINISHED is terminal: anything after it is a violation, ignored.
    if finished:
        return Rejection.AFTER_FINISHED
    return None


def protocol_place(record: ControlRecord) -> tuple[int, int]:
    """A record's place in the protocol's order: a marker's (epoch, seq) (epochs order
    the emitters, seq rises per partition within one), an epoch claim just before its
    epoch's markers; a record of another kind has none, (-1, -1): it is taken where it
    comes."""
    if isinstance(record, Marker):
        return record.epoch, record.seq
    if isinstance(record, EpochClaim):
        return record.epoch, -1
    return -1, -1


def in_protocol_order(read: Iterable[tuple[int, _Read]]) -> list[_Read]:
    """Control records read as (control partition, record), in the order the protocol
    judges them, whatever order the partitions' records were read in.

    One partition's records keep its log's order: the order they were written in (a
    fenced emitter's late marker stays after the newer one, where the epoch rule
    rejects it). Where several partitions hold records (an old deployment's hashed
    keys, a user's writes), each data partition's records (and each finish request's,
    and the claims) are merged from the partitions' logs by ``protocol_place``: the
    lowest of the logs' next ones first, ties to the lower partition. A data
    partition's records are never held back behind another's."""
    logs: dict[int, list[_Read]] = {}
    for partition, record in read:
        logs.setdefault(partition, []).append(record)
    if len(logs) <= 1:  # one log: its order is the order
        return next(iter(logs.values()), [])
    streams: dict[str, dict[int, list[_Read]]] = {}
    for partition in sorted(logs):
        for record in logs[partition]:
            key = record.key if isinstance(record, Marker | FinishRequest | EpochClaim) else ""
            streams.setdefault(key, {}).setdefault(partition, []).append(record)
    ordered: list[_Read] = []
    for key in sorted(streams):
        # heapq.merge takes the lowest next record each time (ties to the earlier log): a
        # merge of the logs as they are, sorted or not.
        ordered += heapq.merge(*streams[key].values(), key=protocol_place)
    return ordered
