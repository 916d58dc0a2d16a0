"""Rows from records (spark_consumer/source/executor/arrow_rows.py), without a broker:
confluent-kafka's own ``Message`` objects, drawn, against a model of each row written
from the rules (docs/source.md, "Columns"; event_time.py's docstring), one record at a
time. The builder works on runs as arrays; the model never does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_consumer.source.executor.arrow_rows import RowBuilder, runs
from spark_consumer.source.executor.reader_ranges import Reading
from spark_consumer.source.shared.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
)
from spark_consumer.source.shared.late_rows import LateRule
from spark_consumer.source.shared.options import ARROW_SCHEMA

BASE_MS = 1_700_000_000_000

# Kafka timestamps as they come: none (type 0), create or log append time, at the edges
# of what a Spark timestamp holds, and before 1970.
_STAMPS = st.tuples(
    st.sampled_from([0, 1, 2]),
    st.one_of(
        st.integers(BASE_MS - 60_000, BASE_MS + 60_000),
        st.sampled_from([-1, 0, MAX_EVENT_TIME_MS, MAX_EVENT_TIME_MS + 1, 2**63 - 1]),
        st.sampled_from([MIN_EVENT_TIME_MS, MIN_EVENT_TIME_MS - 1, -(2**63)]),
    ),
)
_VALUES = st.one_of(
    st.none(),
    st.builds(lambda ms: b'{"ts": %d}' % ms, st.integers(BASE_MS - 60_000, BASE_MS + 60_000)),
    st.sampled_from([b"not json", b'{"ts": "2023-11-14T22:13:20Z"}', b'{"ts": 1e400}', b"[]"]),
)
_HEADERS = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2),
)


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    stamp: tuple[int, int]
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, str | bytes | None]] | None

    def message(self) -> Any:
        return Message(
            topic=self.topic,
            partition=self.partition,
            offset=self.offset,
            key=self.key,
            value=self.value,
            timestamp=self.stamp,
            headers=self.headers,
        )


@st.composite
def record_runs(draw: Any) -> list[list[Record]]:
    """Runs of one partition's records each, offsets rising with gaps now and then (as
    compaction and transaction markers leave), as consume calls hand them over."""
    next_offset: dict[tuple[str, int], int] = {}
    result = []
    for _ in range(draw(st.integers(1, 5))):
        topic, partition = draw(st.sampled_from(["a", "b"])), draw(st.integers(0, 2))
        run = []
        for _ in range(draw(st.integers(1, 12))):
            offset = next_offset.get((topic, partition), 0) + draw(st.sampled_from([0, 0, 0, 2]))
            next_offset[(topic, partition)] = offset + 1
            stamp, value = draw(_STAMPS), draw(_VALUES)
            key, headers = draw(st.none() | st.binary(max_size=4)), draw(_HEADERS)
            run.append(Record(topic, partition, offset, stamp, value, key, headers))
        result.append(run)
    return result


def _model_event_ms(record: Record, field: str | None, latest_ms: int | None) -> int | None:
    """The record's event time by the rules: its Kafka timestamp (none when its type is 0,
    or before 1970) or its JSON field; none past maxEventTimeAhead's latest."""
    if field is None:
        kind, ms = record.stamp
        event_ms = ms if kind != 0 and 0 <= ms <= MAX_EVENT_TIME_MS else None
    else:
        try:
            event_ms = from_json_field(record.value, field)
        except UnreadableEventTime:
            event_ms = None
    if event_ms is not None and latest_ms is not None and event_ms > latest_ms:
        return None
    return event_ms


def _model_row(
    record: Record, field: str | None, latest: int | None, threshold: int
) -> dict[str, Any]:
    kind, ms = record.stamp
    event_ms = _model_event_ms(record, field, latest)
    return {
        "key": record.key,
        "value": record.value,
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        # Spark's timestamp: microseconds in an int64, or null (none, or out of range).
        "timestamp": ms * 1000
        if kind != 0 and MIN_EVENT_TIME_MS <= ms <= MAX_EVENT_TIME_MS
        else None,
        # librdkafka 1 create time, 2 log append time; Spark 0 and 1 (0 when none).
        "timestampType": kind - 1 if kind else 0,
        "headers": [{"key": k, "value": v} for k, v in record.headers] if record.headers else None,
        "event_time": None if event_ms is None else event_ms * 1000,
        # No event time is late: it cannot be placed in event time.
        "late": event_ms is None or event_ms < threshold,
    }


def _rows(batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    rows: list[dict[str, Any]] = table.cast(_as_integers(ARROW_SCHEMA)).to_pylist()
    return rows


def _as_integers(schema: pa.Schema) -> pa.Schema:
    """Timestamps read back as their microseconds, to compare with the model exactly."""
    return pa.schema(
        [pa.field(f.name, pa.int64()) if pa.types.is_timestamp(f.type) else f for f in schema]
    )


def _build(
    drawn: list[list[Record]],
    *,
    field: str | None,
    threshold: int,
    latest: int | None,
    rule: LateRule | None,
    flush_every: int,
) -> tuple[RowBuilder, list[pa.RecordBatch]]:
    builder = RowBuilder(field, threshold, rule, latest)
    batches = []
    for run in drawn:
        reading = Reading(run[0].topic, run[0].partition, 0, 10**9)
        builder.add_many([record.message() for record in run], reading)
        if len(builder) >= flush_every:
            batches.append(builder.flush())
    if len(builder):
        batches.append(builder.flush())
    return builder, batches


Drawn = tuple[str | None, int, int | None, LateRule | None, int]
_SETTINGS = st.tuples(
    st.sampled_from([None, "ts"]),
    st.integers(BASE_MS - 30_000, BASE_MS + 30_000),
    st.sampled_from([None, BASE_MS, BASE_MS + 30_000]),
    st.sampled_from([None, LateRule("late"), LateRule("window", 10_000, 10_000)]),
    st.integers(1, 40),
)


@settings(max_examples=80, deadline=None)
@given(record_runs(), _SETTINGS)
def test_every_record_is_the_row_the_rules_give(drawn: list[list[Record]], given: Drawn) -> None:
    field, threshold, latest, rule, flush_every = given
    _, batches = _build(
        drawn, field=field, threshold=threshold, latest=latest, rule=rule, flush_every=flush_every
    )
    expected = [_model_row(r, field, latest, threshold) for run in drawn for r in run]
    assert _rows(batches) == expected
    assert all(batch.schema == ARROW_SCHEMA for batch in batches)


@settings(max_examples=80, deadline=None)
@given(record_runs(), _SETTINGS)
def test_each_ranges_progress_counts_its_records_as_the_rules_do(
    drawn: list[list[Record]], given: Drawn
) -> None:
    field, threshold, latest, rule, flush_every = given
    builder, _ = _build(
        drawn, field=field, threshold=threshold, latest=latest, rule=rule, flush_every=flush_every
    )
    for topic, partition in {(r[0].topic, r[0].partition) for r in drawn}:
        records = [r for run in drawn for r in run if (r.topic, r.partition) == (topic, partition)]
        times = [_model_event_ms(r, field, latest) for r in records]
        readable = [ms for ms in times if ms is not None]
        seen = builder.seen(Reading(topic, partition, 0, 10**9))
        assert seen.records == len(records)
        assert seen.unreadable == len(times) - len(readable)
        assert seen.late == len([ms for ms in readable if ms < threshold])
        assert seen.max_event_ms == (max(readable) if readable else None)
        assert seen.max_offset == records[-1].offset
        dropped = [
            (r.offset, ms)
            for r, ms in zip(records, times, strict=True)
            if rule is not None and (ms is None or rule.dropped(ms, threshold))
        ]
        assert [(row.offset, row.event_time_ms) for row in seen.dropped] == dropped


def test_an_empty_flush_is_an_empty_batch_of_the_schema() -> None:
    batch = RowBuilder(None, BASE_MS).flush()
    assert batch.num_rows == 0
    assert batch.schema == ARROW_SCHEMA


def test_an_empty_run_adds_nothing_and_counts_in_no_range() -> None:
    builder = RowBuilder(None, BASE_MS)
    builder.add_many([], Reading("a", 0, 0, 10))
    record = Record("a", 1, 8, (1, BASE_MS), b"v", None, None)
    builder.add_many([record.message()], Reading("a", 1, 0, 10))
    assert builder.flush().num_rows == 1
    assert builder.seen(Reading("a", 0, 0, 10)).max_offset == -1
    assert builder.seen(Reading("a", 0, 0, 10)).records == 0
    assert builder.seen(Reading("a", 1, 0, 10)).max_offset == 8


@given(record_runs())
def test_a_consume_calls_messages_fall_into_runs_of_one_partition_in_order(
    drawn: list[list[Record]],
) -> None:
    messages = [record.message() for run in drawn for record in run]
    found = [(key, [m.offset() for m in run]) for key, run, error in runs(messages)]
    assert all(error is None for _, _, error in runs(messages))
    # The model: consecutive records of one (topic, partition) make one run.
    expected: list[tuple[tuple[str, int], list[int]]] = []
    for message in messages:
        key = (message.topic(), message.partition())
        if expected and expected[-1][0] == key:
            expected[-1][1].append(message.offset())
        else:
            expected.append((key, [message.offset()]))
    assert found == expected


def _error(partition: int, code: int) -> Any:
    return Message(
        topic="a", partition=partition, offset=0, timestamp=(0, -1), error=KafkaError(code)
    )


def test_an_error_among_messages_comes_alone_and_the_end_of_a_partition_not_at_all() -> None:
    ok = Message(topic="a", partition=0, offset=5, value=b"v", timestamp=(1, BASE_MS))
    failed = _error(1, KafkaError.OFFSET_OUT_OF_RANGE)
    ended = _error(2, KafkaError._PARTITION_EOF)
    found = [
        (key, [m.offset() for m in run], error) for key, run, error in runs([ok, failed, ended])
    ]
    assert found[0] == (("a", 0), [5], None)
    assert found[1][:2] == (("a", 1), [])
    assert found[1][2].code() == KafkaError.OFFSET_OUT_OF_RANGE
    assert len(found) == 2
