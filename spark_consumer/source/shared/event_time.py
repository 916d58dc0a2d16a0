"""A record's event time in epoch milliseconds, or the reason it cannot be read.

The Kafka record timestamp by default; with a field name, that field of the record's
JSON value: a number (epoch milliseconds; a fraction, as ``time.time() * 1000`` writes
it, is cut to the millisecond below) or an ISO 8601 string (a naive one is UTC).
Pure and cheap: the source's readers call it once per record. Any bytes at all give a
time or :class:`UnreadableEventTime`, never another exception (a poison record must
not fail a task).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

# What a Spark timestamp (microseconds in a signed 64-bit integer) can hold, in ms.
MAX_EVENT_TIME_MS = (2**63 - 1) // 1000
MIN_EVENT_TIME_MS = -(2**63 // 1000)  # not -(2**63) // 1000: that one times 1000 overflows
# Apache Kafka's log.message.timestamp.after.max.ms default (4.x): how far a record's
# timestamp may be ahead of the broker's clock. The source's maxEventTimeAhead default.
MAX_EVENT_TIME_AHEAD_MS = 3_600_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The first byte (after JSON's whitespace) of a JSON object as the standard parser
# reads bytes: "{" in UTF-8, a UTF-8 or UTF-16 byte order mark, or a UTF-16 or UTF-32
# zero byte. Any other first byte cannot begin an object, so it has no field.
_MAYBE_AN_OBJECT = (b"{", b"\xef", b"\xfe", b"\xff", b"\x00")
_MILLISECOND = timedelta(milliseconds=1)


class UnreadableEventTime(ValueError):
    """The record has no event time this source can use; the message says why."""


def from_timestamp(timestamp_type: int, timestamp_ms: int) -> int:
    """The Kafka timestamp (librdkafka: type 0 means the record has none)."""
    if timestamp_type == 0 or timestamp_ms < 0:
        raise UnreadableEventTime("record has no timestamp")
    if timestamp_ms > MAX_EVENT_TIME_MS:
        raise UnreadableEventTime(f"timestamp is out of range: {timestamp_ms}")
    return timestamp_ms


def from_json_field(value: bytes | None, field: str) -> int:
    """The field's time. orjson parses first (a few times faster than the standard
    library's parser, and the readers call this once per record); whatever it refuses,
    and every value it does not find a time in, is read again by the standard parser,
    whose reading is the rule and whose errors name the reason. One exception: nesting
    is limited by orjson's fixed 1,024 levels, no longer by the standard parser's
    recursion, which stopped at 930 to 990 levels with the caller's stack (docs/
    decisions.md, "The reader's columns")."""
    if value is None:
        raise UnreadableEventTime("null value")
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return _time_in(_parsed(value), field)
    try:
        return _time_in(document, field)
    except UnreadableEventTime:
        return _time_in(_parsed(value), field)


def json_field_time(value: bytes | None, field: str) -> int | None:
    """``from_json_field``'s time, or None where it raises, without its reason: where
    orjson reads the document, the standard parser reads the same values (an integer
    past 64 bits aside, which no time holds either way), so only what orjson refuses is
    read again. The readers' per-record call."""
    if value is None:
        return None
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        if value.lstrip(b" \t\n\r")[:1] not in _MAYBE_AN_OBJECT:
            return None  # the standard parser reads no object there either: no field
        try:
            document = _parsed(value)
        except UnreadableEventTime:
            return None
    try:
        return _time_in(document, field)
    except UnreadableEventTime:
        return None


def _parsed(value: bytes) -> Any:
    try:
        return json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UnreadableEventTime("value is not JSON") from None
    except ValueError:  # an integer of more digits than Python parses (4,300)
        raise UnreadableEventTime("value is not JSON: a number too long to parse") from None
    except RecursionError:
        raise UnreadableEventTime("value is not JSON: nested too deeply") from None


def _time_in(document: Any, field: str) -> int:
    if not isinstance(document, dict) or field not in document:
        raise UnreadableEventTime(f"no field {field!r}")
    raw = document[field]
    if isinstance(raw, bool):
        raise UnreadableEventTime(f"field {field!r} is a boolean")
    if isinstance(raw, int):
        event_ms = raw
    elif isinstance(raw, float):
        if not math.isfinite(raw):
            raise UnreadableEventTime(f"field {field!r} is not a finite number: {raw}")
        if not MIN_EVENT_TIME_MS <= raw <= MAX_EVENT_TIME_MS:
            raise UnreadableEventTime(f"field {field!r} is out of range: {raw}")
        event_ms = math.floor(raw)
    elif isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw)
        except (ValueError, OverflowError):
            raise UnreadableEventTime(f"field {field!r} is not ISO 8601: {raw[:40]!r}") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        event_ms = (parsed - _EPOCH) // _MILLISECOND
    else:
        raise UnreadableEventTime(f"field {field!r} is {type(raw).__name__}, not a time")
    if not MIN_EVENT_TIME_MS <= event_ms <= MAX_EVENT_TIME_MS:
        raise UnreadableEventTime(f"field {field!r} is out of range: {event_ms}")
    return event_ms
