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
    reference    = min watermark(p) over ACTIVE p with a known watermark
                   (IDLE and FINISHED partitions hold no one back, as in the valve)
    held(p)      = p can move (records between its read position and its end)
                   and watermark(p) is known and > reference + drift
                   (unknown: read until known)
    no stall     : when every p that can move is held, the reference is the smallest
                   watermark among those that can move (the furthest behind is read)

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
    # Known watermarks of the partitions that can move; the reference's candidates.
    movable: dict[tuple[str, str], int] = {}
    reference: int | None = None
    unknown_moves = False  # a partition of unknown event time can move: it is read
    for topic, partitions in ends.items():
        for partition, end in partitions.items():
            state = aligner.partitions.get(channel(topic, partition))
            can_move = end > begin.get(topic, {}).get(partition, end)
            if state is None or state.newest_event_ms is None:
                unknown_moves = unknown_moves or can_move
                continue  # unknown: read until known, and in no one's way
            watermark = state.newest_event_ms - out_of_orderness_ms
            # IDLE and FINISHED partitions hold no one back (the valve leaves them out).
            if state.status is MarkerStatus.ACTIVE:
                reference = watermark if reference is None else min(reference, watermark)
            if can_move:
                movable[(topic, partition)] = watermark
    if reference is None:
        return Alignment(frozenset(), None)
    furthest = max((w - reference for w in movable.values()), default=None)
    held = frozenset(key for key, w in movable.items() if w > reference + max_drift_ms)
    if movable and len(held) == len(movable) and not unknown_moves:
        # Never a stall: every partition that can move is held (the ones behind are
        # at their ends), so the furthest behind that can move is read, and those
        # within the drift of it.
        behind = min(movable.values())
        held = frozenset(key for key, w in movable.items() if w > behind + max_drift_ms)
    return Alignment(held, furthest)
