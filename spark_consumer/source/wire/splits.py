"""What the driver hands the readers: a task of ranges, or the batch's synthetic row,
with the rule that judges late rows (what the readers hand back is progress.py's).

A batch's ranges (one per partition with new records) are grouped into tasks
(``group_ranges``): one task reads all of its ranges with one consumer, at once, and
writes one progress record for them (``TaskProgress``). The driver makes the same tasks
from the offset again to know which records to wait for, so the key a reader writes and
the key the driver waits for come from one split (``TaskPartition.progress_key``).

    ranges   t:0 [5,9)  t:1 [0,2)  t:2 [7,7+300)  t:3 [1,4) ...   (topic, partition order)
    tasks    [ t:0  t:1 ] [ t:2 ]                [ t:3 ... ]      about records / tasks each
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from slackwater.markers import TopicPartitionKey
from spark_consumer.source.shared.options import SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.source.wire.progress import (
    Progress,
    Range,
    TaskProgress,
    progress_key,
    synthetic_progress_key,
    task_progress_key,
)
from spark_consumer.valve import MIN_WATERMARK

# A task holds at most this many ranges: its progress record stays far below Kafka's
# default largest record (1 MB; about 30 bytes per range).
MAX_RANGES_PER_TASK = 2_000


def group_ranges(ranges: Sequence[Range], tasks: int | None) -> list[tuple[Range, ...]]:
    """Consecutive ranges into about ``tasks`` tasks of about equal records (a range is
    never split: one range larger than a share is a task of its own), at most
    ``MAX_RANGES_PER_TASK`` each. ``tasks`` None: one range per task (an offset of
    version 1 planned the batch)."""
    if tasks is None:
        return [(r,) for r in ranges]
    share = max(1, -(-sum(end - start for _, _, start, end in ranges) // max(1, tasks)))
    groups: list[tuple[Range, ...]] = []
    current: list[Range] = []
    records = 0
    for item in ranges:
        size = item[3] - item[2]
        if current and (records + size > share or len(current) >= MAX_RANGES_PER_TASK):
            groups.append(tuple(current))
            current, records = [], 0
        current.append(item)
        records += size
    if current:
        groups.append(tuple(current))
    return groups


# ------------------------------------------------------------------------ partitions


@dataclass(frozen=True)
class TaskPartition(InputPartition):
    """One task of a micro-batch: ranges of one or more partitions, read together."""

    ranges: tuple[Range, ...]
    # The watermark Spark evicts state by in this batch (the previous batch's plan).
    late_threshold_ms: int
    # The one before it, and Spark's id of the batch that planned it: with this batch's
    # id they give the watermark Spark judges late rows by (late_events_watermark).
    previous_threshold_ms: int = MIN_WATERMARK
    previous_batch_id: int | None = None
    # The query's identity, for its progress keys (see progress_key).
    query: str = ""
    # The newest event time the range's records may carry: the option maxEventTimeAhead
    # past the driver's clock when it planned the batch (a replay judges by the same);
    # None: no bound.
    latest_event_ms: int | None = None
    # An offset of version 1 planned the batch: one range, whose progress is written as
    # version 1's readers wrote it (``progress_key``, ``Progress``), as the next plan of a
    # query restarted on that offset waits for.
    legacy: bool = False
    # The event-time field its batch was planned with (None: the Kafka timestamp, named
    # "timestamp" in its progress key), set where the planner makes the task: its reader
    # reads by it (``options_for``) and writes, and the planner waits for, the key of this
    # one split.
    event_time: str | None = None
    # (topic, id) of its ranges' topics as the planner knew them: a reader whose range
    # stays below its end tells a re-created topic by its new id (kafka_evidence rule 6).
    topic_ids: tuple[tuple[str, str], ...] = ()
    # (topic, partition, leader epoch) of its ranges' ends as planned: a reader whose
    # range stays below its end tells a log truncated since by a newer epoch (rule 3).
    leader_epochs: tuple[tuple[str, int, int], ...] = ()

    def progress_key(self, event_time: str | None = None) -> str:
        """The key of the progress record its reader writes."""
        event_time = (self.event_time or "timestamp") if event_time is None else event_time
        if self.legacy:
            topic, partition, start, end = self.ranges[0]
            return progress_key(
                query=self.query,
                topic=topic,
                partition=partition,
                start=start,
                end=end,
                late_threshold_ms=self.late_threshold_ms,
                event_time=event_time,
            )
        return task_progress_key(
            query=self.query,
            ranges=self.ranges,
            late_threshold_ms=self.late_threshold_ms,
            event_time=event_time,
        )

    def encode_progress(self, progress: Sequence[Progress], batch_id: int | None) -> bytes:
        """The progress record of this task's reader (one ``Progress`` per range)."""
        if self.legacy:
            return dataclasses.replace(progress[0], batch_id=batch_id).encode()
        return TaskProgress(tuple(progress), batch_id).encode()

    def decode_progress(self, value: bytes) -> list[tuple[TopicPartitionKey, Progress]]:
        """Each range's partition and progress from this task's record (ValueError, or
        a subclass, for a record that is not one)."""
        if self.legacy:
            topic, partition, _, _ = self.ranges[0]
            return [((topic, partition), Progress.decode(value))]
        progress = TaskProgress.decode(value, len(self.ranges))
        return [
            ((t, p), seen) for (t, p, _, _), seen in zip(self.ranges, progress.ranges, strict=True)
        ]


@dataclass(frozen=True)
class SyntheticPartition(InputPartition):
    """The batch's one synthetic row: event time V + D (semantics.md §6). Its task also
    reports Spark's batch id, for a batch that read no range."""

    planned_watermark_ms: int
    watermark_delay_ms: int
    progress_key: str = ""

    def decode_progress(self, value: bytes) -> list[tuple[TopicPartitionKey, Progress]]:
        """Its task's record: Spark's batch id, under no partition ("", -1)."""
        return [(("", -1), Progress.decode(value))]


def options_for(options: SourceOptions, partition: InputPartition) -> SourceOptions:
    """The options a task is read with: the event-time field its batch was planned with
    (a batch Spark runs again after a restart with another eventTimeField)."""
    if isinstance(partition, TaskPartition) and partition.event_time != options.event_time_field:
        return dataclasses.replace(options, event_time_field=partition.event_time)
    return options


def late_events_watermark(split: TaskPartition, batch_id: int | None) -> int:
    """The watermark Spark's first stateful operator drops late rows by in this batch.

    Since Spark 3.4 (SPARK-40925) a batch evicts state by its own watermark but judges
    late input by the watermark of the batch Spark ran just before it. That is the
    batch this source planned before (whose watermark was ``previous_threshold_ms``),
    unless Spark ran a no-data batch in between (the batch ids are not consecutive),
    whose watermark is already this batch's (``late_threshold_ms``):

        plans:      ...  D(k-1)                     D(k)
        Spark:      ...  D(k-1) [no-data batch(es)] D(k)
        late by:    D(k-1)'s watermark  if D(k) directly follows D(k-1)
                    D(k)'s watermark    if a no-data batch ran between them

    Unknown ids (an offset from an older version): this batch's watermark, as before.
    """
    if batch_id is None or split.previous_batch_id is None:
        return split.late_threshold_ms
    if batch_id > split.previous_batch_id + 1:
        return split.late_threshold_ms
    return split.previous_threshold_ms


def spark_batch_id() -> int | None:
    """Spark's id of the micro-batch this task runs in (a local property of the task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(value) if value is not None else None


def batch_tasks(
    options: SourceOptions,
    end: SourceOffset,
    topic_ids: Mapping[str, str] | None = None,
    leader_epochs: Mapping[TopicPartitionKey, int] | None = None,
) -> tuple[list[TaskPartition], SyntheticPartition | None]:
    """The tasks of the batch that ends at ``end``: its reader tasks (its ranges grouped
    as the offset says), and its synthetic row once the valve has a watermark. The
    planner makes them for Spark, and again to know whose progress to wait for."""
    threshold = end.late_threshold  # == the previous offset's watermark
    previous = threshold if end.previous_threshold is None else end.previous_threshold
    tasks = [
        TaskPartition(
            ranges,
            threshold,
            previous,
            end.previous_batch_id,
            query=end.query,
            latest_event_ms=end.latest_event_ms,
            legacy=end.tasks is None,
            event_time=event_time_field(end, options),
            topic_ids=_ids_of(ranges, topic_ids or {}),
            leader_epochs=_epochs_of(ranges, leader_epochs or {}),
        )
        for ranges in group_ranges(end.ranges(), end.tasks)
    ]
    synthetic = None
    if end.watermark > MIN_WATERMARK:
        synthetic = SyntheticPartition(
            min(end.watermark, options.max_planned_watermark_ms),
            options.watermark_delay_ms,
            synthetic_progress_key(end.plan_id),
        )
    return tasks, synthetic


def _ids_of(ranges: Sequence[Range], topic_ids: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({(r[0], topic_ids[r[0]]) for r in ranges if r[0] in topic_ids}))


def _epochs_of(
    ranges: Sequence[Range], epochs: Mapping[TopicPartitionKey, int]
) -> tuple[tuple[str, int, int], ...]:
    return tuple((t, p, epochs[(t, p)]) for t, p, _, _ in ranges if (t, p) in epochs)


def event_time_field(offset: SourceOffset, options: SourceOptions) -> str | None:
    """The field the batch that ends at ``offset`` is read by: the one it was planned with
    (a batch Spark runs again after a restart, and the next plan's wait for its progress)."""
    field: str | None = offset.planned_with.get("eventTimeField", options.event_time_field)
    return field
