"""What the driver hands the readers (a range of one partition, or the batch's synthetic
row) and what the readers hand back (their progress), with the rule that judges late rows."""

from __future__ import annotations

import json
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


# ------------------------------------------------------------------------ partitions


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Kafka partition's ``[start, end)`` in one micro-batch."""

    topic: str
    partition: int
    start: int
    end: int
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

    def progress_key(self, event_time: str) -> str:
        """The key of the progress record its reader writes (see progress_key)."""
        return progress_key(
            query=self.query,
            topic=self.topic,
            partition=self.partition,
            start=self.start,
            end=self.end,
            late_threshold_ms=self.late_threshold_ms,
            event_time=event_time,
        )


@dataclass(frozen=True)
class SyntheticPartition(InputPartition):
    """The batch's one synthetic row: event time V + D (semantics.md §6). Its task also
    reports Spark's batch id, for a batch that read no range."""

    planned_watermark_ms: int
    watermark_delay_ms: int
    progress_key: str = ""


def late_events_watermark(split: RangePartition, batch_id: int | None) -> int:
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
