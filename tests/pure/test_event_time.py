"""A record's event time: any bytes give a time or UnreadableEventTime, never another
error (a poison record must not fail a task; issue 21)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_consumer.source.shared import event_time
from spark_consumer.source.shared.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
    json_field_time,
)
from tests.harness.factories import json_shaped_bytes


@pytest.mark.parametrize(
    ("value", "event_ms"),
    [
        (b'{"ts": 1700000000000}', 1_700_000_000_000),
        # Epoch milliseconds as time.time() * 1000 writes them: cut to the ms below.
        (b'{"ts": 1.7e12}', 1_700_000_000_000),
        (b'{"ts": 1700000000000.999}', 1_700_000_000_000),
        (b'{"ts": -0.5}', -1),
        (b'{"ts": "2023-11-14T22:13:20Z"}', 1_700_000_000_000),
        (b'{"ts": "2023-11-14T22:13:20.5"}', 1_700_000_000_500),  # naive: UTC
    ],
)
def test_readable_event_times(value: bytes, event_ms: int) -> None:
    assert from_json_field(value, "ts") == event_ms


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "null value"),
        (b"\xff\xfe\x00", "not JSON"),
        (b'{"ts": ' + b"9" * 5000 + b"}", "a number too long to parse"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"ts": NaN}', "not a finite number"),
        (b'{"ts": Infinity}', "not a finite number"),
        (b'{"ts": 1e400}', "not a finite number"),
        (b'{"ts": 1e300}', "out of range"),
        (b'{"ts": 9223372036854775807}', "out of range"),
        (b'{"ts": true}', "boolean"),
        (b'{"ts": "soon"}', "not ISO 8601"),
        (b'{"ts": [1]}', "list, not a time"),
        (b'{"other": 1}', "no field 'ts'"),
        (b"[1, 2]", "no field 'ts'"),
    ],
)
def test_unreadable_event_times_say_why(value: bytes | None, reason: str) -> None:
    with pytest.raises(UnreadableEventTime, match=reason):
        from_json_field(value, "ts")


def test_kafka_timestamps_past_a_spark_timestamp_are_unreadable() -> None:
    assert from_timestamp(1, MAX_EVENT_TIME_MS) == MAX_EVENT_TIME_MS
    with pytest.raises(UnreadableEventTime, match="out of range"):
        from_timestamp(1, MAX_EVENT_TIME_MS + 1)
    with pytest.raises(UnreadableEventTime, match="no timestamp"):
        from_timestamp(0, 5)


@given(
    st.one_of(
        st.binary(max_size=100),
        json_shaped_bytes(
            b'"ts"', b"999", b'"2023-11-14T22:13:20Z"', b"-9223372036854776", b"-9223372036854775.9"
        ),
    )
)
def test_any_bytes_give_a_time_in_range_or_unreadable(value: bytes) -> None:
    try:
        event_ms = from_json_field(value, "ts")
    except UnreadableEventTime:
        return
    assert isinstance(event_ms, int)
    assert MIN_EVENT_TIME_MS <= event_ms <= MAX_EVENT_TIME_MS
    pa.array([event_ms * 1000], pa.timestamp("us", tz="UTC"))  # what the readers build


@pytest.mark.parametrize("event_ms", [MIN_EVENT_TIME_MS, MAX_EVENT_TIME_MS])
def test_the_bounds_are_times_a_spark_timestamp_holds(event_ms: int) -> None:
    value = b'{"ts": %d}' % event_ms
    assert from_json_field(value, "ts") == event_ms
    pa.array([event_ms * 1000], pa.timestamp("us", tz="UTC"))
    with pytest.raises(UnreadableEventTime, match="out of range"):
        from_json_field(b'{"ts": %d}' % (event_ms + (1 if event_ms > 0 else -1)), "ts")


def _standard_reading(value: bytes, field: str) -> int | str:
    """The module's rules read with the standard library's parser alone: the time, or
    the reason it is unreadable."""
    try:
        return event_time._time_in(event_time._parsed(value), field)
    except UnreadableEventTime as error:
        return f"unreadable: {error}"


def _reading(value: bytes, field: str) -> int | str:
    try:
        return from_json_field(value, field)
    except UnreadableEventTime as error:
        return f"unreadable: {error}"


_JSON_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
)


@given(
    st.one_of(
        json_shaped_bytes(b'"ts"', b"999", b'"2023-11-14T22:13:20Z"', b"18446744073709551616"),
        st.builds(
            lambda number, extra: json.dumps({"a": extra, "ts": number}).encode(),
            st.one_of(_JSON_NUMBERS, st.text(max_size=30), st.booleans(), st.none()),
            st.recursive(st.none() | _JSON_NUMBERS, lambda inner: st.lists(inner, max_size=3)),
        ),
    )
)
def test_the_fast_parser_changes_no_time_and_no_reason(value: bytes) -> None:
    """orjson reads first; where it finds no time, the standard parser's reading (and its
    reason) is the answer: for any bytes, the same as the standard parser alone."""
    assert _reading(value, "ts") == _standard_reading(value, "ts")
    # The readers' call: the same time, or None where a reason is given.
    reading = _reading(value, "ts")
    assert json_field_time(value, "ts") == (None if isinstance(reading, str) else reading)


def test_integers_past_64_bits_give_the_standard_parsers_reason() -> None:
    """orjson reads such an integer as a float; the reason still names the integer."""
    value = b'{"ts": 99999999999999999999999}'
    assert _reading(value, "ts") == "unreadable: field 'ts' is out of range: " + "9" * 23


def test_nesting_is_readable_to_a_fixed_depth_whatever_the_callers_stack() -> None:
    """orjson's 1,024 levels, not the standard parser's recursion limit (930 to 990
    levels, with the depth of the caller's stack)."""

    def nested(depth: int) -> bytes:
        return b'{"ts": 1700000000000, "x": ' + b"[" * depth + b"]" * depth + b"}"

    assert from_json_field(nested(1_000), "ts") == 1_700_000_000_000
    assert json_field_time(nested(1_000), "ts") == 1_700_000_000_000
    with pytest.raises(UnreadableEventTime, match="nested too deeply"):
        from_json_field(nested(1_100), "ts")
    assert json_field_time(nested(1_100), "ts") is None


@pytest.mark.parametrize(
    "encoding",
    ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"],
)
def test_json_in_any_encoding_the_standard_parser_reads_is_read(encoding: str) -> None:
    """orjson reads UTF-8 alone; the standard parser reads these too, and decides."""
    value = ' \n{"ts": 1700000000000}'.encode(encoding)
    assert from_json_field(value, "ts") == 1_700_000_000_000
    assert json_field_time(value, "ts") == 1_700_000_000_000
