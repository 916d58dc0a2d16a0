"""A reader task's rows as Arrow batches, gathered a run of one range's records at a
time, and each range's progress (records, newest event time, late and unreadable counts,
the rows the job will drop), counted as each batch is made; and the batch's synthetic
row."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, Message

from slackwater.markers import TopicPartitionKey
from spark_consumer.source.executor.reader_ranges import Reading
from spark_consumer.source.shared.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
    json_field_time,
)
from spark_consumer.source.shared.late_rows import DroppedRow, LateRule
from spark_consumer.source.shared.options import ARROW_SCHEMA, EVENT_TIME, LATE
from spark_consumer.source.wire.progress import Progress

# An int64 no event time takes (they start at MIN_EVENT_TIME_MS): "none" in an array.
_NO_TIME = -(2**63)
assert _NO_TIME < MIN_EVENT_TIME_MS

_Field = Callable[[Any], Any]
# Message's methods themselves, mapped over a run in C: 25-75 ns a record each, where
# operator.methodcaller looks the method up by name every call (95 ns and more).
_partition_of: _Field = Message.partition
_topic_of: _Field = Message.topic
_error_of: _Field = Message.error
_key_of: _Field = Message.key
_value_of: _Field = Message.value
_offset_of: _Field = Message.offset
_timestamp_of: _Field = Message.timestamp
_headers_of: _Field = Message.headers


def runs(messages: list[Any]) -> Iterator[tuple[TopicPartitionKey, list[Any], Any]]:
    """A consume call's messages by partition: each run of one partition's records (in
    offset order) with no error, or one error message with its partition.

    Errors are rare: one check over the call, and the slow path only when one is there.
    Each record's partition and topic are taken in C (``map``), and the runs' bounds
    found over them as arrays: no Python per record.
    """
    if not messages:
        return
    errors = list(map(_error_of, messages))
    # Not errors.count(None): a KafkaError compared with None raises.
    if any(map(operator.is_not, errors, itertools.repeat(None))):
        for message, error in zip(messages, errors, strict=True):
            if error is None:
                yield (message.topic(), message.partition()), [message], None
            elif error.code() != KafkaError._PARTITION_EOF:
                yield (message.topic(), message.partition()), [], error
        return
    count = len(messages)
    partitions = np.fromiter(map(_partition_of, messages), np.int64, count)
    topics = list(map(_topic_of, messages))
    # A run ends where the partition changes, or (a call over several topics) the topic.
    starts = np.flatnonzero(partitions[1:] != partitions[:-1]) + 1
    if topics.count(topics[0]) != count:
        named = np.array(topics, dtype=object)
        starts = np.union1d(starts, np.flatnonzero(named[1:] != named[:-1]) + 1)
    bounds = [0, *starts.tolist(), count]
    for start, end in itertools.pairwise(bounds):
        yield (topics[start], int(partitions[start])), messages[start:end], None


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


@dataclass(frozen=True)
class _Judged:
    """A batch's numbers as arrays, row by row: what its records say and how they are
    judged."""

    offsets: np.ndarray
    kinds: np.ndarray  # librdkafka's timestamp type: 0 none, 1 create time, 2 log append
    stamp_ms: np.ndarray
    event_ms: np.ndarray
    readable: np.ndarray  # the row has an event time: event_ms holds it
    lates: np.ndarray


class RowBuilder:
    """Columns for Arrow batches, filled a run of one range at a time, and each range's
    progress. Column-wise on purpose: a run's fields are taken in C (``map`` over its
    messages, each column's list extended), and the numbers of a whole batch judged as
    arrays when it is made (``_settle``): no Python per record unless the event time is
    in JSON, and no fixed cost per run beyond a few list extends, so many short runs
    (a record per partition) cost what one long one does (docs/decisions.md, "The
    reader's columns")."""

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
        self._topic_names: dict[str, int] = {}
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self._topics: list[int] = []  # indices into _topic_names
        self._partitions: list[int] = []
        self._offsets: list[int] = []
        # librdkafka's (type, ms) of each record, flat: type 0 none, 1 create, 2 append.
        self._stamps: list[int] = []
        # Each run's range and length, in order: whose progress its rows count in.
        self._runs: list[tuple[Seen, int]] = []

    def __len__(self) -> int:
        return len(self.values)

    def seen(self, split: Reading) -> Seen:
        """The range's progress over the rows flushed (a task flushes all before it
        reports its progress)."""
        assert not self._runs, "rows added and not flushed are not counted yet"
        return self._seen_by_key((split.topic, split.partition))

    def _seen_by_key(self, key: TopicPartitionKey) -> Seen:
        return self._seen.setdefault(key, Seen())

    def add_many(self, messages: list[Any], split: Reading) -> None:
        """Records of one range, in offset order."""
        count = len(messages)
        if not count:
            return  # a run is never empty: the sums over runs' slices count on it
        values = list(map(_value_of, messages))
        keys = list(map(_key_of, messages))
        offsets = list(map(_offset_of, messages))
        stamps = list(itertools.chain.from_iterable(map(_timestamp_of, messages)))
        headers = list(map(_headers_of, messages))
        if headers.count(None) != count:
            headers = [[{"key": k, "value": v} for k, v in raw] if raw else None for raw in headers]
        # Every field taken: now the columns grow together.
        self.values += values
        self.keys += keys
        self.headers += headers
        self._offsets += offsets
        self._stamps += stamps
        self._topics += [self._topic_names.setdefault(split.topic, len(self._topic_names))] * count
        self._partitions += [split.partition] * count
        self._runs.append((self._seen_by_key((split.topic, split.partition)), count))

    def flush(self) -> pa.RecordBatch:
        """The rows added since the last flush as one batch; their progress counted."""
        if not self._runs:
            return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        stamps = np.array(self._stamps, np.int64)
        kinds, stamp_ms = stamps[0::2], stamps[1::2]
        event_ms, readable = self._event_times(self.values, kinds, stamp_ms)
        # No event time: the row is late (it cannot be placed in event time), counted.
        lates = ~readable | (event_ms < self.threshold_ms)
        offsets = np.array(self._offsets, np.int64)
        judged = _Judged(offsets, kinds, stamp_ms, event_ms, readable, lates)
        self._count(judged)
        if self.late_rule is not None and lates.any():
            self._note_dropped(judged)
        # librdkafka: 0 none, 1 create time, 2 log append time; Spark: 0 create, 1 append.
        # A timestamp no Spark timestamp holds (microseconds in an int64) is null.
        stamped = (kinds != 0) & (stamp_ms >= MIN_EVENT_TIME_MS) & (stamp_ms <= MAX_EVENT_TIME_MS)
        topics = pa.DictionaryArray.from_arrays(
            np.array(self._topics, np.int32), pa.array(list(self._topic_names), pa.string())
        )
        columns = (
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            topics.cast(pa.string()),
            np.array(self._partitions, np.int32),
            offsets,
            _microseconds(stamp_ms, stamped),
            np.where(kinds != 0, kinds - 1, 0).astype(np.int32),
            pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
            _microseconds(event_ms, readable),
            lates,
        )  # in the schema's order, each typed by it
        batch = pa.RecordBatch.from_arrays(
            [pa.array(column, f.type) for column, f in zip(columns, ARROW_SCHEMA, strict=True)],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch

    def _count(self, judged: _Judged) -> None:
        """Each run's rows into its range's progress: sums over the runs' slices."""
        offsets, event_ms, readable = judged.offsets, judged.event_ms, judged.readable
        lengths = np.array([count for _, count in self._runs], np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        readable_counts = np.add.reduceat(readable, starts, dtype=np.int64).tolist()
        late_counts = np.add.reduceat(judged.lates, starts, dtype=np.int64).tolist()
        newest = np.maximum.reduceat(np.where(readable, event_ms, _NO_TIME), starts).tolist()
        last_offsets = offsets[starts + lengths - 1].tolist()
        for (seen, count), read, late, max_ms, last in zip(
            self._runs, readable_counts, late_counts, newest, last_offsets, strict=True
        ):
            seen.records += count
            seen.unreadable += count - read
            seen.late += late - (count - read)
            if read and (seen.max_event_ms is None or max_ms > seen.max_event_ms):
                seen.max_event_ms = max_ms
            seen.max_offset = last

    def _note_dropped(self, judged: _Judged) -> None:
        """The rows the job's aggregation will drop, with why (late_rows.py), into their
        ranges' progress. Only late rows can be dropped, so only they are looked at."""
        assert self.late_rule is not None
        threshold = self.threshold_ms
        ends = np.cumsum([count for _, count in self._runs])
        late_rows = np.flatnonzero(judged.lates)
        runs_of = np.searchsorted(ends, late_rows, side="right").tolist()
        for index, run in zip(late_rows.tolist(), runs_of, strict=True):
            seen, offset = self._runs[run][0], int(judged.offsets[index])
            if not judged.readable[index]:
                stamp = (int(judged.kinds[index]), int(judged.stamp_ms[index]))
                reason = "unreadable: " + self._why_unreadable(self.values[index], stamp)
                seen.dropped.append(DroppedRow(offset, None, reason))
            elif self.late_rule.dropped(ms := int(judged.event_ms[index]), threshold):
                seen.dropped.append(DroppedRow(offset, ms, "late"))

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
        self, values: list[bytes | None], kinds: np.ndarray, stamp_ms: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each record's event time in ms, and whether it has one."""
        # Past the latest allowed event time (maxEventTimeAhead): unreadable, so that one
        # far-future record moves neither the valve's watermark nor Spark's.
        latest = MAX_EVENT_TIME_MS if self.latest_event_ms is None else self.latest_event_ms
        latest = min(latest, MAX_EVENT_TIME_MS)
        if self.event_time_field is None:
            return stamp_ms, (kinds != 0) & (stamp_ms >= 0) & (stamp_ms <= latest)
        event_ms = np.fromiter(map(self._json_event_ms, values), np.int64, len(values))
        return event_ms, (event_ms != _NO_TIME) & (event_ms <= latest)

    def _json_event_ms(self, value: bytes | None) -> int:
        assert self.event_time_field is not None
        event_ms = json_field_time(value, self.event_time_field)
        return _NO_TIME if event_ms is None else event_ms


def _microseconds(ms: np.ndarray, known: np.ndarray) -> pa.Array:
    """A Spark timestamp column: microseconds where ``known``, null elsewhere (where a
    value may not fit in microseconds at all)."""
    return pa.array(np.where(known, ms, 0) * 1000, pa.timestamp("us", tz="UTC"), mask=~known)


def synthetic_batch(planned_watermark_ms: int, watermark_delay_ms: int) -> pa.RecordBatch:
    row: dict[str, Any] = {name: None for name in ARROW_SCHEMA.names}
    row[EVENT_TIME] = (planned_watermark_ms + watermark_delay_ms) * 1000
    row[LATE] = False
    return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
