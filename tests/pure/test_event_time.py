"""A record's event time: any bytes give a time or UnreadableEventTime, never another
error (a poison record must not fail a task; issue 21)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_consumer.source.shared.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
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
