"""The emitter's state as ``/metrics`` and ``/status`` read it, built under its lock."""

from __future__ import annotations

from emitter.detector import Detector
from emitter.group_tracker import GroupTracker
from emitter.metrics import PartitionRow, Snapshot


def snapshot_of(
    detector: Detector | None,
    group: GroupTracker,
    group_name: str | None,
    now_ms: int,
    *,
    rows: bool,
) -> Snapshot:
    """One row per partition of ``detector`` (none unless ``rows``); ``detector`` None
    for an emitter that is not the active one: it reports no partition, as it publishes
    none of their markers (terms.py)."""
    partitions = detector.partitions if detector is not None else {}
    rows_out = []
    for (topic, partition), state in sorted(partitions.items()) if rows else []:
        lag, lag_seconds = group.lags((topic, partition), state.log_end_offset, now_ms)
        rows_out.append(
            PartitionRow(
                topic=topic,
                partition=partition,
                status=state.status,
                log_end_offset=state.log_end_offset,
                still_seconds=state.still_s,
                lag_offsets=lag,
                lag_seconds=lag_seconds,
            )
        )
    owners, assignment = group.ownership, group.assignment
    return Snapshot(
        group=group_name,
        partitions=rows_out,
        watched_partitions=len(partitions),
        missing_topics=sorted(detector.missing_topics) if detector is not None else [],
        partitions_without_owner=(len(owners.partitions_without_owner) if owners else None),
        members_without_partitions=(len(owners.members_without_partitions) if owners else None),
        group_members=len(assignment) if assignment is not None else None,
        unlisted_partitions=len(detector.held) if detector is not None else 0,
        unlisted_partitions_dropped=detector.held_dropped if detector is not None else 0,
    )
