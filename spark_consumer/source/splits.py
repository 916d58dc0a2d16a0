"""What the driver hands the readers (a task of ranges, or the batch's synthetic row) and
what the readers hand back (their progress), with the rule that judges late rows.

A batch's ranges (one per partition with new records) are grouped into tasks
(``group_ranges``): one task reads all of its ranges with one consumer, at once, and
writes one progress record for them (``TaskProgress``). The driver makes the same tasks
from the offset again to know which records to wait for (``tasks_of``), so the key a
reader writes and the key the driver waits for come from one place.

    ranges   t:0 [5,9)  t:1 [0,2)  t:2 [7,7+300)  t:3 [1,4) ...   (topic, partition order)
    tasks    [ t:0  t:1 ] [ t:2 ]                [ t:3 ... ]      about records / tasks each
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from spark_consumer.valve import MIN_WATERMARK


@dataclass(frozen=True)
class Progress:
    """What a reader saw in one range: the driver needs nothing else of the data."""

    records: int
    max_event_time_ms: int | None
    max_offset: int
    late: int
    unreadable: int
    # Rows written to the late output (the option lateOutput), else 0.
    dropped: int = 0
    # Spark's id of the batch that read the range (its task's local property).
    batch_id: int | None = None
    # Records of the range that were gone when it was read (failOnDataLoss=false).
    lost: int = 0

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Progress:
        """Raises ValueError (or a subclass) for a record that is not a progress record."""
        raw = json.loads(value)
        return cls(
            records=int(raw["records"]),
            max_event_time_ms=None
            if raw["max_event_time_ms"] is None
            else int(raw["max_event_time_ms"]),
            max_offset=int(raw["max_offset"]),
            late=int(raw["late"]),
            unreadable=int(raw["unreadable"]),
            dropped=int(raw.get("dropped", 0)),
            batch_id=None if raw.get("batch_id") is None else int(raw["batch_id"]),
            lost=int(raw.get("lost", 0)),
        )


def progress_key(
    *,
    query: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    late_threshold_ms: int,
    event_time: str,
) -> str:
    """The same range read with the same settings by the same query gives the same
    record: retries and replays only repeat it. ``query`` is the checkpoint's identity
    (made in ``initialOffset``): two queries sharing a progress topic never take each
    other's records (an offset of an older version has none: "")."""
    key = f"{topic}:{partition}:{start}-{end}:{late_threshold_ms}:{event_time}"
    return f"{query}/{key}" if query else key


# A partition's [start, end) in a batch: (topic, partition, start, end).
Range = tuple[str, int, int, int]
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


def task_progress_key(
    *, query: str, ranges: Sequence[Range], late_threshold_ms: int, event_time: str
) -> str:
    """As ``progress_key``, for a task of ranges: its first range and count for a reader
    of the topic, and a digest of them all, so that the key stays short."""
    text = ";".join(f"{t}:{p}:{a}-{b}" for t, p, a, b in ranges)
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    topic, partition, start, end = ranges[0]
    first = f"{topic}:{partition}:{start}-{end}"
    return f"{query}/task:{first}+{len(ranges) - 1}:{late_threshold_ms}:{event_time}:{digest}"


@dataclass(frozen=True)
class TaskProgress:
    """What a reader task saw in each of its ranges (in the task's order), as columns."""

    ranges: tuple[Progress, ...]
    batch_id: int | None = None

    _COLUMNS = ("records", "max_event_time_ms", "max_offset", "late", "unreadable", "dropped")

    def encode(self) -> bytes:
        columns: dict[str, object] = {
            name: [getattr(p, name) for p in self.ranges] for name in self._COLUMNS
        }
        columns["lost"] = [p.lost for p in self.ranges]
        return json.dumps(
            {"v": 2, "batch_id": self.batch_id, **columns}, separators=(",", ":")
        ).encode()

    @classmethod
    def decode(cls, value: bytes, count: int) -> TaskProgress:
        """Raises ValueError (or a subclass) for a record that is not the progress of a
        task of ``count`` ranges."""
        raw = json.loads(value)
        if raw.get("v") != 2:
            raise ValueError("not a task's progress record")
        batch_id = None if raw.get("batch_id") is None else int(raw["batch_id"])
        columns = [raw[name] for name in (*cls._COLUMNS, "lost")]
        if any(len(column) != count for column in columns):
            raise ValueError(f"a task's progress record for other than {count} ranges")
        ranges = tuple(
            Progress(
                records=int(records),
                max_event_time_ms=None if newest is None else int(newest),
                max_offset=int(max_offset),
                late=int(late),
                unreadable=int(unreadable),
                dropped=int(dropped),
                batch_id=batch_id,
                lost=int(lost),
            )
            for records, newest, max_offset, late, unreadable, dropped, lost in zip(
                *columns, strict=True
            )
        )
        return cls(ranges, batch_id)


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

    def progress_key(self, event_time: str) -> str:
        """The key of the progress record its reader writes."""
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

    def decode_progress(self, value: bytes) -> list[tuple[tuple[str, int], Progress]]:
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
