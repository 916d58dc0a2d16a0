"""A reader task's rows as Arrow batches, built a run of one range's records at a time,
with each range's running progress (records, newest event time, late and unreadable
counts, the rows the job will drop); and the batch's synthetic row."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError

from slackwater.markers import TopicPartitionKey
from spark_consumer.source.executor.reader_ranges import Reading
from spark_consumer.source.shared.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
)
from spark_consumer.source.shared.late_rows import DroppedRow, LateRule
from spark_consumer.source.shared.options import ARROW_SCHEMA, EVENT_TIME, LATE
from spark_consumer.source.wire.progress import Progress

_partition_of = operator.methodcaller("partition")
_topic_of = operator.methodcaller("topic")


def runs(messages: list[Any]) -> Iterator[tuple[TopicPartitionKey, list[Any], Any]]:
    """A consume call's messages by partition: each run of one partition's records (in
    offset order) with no error, or one error message with its partition.

    Errors are rare: one check over the call, and the slow path only when one is there.
    """
    if not messages:
        return
    if any(message.error() is not None for message in messages):
        for message in messages:
            error = message.error()
            if error is None:
                yield (message.topic(), message.partition()), [message], None
            elif error.code() != KafkaError._PARTITION_EOF:
                yield (message.topic(), message.partition()), [], error
        return
    first = messages[0]
    # The common case, one partition in the whole call: told in C (no Python per record).
    if len(set(map(_partition_of, messages))) == 1 and len(set(map(_topic_of, messages))) == 1:
        yield (first.topic(), first.partition()), messages, None
        return
    keys = [(m.topic(), m.partition()) for m in messages]
    start = 0
    for index in range(1, len(keys) + 1):
        if index == len(keys) or keys[index] != keys[start]:
            yield keys[start], messages[start:index], None
            start = index


@dataclass
class Seen:
    """What a reader saw in one range: its progress, and the rows the job will drop."""

    records: int = 0
    late: int = 0
    unreadable: int = 0
    max_event_ms: int | None = None
    max_offset: int = -1
    dropped: list[DroppedRow] = field(default_factory=list)

    def progress(self, lost: int) -> Progress:
        return Progress(
            records=self.records,
            max_event_time_ms=self.max_event_ms,
            max_offset=self.max_offset,
            late=self.late,
            unreadable=self.unreadable,
            dropped=len(self.dropped),
            lost=lost,
        )


class RowBuilder:
    """Column lists for Arrow batches, filled a run of one range at a time, and each
    range's running progress. Column-wise on purpose: one comprehension per column costs
    a fraction of one Python call per record (docs/performance.md)."""

    def __init__(
        self,
        event_time_field: str | None,
        threshold_ms: int,
        late_rule: LateRule | None = None,
        latest_event_ms: int | None = None,
    ) -> None:
        # Event times past this are unreadable (the option maxEventTimeAhead), if set.
        self.latest_event_ms = latest_event_ms
        self.event_time_field = event_time_field
        # The watermark Spark judges the task's rows late by (late_events_watermark).
        self.threshold_ms = threshold_ms
        self.late_rule = late_rule
        self._seen: dict[TopicPartitionKey, Seen] = {}
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.event_times: list[int | None] = []
        self.lates: list[bool] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def seen(self, split: Reading) -> Seen:
        return self._seen.setdefault((split.topic, split.partition), Seen())

    def add_many(self, messages: list[Any], split: Reading) -> None:
        """Records of one range, in offset order."""
        seen = self.seen(split)
        values = [m.value() for m in messages]
        stamps = [m.timestamp() for m in messages]
        offsets = [m.offset() for m in messages]
        self.keys += [m.key() for m in messages]
        self.values += values
        self.topics += [split.topic] * len(messages)
        self.partitions += [split.partition] * len(messages)
        self.offsets += offsets
        # librdkafka: 0 none, 1 create time, 2 log append time; Spark: 0 create, 1 append.
        # A timestamp no Spark timestamp holds (microseconds in an int64) is null.
        self.timestamps += [
            ms * 1000 if kind and MIN_EVENT_TIME_MS <= ms <= MAX_EVENT_TIME_MS else None
            for kind, ms in stamps
        ]
        self.timestamp_types += [kind - 1 if kind else 0 for kind, _ in stamps]
        self.headers += [
            [{"key": k, "value": v} for k, v in raw] if raw else None
            for raw in (m.headers() for m in messages)
        ]
        event_ms = self._event_times(values, stamps)
        threshold = self.threshold_ms
        # No event time: the row is late (it cannot be placed in event time), counted.
        lates = [ms is None or ms < threshold for ms in event_ms]
        readable = [ms for ms in event_ms if ms is not None]
        unreadable = len(event_ms) - len(readable)
        seen.records += len(messages)
        seen.unreadable += unreadable
        seen.late += sum(lates) - unreadable
        if readable:
            newest = max(readable)
            if seen.max_event_ms is None or newest > seen.max_event_ms:
                seen.max_event_ms = newest
        seen.max_offset = offsets[-1]
        self.event_times += [None if ms is None else ms * 1000 for ms in event_ms]
        self.lates += lates
        if self.late_rule is not None and any(lates):
            self._note_dropped(seen, values, stamps, offsets, event_ms)

    def _note_dropped(
        self,
        seen: Seen,
        values: list[bytes | None],
        stamps: list[tuple[int, int]],
        offsets: list[int],
        event_ms: list[int | None],
    ) -> None:
        """The rows the job's aggregation will drop, with why (late_rows.py). Only
        late rows can be dropped, so only runs that have one come here."""
        assert self.late_rule is not None
        threshold = self.threshold_ms
        for index, ms in enumerate(event_ms):
            if ms is None:
                reason = "unreadable: " + self._why_unreadable(values[index], stamps[index])
            elif self.late_rule.dropped(ms, threshold):
                reason = "late"
            else:
                continue
            seen.dropped.append(DroppedRow(offsets[index], ms, reason))

    def _why_unreadable(self, value: bytes | None, stamp: tuple[int, int]) -> str:
        try:
            if self.event_time_field is None:
                event_ms = from_timestamp(*stamp)
            else:
                event_ms = from_json_field(value, self.event_time_field)
        except UnreadableEventTime as error:
            return str(error)
        if self.latest_event_ms is not None and event_ms > self.latest_event_ms:
            return (
                f"event time {event_ms} ms is more than maxEventTimeAhead past the batch's "
                f"clock (latest allowed {self.latest_event_ms} ms)"
            )
        return "no event time"

    def _event_times(
        self, values: list[bytes | None], stamps: list[tuple[int, int]]
    ) -> list[int | None]:
        # Past the latest allowed event time (maxEventTimeAhead): unreadable, so that one
        # far-future record moves neither the valve's watermark nor Spark's.
        latest = MAX_EVENT_TIME_MS if self.latest_event_ms is None else self.latest_event_ms
        latest = min(latest, MAX_EVENT_TIME_MS)
        if self.event_time_field is None:
            return [ms if kind and 0 <= ms <= latest else None for kind, ms in stamps]
        field_name = self.event_time_field
        result: list[int | None] = []
        for value in values:
            try:
                event_ms = from_json_field(value, field_name)
            except UnreadableEventTime:
                result.append(None)
                continue
            result.append(event_ms if event_ms <= latest else None)
        return result

    def flush(self) -> pa.RecordBatch:
        columns = (
            self.keys,
            self.values,
            self.topics,
            self.partitions,
            self.offsets,
            self.timestamps,
            self.timestamp_types,
            self.headers,
            self.event_times,
            self.lates,
        )  # in the schema's order, each typed by it
        batch = pa.RecordBatch.from_arrays(
            [pa.array(values, f.type) for values, f in zip(columns, ARROW_SCHEMA, strict=True)],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch


def synthetic_batch(planned_watermark_ms: int, watermark_delay_ms: int) -> pa.RecordBatch:
    row: dict[str, Any] = {name: None for name in ARROW_SCHEMA.names}
    row[EVENT_TIME] = (planned_watermark_ms + watermark_delay_ms) * 1000
    row[LATE] = False
    return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
