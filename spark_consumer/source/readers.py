"""The readers, on the executors: a task's ranges as Arrow batches, their late rows
written aside, their progress reported to the progress topic; or the synthetic row."""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from slackwater import kafka_clients
from spark_consumer.source import reader_clients
from spark_consumer.source.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
)
from spark_consumer.source.late_rows import DroppedRow, LateRule, write_range
from spark_consumer.source.options import ARROW_SCHEMA, EVENT_TIME, LATE, SourceError, SourceOptions
from spark_consumer.source.progress import Progress
from spark_consumer.source.progress import report as progress_report
from spark_consumer.source.splits import (
    SyntheticPartition,
    TaskPartition,
    late_events_watermark,
    spark_batch_id,
)

log = logging.getLogger(__name__)
# How long a reader (or the planner, waiting for progress) goes without what it waits for
# before it asks the broker whether those records are gone.
GONE_CHECK_S = 2.0
# Readers read by assignment and commit nothing; librdkafka still finds this group's
# coordinator (docs/deploy.md's ACLs allow Describe on it).
READER_GROUP = "slackwater-reader"
# A range's partition: (topic, partition).
_Key = tuple[str, int]


def read_task(options: SourceOptions, task: TaskPartition) -> Iterator[pa.RecordBatch]:
    """Reads every range of the task as Arrow batches, with one consumer fetching them all
    at once, then reports their progress in one record.

    Records gone from under a range (retention, a deleted or re-created topic) follow the
    option failOnDataLoss, as in Spark's Kafka source: one clear error naming the
    partition and the offsets, or counted in the range's progress (``lost``) and skipped.
    """
    batch_id = spark_batch_id()
    builder = _Builder(
        options.event_time_field,
        late_events_watermark(task, batch_id),
        options.late_rule if options.late_output is not None else None,
        task.latest_event_ms,
    )
    reading = {(t, p): _Reading(t, p, a, b) for t, p, a, b in task.ranges}
    with reader_clients.borrowed_consumer(_reader_config(options)) as lease:
        yield from _read(lease, options, builder, reading)
    _finish_task(options, task, builder, reading, batch_id)


def _reader_config(options: SourceOptions) -> dict[str, Any]:
    return {
        # librdkafka (>= 2.3) pauses fetching for fetch.queue.backoff.ms (default 1 s)
        # whenever its queue holds queued.min.messages (100,000): a reader that drains
        # 10,000 at a time then sat idle most of the time, at 180k records/s instead of
        # over 1M (docs/performance.md). A kafka.* option overrides it.
        "fetch.queue.backoff.ms": 10,
        # A reader asks only for records that exist, so the broker never has to wait for
        # them; but a fetch in flight when a task ends (up to fetch.wait.max.ms, 500 ms
        # by default) delays the first fetch of the next task on the same consumer.
        "fetch.wait.max.ms": 10,
        **options.client_config(),
        **kafka_clients.NEVER_CREATE_TOPICS,  # a reader asks after deleted topics
        "group.id": READER_GROUP,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
    }


@dataclass
class _Reading:
    """One range being read: the next offset to read, and records found gone."""

    topic: str
    partition: int
    start: int
    end: int
    position: int = -1
    lost: int = 0
    unknown_answers: int = 0
    # When the position last moved (monotonic s): a range still for GONE_CHECK_S is
    # asked after (are its records gone?).
    moved_at: float = 0.0

    def __post_init__(self) -> None:
        self.position = self.start
        self.moved_at = time.monotonic()

    def move_to(self, position: int) -> None:
        if position > self.position:
            self.position = position
            self.moved_at = time.monotonic()

    @property
    def done(self) -> bool:
        return self.position >= self.end


def _read(
    lease: reader_clients.Lease,
    options: SourceOptions,
    builder: _Builder,
    reading: dict[_Key, _Reading],
) -> Iterator[pa.RecordBatch]:
    from confluent_kafka import TopicPartition

    consumer = lease.consumer
    open_ranges = {key: r for key, r in reading.items() if not r.done}
    assigned = [TopicPartition(t, p, r.position) for (t, p), r in open_ranges.items()]
    consumer.assign(assigned)
    deadline = time.monotonic() + options.read_timeout_s
    next_check = time.monotonic() + GONE_CHECK_S
    while open_ranges:
        asked = min(10_000, sum(r.end - r.position for r in open_ranges.values()))
        messages = consumer.consume(num_messages=asked, timeout=0.5)
        failures = _take(messages, open_ranges, reading, builder, lease)
        if len(builder) >= options.max_records_per_arrow_batch:
            yield builder.flush()
        if messages:
            deadline = time.monotonic() + options.read_timeout_s
        now = time.monotonic()
        stalled: dict[_Key, Any] = dict(failures)
        if now >= next_check and len(messages) < asked:
            # The consumer has nothing more queued: a range still this long gets nothing.
            stalled.update(
                (key, None)
                for key, r in open_ranges.items()
                if key not in stalled and now - r.moved_at >= GONE_CHECK_S
            )
        if stalled:
            # An error, or ranges that stopped arriving: are their records gone?
            next_check = now + GONE_CHECK_S
            if _follow_gone(consumer, options, open_ranges, stalled):
                deadline = time.monotonic() + options.read_timeout_s
        _skip_gaps(consumer, open_ranges)
        finished = [key for key, r in open_ranges.items() if r.done]
        if finished:
            # Stop fetching what the task has read whole. Not by pause(): librdkafka keeps
            # a pause across unassign, and a pooled consumer given the partition again in
            # a later task waited about 1 s after resume() before fetching it
            # (docs/performance.md, "Reading rate").
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in finished])
            for key in finished:
                del open_ranges[key]
        if open_ranges and time.monotonic() > deadline:
            late = list(open_ranges.values())
            named = ", ".join(
                f"{r.topic}[{r.partition}] at {r.position} of {r.end}" for r in late[:5]
            )
            raise SourceError(
                f"timed out reading {len(late)} range(s) after {options.read_timeout_s:.0f}s "
                f"without a record: {named}"
            )
    if len(builder):
        yield builder.flush()


def _take(
    messages: list[Any],
    open_ranges: dict[_Key, _Reading],
    reading: dict[_Key, _Reading],
    builder: _Builder,
    lease: reader_clients.Lease,
) -> dict[_Key, Any]:
    """One consume call's records into the builder, each range's position moved; returns
    the first error of each range that had one."""
    failures: dict[_Key, Any] = {}
    for key, records, failure in _runs(messages):
        if failure is not None:
            # An error event: this consumer is not given back to the pool after it.
            lease.spoiled = True
        current = open_ranges.get(key)
        if current is None:
            if failure is not None and key not in reading:
                # Not about a range of this task (a client-wide event, or one left
                # from an earlier task): librdkafka retries by itself.
                log.info("reader: Kafka error for %s[%s]: %s", key[0], key[1], failure)
            continue  # a range read whole (fetched past its end), or one not ours
        if failure is not None:
            failures.setdefault(key, failure)
            continue
        in_range = (
            records
            if records[-1].offset() < current.end
            else [m for m in records if m.offset() < current.end]
        )
        if in_range:
            builder.add_many(in_range, current)
            current.move_to(int(in_range[-1].offset()) + 1)
        if records[-1].offset() >= current.end:
            current.move_to(current.end)  # read past the range: it is complete
    return failures


def _follow_gone(
    consumer: Any,
    options: SourceOptions,
    open_ranges: dict[_Key, _Reading],
    stalled: dict[_Key, Any],
) -> bool:
    """Ranges whose records are gone move past them (failOnDataLoss=false) or stop the
    query; a range that failed with its records there fails the task. One metadata
    request per topic: while the broker cannot answer, nothing is asked per partition.
    True if a range moved."""
    from confluent_kafka import TopicPartition

    moved = False
    described: dict[str, Any] = {}
    for key, failure in stalled.items():
        current = open_ranges.get(key)
        if current is None:
            continue
        if current.topic not in described:
            described[current.topic] = _describe(consumer, current.topic, options.request_timeout_s)
        gone_until, unknown = _gone_until(
            consumer, current, described[current.topic], options.request_timeout_s
        )
        if unknown is not None:  # (None: the broker could not tell; the count stands)
            current.unknown_answers = current.unknown_answers + 1 if unknown else 0
        if current.unknown_answers >= 2:
            gone_until = current.end  # the topic or partition is gone, the range too
        if gone_until is not None:
            current.lost += _lose(options, current, gone_until)
            current.move_to(gone_until)
            moved = True
            continue
        if failure is not None:
            raise options.refused(
                failure, f"read topic {current.topic} (partition {current.partition})", READER_GROUP
            ) or SourceError(
                f"reading {current.topic}[{current.partition}] at {current.position}: {failure}"
            )
    if moved:
        # Fetching starts again where each range now is (a partition whose records were
        # out of range stopped fetching).
        consumer.assign(
            [TopicPartition(r.topic, r.partition, r.position) for r in open_ranges.values()]
        )
    return moved


def _skip_gaps(consumer: Any, open_ranges: dict[_Key, _Reading]) -> None:
    """Offset gaps (transaction markers, compaction): the consumer's position moves past
    offsets that carry no record."""
    from confluent_kafka import TopicPartition

    if not open_ranges:
        return
    positions = consumer.position([TopicPartition(t, p) for t, p in open_ranges])
    for answer in positions:
        current = open_ranges[(answer.topic, answer.partition)]
        if answer.offset > current.position:
            current.move_to(min(answer.offset, current.end))


def _finish_task(
    options: SourceOptions,
    task: TaskPartition,
    builder: _Builder,
    reading: dict[_Key, _Reading],
    batch_id: int | None,
) -> None:
    """The ranges were read whole: the rows the job will drop go aside, then the task's
    progress goes to the driver (in this order: the progress lets the plan go on)."""
    progress = []
    for current in reading.values():
        seen = builder.seen(current)
        if options.late_output is not None:
            write_range(
                options.late_output,
                seen.dropped,
                topic=current.topic,
                partition=current.partition,
                start=current.start,
                end=current.end,
                threshold_ms=builder.threshold_ms,
            )
        progress.append(seen.progress(current.lost))
    progress_report(options, task.progress_key(), task.encode_progress(progress, batch_id))


# What _describe answers when the broker cannot tell now.
_CANNOT_TELL = object()


def _describe(consumer: Any, topic: str, timeout_s: float) -> Any:
    """The broker's metadata of one topic (None: not listed), or _CANNOT_TELL."""
    from confluent_kafka import KafkaException

    try:
        return consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return _CANNOT_TELL


def _gone_until(
    consumer: Any, split: _Reading, described: Any, timeout_s: float
) -> tuple[int | None, bool | None]:
    """Where the records gone from the range's position on end (``[position, x)``), or
    None when they are there: retention moved the log start past the position, or the
    offsets went back (re-created, truncated). And whether the broker says the topic (or
    partition) does not exist, which the caller believes only when it says so twice: a
    broker just behind on metadata says so of a topic that does; None if it could not
    tell."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if described is _CANNOT_TELL:
        return None, None  # the broker cannot tell now: keep reading until the timeout
    position = split.position
    unknown = (
        described is None
        or (
            described.error is not None
            and described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        or (described.error is None and split.partition not in described.partitions)
    )
    if unknown:
        # Nothing to ask of a partition the broker does not know: asking would wait for
        # a leader until the timeout, or get an answer from a log on its way out.
        return None, True
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(split.topic, split.partition), timeout=timeout_s
        )
    except KafkaException:
        return None, None
    if int(low) > position:
        return min(int(low), split.end), False  # retention (or DeleteRecords) took them
    if high <= position:
        # The log ends where the open range still wants records: the offsets went back
        # (re-created, truncated), the records planned on are not coming. (A new
        # leader whose high watermark is still behind answers OFFSET_NOT_AVAILABLE,
        # KIP-207, not a lower end.)
        return split.end, False
    return None, False


def _lose(options: SourceOptions, split: _Reading, gone_until: int) -> int:
    """failOnDataLoss: stop with one error, or count the gone records and go on."""
    position = split.position
    where = f"{split.topic}[{split.partition}] offsets {position} to {gone_until - 1}"
    if options.fail_on_data_loss:
        raise SourceError(
            f"data loss: {where} are gone (retention, or the topic was deleted or "
            "re-created) before this query read them; the option failOnDataLoss=false "
            "goes on past them"
        )
    log.warning("data loss: %s are gone; skipped (failOnDataLoss=false)", where)
    return gone_until - position


def read_synthetic(options: SourceOptions, split: SyntheticPartition) -> Iterator[pa.RecordBatch]:
    """The synthetic row, then Spark's batch id to the planner (as a range's progress)."""
    yield _synthetic_batch(split.planned_watermark_ms, split.watermark_delay_ms)
    if split.progress_key:
        progress = Progress(0, None, -1, 0, 0, batch_id=spark_batch_id())
        progress_report(options, split.progress_key, progress.encode())


_partition_of = operator.methodcaller("partition")
_topic_of = operator.methodcaller("topic")


def _runs(messages: list[Any]) -> Iterator[tuple[_Key, list[Any], Any]]:
    """A consume call's messages by partition: each run of one partition's records (in
    offset order) with no error, or one error message with its partition.

    Errors are rare: one check over the call, and the slow path only when one is there.
    """
    if not messages:
        return
    if any(message.error() is not None for message in messages):
        from confluent_kafka import KafkaError

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
class _Seen:
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


class _Builder:
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
        self._seen: dict[_Key, _Seen] = {}
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

    def seen(self, split: _Reading) -> _Seen:
        return self._seen.setdefault((split.topic, split.partition), _Seen())

    def add_many(self, messages: list[Any], split: _Reading) -> None:
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
        seen: _Seen,
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


def _synthetic_batch(planned_watermark_ms: int, watermark_delay_ms: int) -> pa.RecordBatch:
    row: dict[str, Any] = {name: None for name in ARROW_SCHEMA.names}
    row[EVENT_TIME] = (planned_watermark_ms + watermark_delay_ms) * 1000
    row[LATE] = False
    return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
