"""The control-topic protocol (semantics.md §3): strict decoding, one error type, round trips;
the protocol's order of records read from several partitions of the control topic."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slackwater.markers import (
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    ControlRecord,
    EpochClaim,
    FinishRequest,
    MalformedControlRecord,
    Marker,
    MarkerStatus,
    OtherRecord,
    Tombstone,
    decode,
    encode,
    in_protocol_order,
)
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from tests.harness.control_histories import interleavings, written_histories
from tests.harness.factories import json_shaped_bytes

VALID: dict[str, Any] = {
    "v": 1,
    "topic": "orders",
    "partition": 3,
    "status": "IDLE",
    "offset": 42,
    "watermark_hint": 1_700_000_000_000,
    "emitted_at": 1_700_000_000_500,
    "emitter_id": "emitter-a",
    "epoch": 2,
    "seq": 7,
}
KEY = b"orders:3"


def _decode_marker(key: bytes | str | None, value: bytes | str | None) -> Marker:
    record = decode(key, value)
    assert isinstance(record, Marker), record
    return record


def _value(**changes: Any) -> bytes:
    document = {**VALID, **changes}
    return json.dumps({k: v for k, v in document.items() if v is not _DROP}).encode()


_DROP = object()


def _rejected(key: bytes | None, value: bytes | None) -> str:
    with pytest.raises(MalformedControlRecord) as caught:
        decode(key, value)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_valid_marker_decodes_to_its_fields() -> None:
    marker = _decode_marker(KEY, _value())
    assert marker == Marker(
        topic="orders",
        partition=3,
        status=MarkerStatus.IDLE,
        offset=42,
        watermark_hint=1_700_000_000_000,
        emitted_at=1_700_000_000_500,
        emitter_id="emitter-a",
        epoch=2,
        seq=7,
    )
    assert marker.key == "orders:3"


def test_watermark_hint_is_optional() -> None:
    assert _decode_marker(KEY, _value(watermark_hint=_DROP)).watermark_hint is None


def test_rejects_bad_json() -> None:
    assert "not JSON" in _rejected(KEY, b'{"v": 1,')


def test_rejects_non_utf8_value() -> None:
    assert "not JSON" in _rejected(KEY, b"\xff\xfe")


def test_rejects_json_that_is_not_an_object() -> None:
    assert "not an object" in _rejected(KEY, b"[1, 2]")


def test_rejects_tombstone() -> None:
    assert "tombstone" in _rejected(KEY, None)


@pytest.mark.parametrize("version", [0, 2, "1", None, True])
def test_rejects_unknown_version(version: object) -> None:
    assert "unknown protocol version" in _rejected(KEY, _value(v=version))


def test_rejects_missing_version() -> None:
    assert "unknown protocol version None" in _rejected(KEY, _value(v=_DROP))


@pytest.mark.parametrize("status", ["PAUSED", "idle", ""])
def test_rejects_unknown_status(status: str) -> None:
    assert "status" in _rejected(KEY, _value(status=status))


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("partition", "3"),
        ("offset", 4.5),
        ("offset", "42"),
        ("epoch", None),
        ("seq", True),
        ("topic", 5),
        ("emitter_id", ["a"]),
        ("status", 1),
        ("watermark_hint", "soon"),
        ("emitted_at", 1.0),
    ],
)
def test_rejects_wrong_types_naming_the_field(field: str, bad: object) -> None:
    assert _rejected(KEY, _value(**{field: bad})).startswith(f"{field}:")


@pytest.mark.parametrize("field", ["offset", "partition", "epoch", "seq", "emitted_at"])
def test_rejects_negative_numbers(field: str) -> None:
    key = b"orders:-1" if field == "partition" else KEY
    assert _rejected(key, _value(**{field: -1})).startswith(f"{field}:")


@pytest.mark.parametrize("field", ["topic", "partition", "status", "offset", "emitter_id"])
def test_rejects_missing_required_field(field: str) -> None:
    assert _rejected(KEY, _value(**{field: _DROP})).startswith(f"{field}:")


def test_rejects_unknown_field() -> None:
    assert _rejected(KEY, _value(colour="blue")).startswith("colour:")


def test_rejects_invalid_topic_name() -> None:
    assert _rejected(b"a:b:3", _value(topic="a:b")).startswith("topic:")


@pytest.mark.parametrize("key", [b"orders:4", b"other:3", b"orders", None, b"\xff"])
def test_rejects_key_value_mismatch(key: bytes | None) -> None:
    message = _rejected(key, _value())
    assert "key" in message


def test_records_with_a_kind_are_not_markers_and_not_malformed() -> None:
    assert decode(b"whatever", b'{"kind": "heartbeat", "x": 1}') == OtherRecord(kind="heartbeat")


def test_finish_request_round_trip_and_own_key() -> None:
    request = FinishRequest(topic="orders", partition=3, requested_at=5, requested_by="ops")
    key, value = encode(request)
    assert key == b"finish_request:orders:3"  # never compacts away the partition's marker
    assert decode(key, value) == request


def test_malformed_finish_request_is_malformed() -> None:
    value = b'{"kind": "finish_request", "topic": "orders", "partition": -1}'
    assert _rejected(b"finish_request:orders:-1", value).startswith("partition:")


markers = st.builds(
    Marker,
    topic=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
    partition=st.integers(0, 2**31 - 1),
    status=st.sampled_from(list(MarkerStatus)),
    offset=st.integers(0, 2**63 - 1),
    watermark_hint=st.one_of(st.none(), st.integers(MIN_TIMESTAMP_MS, MAX_TIMESTAMP_MS)),
    emitted_at=st.integers(0, MAX_TIMESTAMP_MS),
    emitter_id=st.text(min_size=1, max_size=50),
    epoch=st.integers(0, 2**63 - 2),
    seq=st.integers(0, 2**63 - 1),
)


@given(markers)
def test_decode_encode_round_trip(marker: Marker) -> None:
    key, value = encode(marker)
    assert key == f"{marker.topic}:{marker.partition}".encode()
    assert decode(key, value) == marker


@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=30)))
def test_arbitrary_bytes_never_raise_anything_but_malformed(
    value: bytes, key: bytes | None
) -> None:
    with contextlib.suppress(MalformedControlRecord):
        decode(key, value)


def test_epoch_claim_round_trip_and_shared_key() -> None:
    claim = EpochClaim(emitter_id="e-1", epoch=7, claimed_at=123)
    key, value = encode(claim)
    assert key == b"epoch_claim"  # one key: compaction keeps the newest claim
    assert decode(key, value) == claim
    assert _rejected(b"epoch_claim", value.replace(b'"epoch":7', b'"epoch":-7')).startswith(
        "epoch:"
    )


def test_tombstone_is_its_own_kind_of_skip() -> None:
    with pytest.raises(Tombstone):
        decode(KEY, None)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("partition", 2**31),  # beyond int32: no Kafka partition
        ("offset", 2**63),  # beyond int64: no JVM consumer parses it
        ("seq", 2**63),
        ("epoch", 2**63 - 1),  # no room for the next epoch
        ("emitted_at", 10**23),  # beyond what a timestamp holds
        ("emitted_at", -1),
        ("watermark_hint", 2**63),
        ("watermark_hint", -(2**63)),
    ],
)
def test_rejects_numbers_beyond_what_consumers_and_timestamps_hold(field: str, value: int) -> None:
    assert _rejected(KEY, _value(**{field: value})).startswith(field)


def test_accepts_the_largest_values_that_fit() -> None:
    marker = _decode_marker(
        KEY,
        _value(
            offset=2**63 - 1,
            seq=2**63 - 1,
            epoch=2**63 - 2,
            emitted_at=MAX_TIMESTAMP_MS,
            watermark_hint=MIN_TIMESTAMP_MS,
        ),
    )
    assert (marker.offset, marker.epoch) == (2**63 - 1, 2**63 - 2)


def test_epoch_claim_numbers_are_bounded_too() -> None:
    value = b'{"kind": "epoch_claim", "emitter_id": "x", "epoch": %d, "claimed_at": 1}' % (10**23)
    with pytest.raises(MalformedControlRecord, match="epoch"):
        decode(b"epoch_claim", value)


@pytest.mark.parametrize(
    "value",
    [
        b'{"v": ' + b"1" * 5000 + b"}",  # more digits than Python parses (4,300)
        b"[" * 100_000 + b"]" * 100_000,  # deeper than Python's recursion limit
        b'{"a":' * 50_000,
    ],
)
def test_json_python_cannot_parse_is_malformed_never_another_error(value: bytes) -> None:
    with pytest.raises(MalformedControlRecord, match="value is not JSON"):
        decode(KEY, value)


@given(json_shaped_bytes(b'"v"', b'"status"', b'"kind"', b'"IDLE"', b"true"))
def test_json_shaped_bytes_never_raise_anything_but_malformed(value: bytes) -> None:
    with contextlib.suppress(MalformedControlRecord):
        decode(KEY, value)


# ------------------------------------------------- the protocol's order (issue 42)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_protocols_order_does_not_depend_on_the_read_order(data: st.DataObject) -> None:
    written = data.draw(written_histories())
    read = data.draw(interleavings(written))
    assert in_protocol_order(read) == in_protocol_order(written)
    # Per data partition, (epoch, seq) order: what one log of all writes would hold.
    for partition in range(3):
        ordered = [m for m in in_protocol_order(read) if m.partition == partition]
        assert ordered == [m for _, m in written if m.partition == partition]


def _aligned(markers: list[Marker]) -> tuple[dict[int, MarkerStatus], int, str]:
    """A consumer's partition statuses and valve output after the markers, every offset
    read (no data: each marker applies as the read position passed it)."""
    aligner = MarkerAligner("t", 0, partitions=range(3))
    for marker in markers:
        aligner.offer(marker)
    aligner.advance({p: PartitionBatch(read_position=10_000) for p in range(3)})
    statuses = {p: aligner.status_of(p) for p in range(3)}
    return statuses, aligner.valve.watermark, aligner.valve.status.value


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_consumer_holds_the_same_statuses_whatever_the_read_order(
    data: st.DataObject,
) -> None:
    """The source's control reader offers one read's markers in the protocol's order
    (spark_consumer/source/driver/control_reader.py)."""
    written = data.draw(written_histories())
    read = data.draw(interleavings(written))
    assert _aligned(in_protocol_order(read)) == _aligned([m for _, m in written])


def test_one_partitions_log_order_is_the_order() -> None:
    """A fenced emitter's late marker stays after the newer one (the epoch rule rejects
    it), as every reader of one log has always taken it."""
    newer = Marker.model_validate({**VALID, "epoch": 3, "seq": 8, "status": MarkerStatus.IDLE})
    late = Marker.model_validate({**VALID, "epoch": 2, "seq": 8, "status": MarkerStatus.FINISHED})
    assert in_protocol_order([(0, newer), (0, late)]) == [newer, late]


def test_several_partitions_merge_by_epoch_and_seq() -> None:
    """An old deployment's hashed key put a newer marker in partition 3, written before
    partition 0 got the older one: read in either order, the older comes first."""
    older = Marker.model_validate({**VALID, "epoch": 2, "seq": 7, "status": MarkerStatus.IDLE})
    newer = Marker.model_validate({**VALID, "epoch": 2, "seq": 8, "status": MarkerStatus.ACTIVE})
    claim = EpochClaim(emitter_id="e", epoch=2, claimed_at=0)
    request = FinishRequest(topic="orders", partition=3, requested_at=0, requested_by="ops")
    expected = [claim, request, older, newer]  # claims, requests, markers: each stream
    one_way: list[tuple[int, ControlRecord]] = [(3, newer), (0, claim), (1, request), (0, older)]
    another: list[tuple[int, ControlRecord]] = [(0, older), (1, request), (3, newer), (0, claim)]
    assert in_protocol_order(one_way) == in_protocol_order(another) == expected
