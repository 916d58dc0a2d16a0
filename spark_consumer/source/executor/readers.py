"""The readers, on the executors: a task's ranges as Arrow batches, their late rows
written aside, their progress reported to the progress topic; or the synthetic row.
The driver never imports this module: Spark's ``read`` reaches it on an executor."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from confluent_kafka import TopicPartition

from slackwater import kafka_clients, kafka_evidence, kafka_logging
from slackwater.markers import TopicPartitionKey
from spark_consumer.source.executor import reader_clients
from spark_consumer.source.executor.arrow_rows import RowBuilder, runs, synthetic_batch
from spark_consumer.source.executor.reader_ranges import READER_GROUP, Reading, follow_gone
from spark_consumer.source.shared.late_rows import write_range
from spark_consumer.source.shared.options import (
    GONE_CHECK_S,
    READER,
    READER_CLIENT,
    SourceError,
    SourceOptions,
)
from spark_consumer.source.wire.progress import Progress
from spark_consumer.source.wire.splits import (
    SyntheticPartition,
    TaskPartition,
    late_events_watermark,
    spark_batch_id,
)

log = logging.getLogger(__name__)


def read(options: SourceOptions, partition: Any) -> Iterator[pa.RecordBatch]:
    """Spark's ``read`` of one of the batch's partitions (``planner.partitions``)."""
    if isinstance(partition, SyntheticPartition):
        return read_synthetic(options, partition)
    assert isinstance(partition, TaskPartition)
    return read_task(options, partition)


def read_task(options: SourceOptions, task: TaskPartition) -> Iterator[pa.RecordBatch]:
    """Reads every range of the task as Arrow batches, with one consumer fetching them all
    at once, then reports their progress in one record.

    Records gone from under a range (retention, a deleted or re-created topic) follow the
    option failOnDataLoss, as in Spark's Kafka source: one clear error naming the
    partition and the offsets, or counted in the range's progress (``lost``) and skipped.
    A refusal (credentials, a certificate, an ACL: this executor's settings or files may
    not be the driver's) ends the task at once in one line naming the reader.
    """
    batch_id = spark_batch_id()
    builder = RowBuilder(
        options.event_time_field,
        late_events_watermark(task, batch_id),
        options.late_rule if options.late_output is not None else None,
        task.latest_event_ms,
    )
    ids, epochs = dict(task.topic_ids), {(t, p): e for t, p, e in task.leader_epochs}
    reading = {
        (t, p): Reading(t, p, a, b, topic_id=ids.get(t), leader_epoch=epochs.get((t, p)))
        for t, p, a, b in task.ranges
    }
    # A failure left by a client of an earlier task (a task's own are served by its
    # consume calls, which come after this): never this task's to name.
    kafka_logging.take_authentication_failure(READER_CLIENT)
    try:
        with reader_clients.borrowed_consumer(_reader_config(options)) as lease:
            yield from _read(lease, options, builder, reading)
    except reader_clients.NotMade as error:
        raise options.not_made(error.args[0], READER) from None
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


def _read(
    lease: reader_clients.Lease,
    options: SourceOptions,
    builder: RowBuilder,
    reading: dict[TopicPartitionKey, Reading],
) -> Iterator[pa.RecordBatch]:
    consumer = lease.consumer
    open_ranges = {key: r for key, r in reading.items() if not r.done}
    assigned = [TopicPartition(t, p, r.position) for (t, p), r in open_ranges.items()]
    consumer.assign(assigned)
    deadline = time.monotonic() + options.read_timeout_s
    next_check = time.monotonic() + GONE_CHECK_S
    while open_ranges:
        asked = min(10_000, sum(r.end - r.position for r in open_ranges.values()))
        messages = consumer.consume(num_messages=asked, timeout=0.5)
        options.not_refused(READER_CLIENT, READER, answered=bool(messages))
        failures = _take(messages, open_ranges, reading, builder, lease, options=options)
        if len(builder) >= options.max_records_per_arrow_batch:
            yield builder.flush()
        if messages:
            deadline = time.monotonic() + options.read_timeout_s
        now = time.monotonic()
        stalled: dict[TopicPartitionKey, Any] = dict(failures)
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
            if follow_gone(consumer, options, open_ranges, stalled):
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
    open_ranges: dict[TopicPartitionKey, Reading],
    reading: dict[TopicPartitionKey, Reading],
    builder: RowBuilder,
    lease: reader_clients.Lease,
    *,
    options: SourceOptions,
) -> dict[TopicPartitionKey, Any]:
    """One consume call's records into the builder, each range's position moved; returns
    the first error of each range that had one. A client-wide refusal (the reader's
    group not the principal's to describe: GROUP_AUTHORIZATION_FAILED) ends the task."""
    failures: dict[TopicPartitionKey, Any] = {}
    for key, records, failure in runs(messages):
        if failure is not None:
            # An error event: this consumer is not given back to the pool after it.
            lease.spoiled = True
            if key[0] is None:
                topic = next(iter(reading))[0]
                refused = options.refused(failure, f"read topic {topic}", READER_GROUP, READER)
                if refused:
                    raise refused
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


def _skip_gaps(consumer: Any, open_ranges: dict[TopicPartitionKey, Reading]) -> None:
    """Offset gaps (transaction markers, compaction): the consumer's position moves past
    offsets that carry no record."""
    if not open_ranges:
        return
    positions = consumer.position([TopicPartition(t, p) for t, p in open_ranges])
    for answer in positions:
        current = open_ranges[(answer.topic, answer.partition)]
        if kafka_evidence.known_offset(answer.offset) and answer.offset > current.position:
            current.move_to(min(answer.offset, current.end))


def _finish_task(
    options: SourceOptions,
    task: TaskPartition,
    builder: RowBuilder,
    reading: dict[TopicPartitionKey, Reading],
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
    _report_progress(options, task.progress_key(), task.encode_progress(progress, batch_id))


def read_synthetic(options: SourceOptions, split: SyntheticPartition) -> Iterator[pa.RecordBatch]:
    """The synthetic row, then Spark's batch id to the planner (as a range's progress)."""
    yield synthetic_batch(split.planned_watermark_ms, split.watermark_delay_ms)
    if split.progress_key:
        progress = Progress(0, None, -1, 0, 0, batch_id=spark_batch_id())
        _report_progress(options, split.progress_key, progress.encode())


def _report_progress(options: SourceOptions, key: str, value: bytes) -> None:
    """One progress record, acknowledged before the task ends (a retry or a replay
    writes the same record again, harmlessly)."""
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    config = {**options.producer_config(), "linger.ms": 0, "acks": "all"}
    try:
        producer = reader_clients.producer(config)
    except reader_clients.NotMade as error:
        raise options.not_made(error.args[0], READER) from None
    producer.produce(options.progress_topic, key=key.encode(), value=value, on_delivery=delivered)
    # A record the broker refuses (authorization, size) leaves the queue with an error:
    # the task fails now, saying why, not the next plan after its progress timeout.
    if producer.flush(options.request_timeout_s) != 0 or failures:
        why = failures[0].str() if failures else "not acknowledged in time"
        reader_clients.drop_producer(config)  # it may be in any state now
        refused = failures and options.refused(
            failures[0], f"write progress topic {options.progress_topic}", by=READER
        )
        not_authenticated = kafka_logging.take_authentication_failure(READER_CLIENT)
        if not refused and not_authenticated is not None:
            refused = options.not_authenticated(not_authenticated, READER)
        raise refused or SourceError(
            f"progress of {key} not written to {options.progress_topic}: {why}"
        )
