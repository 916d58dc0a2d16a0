"""The readers, on the executors: one range of one partition as Arrow batches, its late
rows written aside, its progress reported to the progress topic; or the synthetic row."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from spark_consumer.event_time import (
    MAX_EVENT_TIME_MS,
    MIN_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
)
from spark_consumer.late_rows import DroppedRow, LateRule, write_range
from spark_consumer.source_options import ARROW_SCHEMA, EVENT_TIME, LATE, SourceError, SourceOptions
from spark_consumer.source_partitions import (
    Progress,
    RangePartition,
    SyntheticPartition,
    late_events_watermark,
    spark_batch_id,
)

log = logging.getLogger(__name__)


def read_range(options: SourceOptions, split: RangePartition) -> Iterator[pa.RecordBatch]:
    """Reads ``[start, end)`` of one partition as Arrow batches, then reports its progress.

    Records gone from under the range (retention, a deleted or re-created topic) follow
    the option failOnDataLoss, as in Spark's Kafka source: one clear error naming the
    partition and the offsets, or counted in the progress (``lost``) and skipped.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            # librdkafka (>= 2.3) pauses fetching for fetch.queue.backoff.ms (default
            # 1 s) whenever its queue holds queued.min.messages (100,000): a reader that
            # drains 10,000 at a time then sat idle most of the time, at 180k records/s
            # instead of over 1M (docs/performance.md). A kafka.* option overrides it.
            "fetch.queue.backoff.ms": 10,
            **options.client_config(),
            "group.id": "slackwater-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    batch_id = spark_batch_id()
    builder = _Builder(
        split,
        options.event_time_field,
        late_events_watermark(split, batch_id),
        options.late_rule if options.late_output is not None else None,
        split.latest_event_ms,
    )
    lost = 0
    try:
        consumer.assign([TopicPartition(split.topic, split.partition, split.start)])
        position = split.start
        deadline = time.monotonic() + options.read_timeout_s
        next_check = time.monotonic() + _GONE_CHECK_S
        unknown_answers = 0
        while position < split.end:
            messages = consumer.consume(num_messages=min(10_000, split.end - position), timeout=0.5)
            records, failure = _records_before(messages, split)
            if records:
                builder.add_many(records)
                position = int(records[-1].offset()) + 1
                if len(builder) >= options.max_records_per_arrow_batch:
                    yield builder.flush()
            if (
                messages
                and messages[-1].error() is None
                and (messages[-1].offset() or 0) >= split.end
            ):
                position = split.end  # read past the range: it is complete
            if messages:
                deadline = time.monotonic() + options.read_timeout_s
            if position < split.end and (
                failure is not None or (not messages and time.monotonic() > next_check)
            ):
                # An error, or a range that stopped arriving: are its records gone?
                next_check = time.monotonic() + _GONE_CHECK_S
                gone_until, unknown = _gone_until(
                    consumer, split, position, options.request_timeout_s
                )
                unknown_answers = unknown_answers + 1 if unknown else 0
                if unknown_answers >= 2:
                    gone_until = split.end  # the topic or partition is gone, the range too
                if gone_until is not None:
                    lost += _lose(options, split, position, gone_until)
                    position = gone_until
                    if position < split.end:
                        consumer.assign([TopicPartition(split.topic, split.partition, position)])
                    deadline = time.monotonic() + options.read_timeout_s
                    continue
                if failure is not None:
                    raise SourceError(
                        f"reading {split.topic}[{split.partition}] at {position}: {failure}"
                    )
            # Offset gaps (transaction markers, compaction): the consumer's position
            # moves past offsets that carry no record.
            current = consumer.position([TopicPartition(split.topic, split.partition)])
            if current and current[0].offset > position:
                position = min(current[0].offset, split.end)
            if position < split.end and time.monotonic() > deadline:
                raise SourceError(
                    f"timed out reading {split.topic}[{split.partition}] at {position}, "
                    f"expected up to {split.end}"
                )
        if len(builder):
            yield builder.flush()
    finally:
        consumer.close()
    _finish_range(options, split, builder, batch_id, lost)


def _finish_range(
    options: SourceOptions,
    split: RangePartition,
    builder: _Builder,
    batch_id: int | None,
    lost: int,
) -> None:
    """The range was read whole: the rows the job will drop go aside, then its progress
    goes to the driver (in this order: the progress lets the plan go on)."""
    if options.late_output is not None:
        write_range(
            options.late_output,
            builder.dropped,
            topic=split.topic,
            partition=split.partition,
            start=split.start,
            end=split.end,
            threshold_ms=builder.threshold_ms,
        )
    key = split.progress_key(options.event_time_field or "timestamp")
    progress = dataclasses.replace(builder.progress(), batch_id=batch_id, lost=lost)
    _report_progress(options, key, progress)


# How long a range may deliver nothing before the reader asks whether its records are gone.
_GONE_CHECK_S = 2.0


def _gone_until(
    consumer: Any, split: RangePartition, position: int, timeout_s: float
) -> tuple[int | None, bool]:
    """Where the records gone from ``position`` on end (``[position, x)``), or None when
    they are there: retention moved the log start past the position, or the offsets went
    back (re-created, truncated). And whether the broker says the topic (or partition)
    does not exist, which the caller believes only when it says so twice: a broker just
    behind on metadata says so of a topic that does."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    try:
        metadata = consumer.list_topics(split.topic, timeout=timeout_s)
    except KafkaException:
        return None, False  # the broker cannot tell now: keep reading until the timeout
    described = metadata.topics.get(split.topic)
    unknown = (
        described is None
        or (
            described.error is not None
            and described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        or (described.error is None and split.partition not in described.partitions)
    )
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(split.topic, split.partition), timeout=timeout_s
        )
    except KafkaException:
        return None, unknown
    if int(low) > position:
        return min(int(low), split.end), False  # retention (or DeleteRecords) took them
    if high < position:
        return split.end, False  # the offsets went back: not the records planned on
    return None, False


def _lose(options: SourceOptions, split: RangePartition, position: int, gone_until: int) -> int:
    """failOnDataLoss: stop with one error, or count the gone records and go on."""
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
        _report_progress(options, split.progress_key, progress)


def _report_progress(options: SourceOptions, key: str, progress: Progress) -> None:
    """One progress record, acknowledged before the task ends (a retry or a replay
    writes the same record again, harmlessly)."""
    from confluent_kafka import Producer

    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer = Producer({**options.producer_config(), "linger.ms": 0, "acks": "all"})
    producer.produce(
        options.progress_topic, key=key.encode(), value=progress.encode(), on_delivery=delivered
    )
    # A record the broker refuses (authorization, size) leaves the queue with an error:
    # the task fails now, saying why, not the next plan after its progress timeout.
    if producer.flush(options.request_timeout_s) != 0 or failures:
        why = failures[0].str() if failures else "not acknowledged in time"
        raise SourceError(f"progress of {key} not written to {options.progress_topic}: {why}")


def synthetic_progress_key(plan_id: str) -> str:
    return f"synthetic:{plan_id}"


def _records_before(messages: list[Any], split: RangePartition) -> tuple[list[Any], Any]:
    """The records of one consume call that belong to the range, in offset order, and its
    first error that is not the end of the partition (or None).

    Errors are rare: one check over the call, and the slow path only when one is there.
    """
    failure = None
    if any(message.error() is not None for message in messages):
        from confluent_kafka import KafkaError

        errors = [message.error() for message in messages if message.error() is not None]
        failure = next((e for e in errors if e.code() != KafkaError._PARTITION_EOF), None)
        messages = [message for message in messages if message.error() is None]
    if messages and messages[-1].offset() >= split.end:
        messages = [message for message in messages if message.offset() < split.end]
    return messages, failure


class _Builder:
    """Column lists for Arrow batches, filled a consume call at a time, and the range's
    running progress. Column-wise on purpose: one comprehension per column costs a
    fraction of one Python call per record (docs/performance.md)."""

    def __init__(
        self,
        split: RangePartition,
        event_time_field: str | None,
        threshold_ms: int,
        late_rule: LateRule | None = None,
        latest_event_ms: int | None = None,
    ) -> None:
        self.split = split
        # Event times past this are unreadable (the option maxEventTimeAhead), if set.
        self.latest_event_ms = latest_event_ms
        self.event_time_field = event_time_field
        # The watermark Spark judges this range's rows late by (late_events_watermark).
        self.threshold_ms = threshold_ms
        self.late_rule = late_rule
        self.dropped: list[DroppedRow] = []
        self.records = self.late = self.unreadable = 0
        self.max_event_ms: int | None = None
        self.max_offset = -1
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.event_times: list[int | None] = []
        self.lates: list[bool] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add_many(self, messages: list[Any]) -> None:
        values = [m.value() for m in messages]
        stamps = [m.timestamp() for m in messages]
        offsets = [m.offset() for m in messages]
        self.keys += [m.key() for m in messages]
        self.values += values
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
        self.records += len(messages)
        self.unreadable += unreadable
        self.late += sum(lates) - unreadable
        if readable:
            newest = max(readable)
            if self.max_event_ms is None or newest > self.max_event_ms:
                self.max_event_ms = newest
        self.max_offset = offsets[-1]
        self.event_times += [None if ms is None else ms * 1000 for ms in event_ms]
        self.lates += lates
        if self.late_rule is not None and any(lates):
            self._note_dropped(values, stamps, offsets, event_ms, threshold)

    def _note_dropped(
        self,
        values: list[bytes | None],
        stamps: list[tuple[int, int]],
        offsets: list[int],
        event_ms: list[int | None],
        threshold: int,
    ) -> None:
        """The rows the job's aggregation will drop, with why (late_rows.py). Only
        late rows can be dropped, so only consume calls that have one come here."""
        assert self.late_rule is not None
        for index, ms in enumerate(event_ms):
            if ms is None:
                reason = "unreadable: " + self._why_unreadable(values[index], stamps[index])
            elif self.late_rule.dropped(ms, threshold):
                reason = "late"
            else:
                continue
            self.dropped.append(DroppedRow(offsets[index], ms, reason))

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
        count = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.split.topic] * count, pa.string()),
                pa.array([self.split.partition] * count, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_types, pa.int32()),
                pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
                pa.array(self.event_times, pa.timestamp("us", tz="UTC")),
                pa.array(self.lates, pa.bool_()),
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch

    def progress(self) -> Progress:
        return Progress(
            records=self.records,
            max_event_time_ms=self.max_event_ms,
            max_offset=self.max_offset,
            late=self.late,
            unreadable=self.unreadable,
            dropped=len(self.dropped),
        )


def _synthetic_batch(planned_watermark_ms: int, watermark_delay_ms: int) -> pa.RecordBatch:
    row: dict[str, Any] = {name: None for name in ARROW_SCHEMA.names}
    row[EVENT_TIME] = (planned_watermark_ms + watermark_delay_ms) * 1000
    row[LATE] = False
    return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
