"""Watermark alignment: a partition far ahead in event time waits for the others (issue 43;
Flink's ``withWatermarkAlignment``, FLIP-182 and FLIP-217, its ``maxAllowedWatermarkDrift``).

Why: the valve's watermark is the minimum over the partitions that are not IDLE or
FINISHED, so every window a fast partition has passed stays in Spark's state store until
the slowest catches up. ``maxOffsetsPerTrigger`` shares a batch by offsets, not event
time, so in a skewed backfill the short-span partitions run hours ahead and state grows
with them. The planner knows each partition's event time (the readers' progress) and the
valve's channels; holding the ones ahead keeps the state to about the drift.

Pure: a function of the plan's aligner state (in the offset: a restart derives the same
holds), the read positions and the ends the plan could read. The rules, in order::

    watermark(p) = newest event time read on p - maxOutOfOrderness  (unknown before any)
    waited for   = p is ACTIVE and counts in the valve's minimum (not IDLE, FINISHED,
                   or ACTIVE again but still behind the valve's output)
    reference    = min watermark(p) over waited-for p with a known watermark
    held(p)      = p is waited for, can move (records between its read position and
                   its end), and watermark(p) is known and > reference + drift
                   (unknown, or not waited for: read, never held)
    no stall     : when every waited-for p of known watermark that can move is held,
                   the reference is the smallest watermark among them (the furthest
                   behind is read, with those within the drift of it)

Why holding is safe: the valve's output never passes the watermark of a partition it
waits for, so a held partition's unread records (at or above that watermark, less
maxOutOfOrderness) are never late. One it does not wait for, held, would see the others
run past its records (tests/pure/test_watermark_alignment.py draws such backfills).

      event time ->   reference         reference + drift
      p0 (ACTIVE)  ------|                   |              read
      p1 (ACTIVE)  ---------------|          |              read
      p2 (ACTIVE)  ------------------------------|          held: ahead by more than drift
      p3 (IDLE)    --------|                                in no one's way
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slackwater.markers import MarkerStatus
from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.shared.options import channel
from spark_consumer.source.wire.offset import Offsets


@dataclass(frozen=True)
class Alignment:
    """One plan's holds: the partitions planned no records, as (topic, partition) the way
    ``Offsets`` name them, and the largest lead of a partition that can move over the
    reference (None: no reference)."""

    held: frozenset[tuple[str, str]]
    furthest_ahead_ms: int | None

    def summary(self) -> dict[str, Any]:
        """What the offset keeps of it (the source's metrics read it there)."""
        return {"held": len(self.held), "furthest_ahead_ms": self.furthest_ahead_ms}


def align(aligner: MarkerAligner, begin: Offsets, ends: Offsets, max_drift_ms: int) -> Alignment:
    """The partitions to hold in a batch that could read ``begin`` to ``ends``."""
    out_of_orderness_ms = aligner.max_out_of_orderness_ms
    # The ACTIVE partitions of known watermark that can move: the only ones ever held.
    movable: dict[tuple[str, str], int] = {}
    reference: int | None = None
    waited_for = aligner.valve.waits_for
    for topic, partitions in ends.items():
        for partition, end in partitions.items():
            name = channel(topic, partition)
            state = aligner.partitions.get(name)
            if state is None or state.newest_event_ms is None:
                continue  # unknown: read until known, and in no one's way
            if state.status is not MarkerStatus.ACTIVE or not waited_for(name):
                # Partitions the valve does not wait for (IDLE, FINISHED, or ACTIVE again
                # but still behind its output) hold no one back, and are never held: the
                # valve would run past their records while they waited.
                continue
            watermark = state.newest_event_ms - out_of_orderness_ms
            reference = watermark if reference is None else min(reference, watermark)
            if end > begin.get(topic, {}).get(partition, end):
                movable[(topic, partition)] = watermark
    if reference is None or not movable:
        return Alignment(frozenset(), None)
    furthest = max(w - reference for w in movable.values())
    held = frozenset(key for key, w in movable.items() if w > reference + max_drift_ms)
    if len(held) == len(movable):
        # Never a stall: no partition read could move the reference (the ones behind
        # are at their ends), so the furthest behind that can move is read, and those
        # within the drift of it.
        behind = min(movable.values())
        held = frozenset(key for key, w in movable.items() if w > behind + max_drift_ms)
    return Alignment(held, furthest)
