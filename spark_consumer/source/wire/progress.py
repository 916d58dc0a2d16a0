"""What a reader reports to the planner, and how the two find the same record.

Readers write one record per task to the progress topic (``<control topic>.progress``)
once the task has read its ranges, acknowledged before the task ends; the planner of
the next batch waits for the keys of the tasks it made (splits.TaskPartition carries
its key's every part, so the two never spell it apart) and advances each channel by
what the record says (the records, the newest event time, the late and unreadable
counts). The batch's synthetic task reports Spark's batch id under its own key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

# A partition's [start, end) in a batch: (topic, partition, start, end).
Range = tuple[str, int, int, int]


@dataclass(slots=True)
class Progress:
    """What a reader saw in one range: the driver needs nothing else of the data. Slots,
    not frozen: the planner makes one per range read (10,000 a plan), and a frozen
    dataclass's ``__init__`` took 1.3 µs of it, 0.2 here (docs/performance.md)."""

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
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

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
    """What a reader task saw in each of its ranges (in the task's order), as columns.
    Not hashable, though frozen: the ``Progress`` it holds are not."""

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
            Progress(  # (positional: this loop is the planner's per range)
                int(records),
                None if newest is None else int(newest),
                int(max_offset),
                int(late),
                int(unreadable),
                int(dropped),
                batch_id,
                int(lost),
            )
            for records, newest, max_offset, late, unreadable, dropped, lost in zip(
                *columns, strict=True
            )
        )
        return cls(ranges, batch_id)


def synthetic_progress_key(plan_id: str) -> str:
    return f"synthetic:{plan_id}"
