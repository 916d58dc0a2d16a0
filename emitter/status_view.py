"""The JSON of the emitter's ``GET /status``: one row per watched partition.

Built from a snapshot and what the service read under its lock, so that a
request never holds the lock while it formats ten thousand rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from emitter.control_topic_watch import ControlTopicFindings
from emitter.lag import Ownership
from emitter.metrics import Snapshot
from slackwater.markers import Marker, TopicPartitionKey


def status_document(
    header: dict[str, Any],
    snap: Snapshot,
    *,
    markers: Mapping[TopicPartitionKey, Marker | None],
    requested: Collection[TopicPartitionKey],
    owners: Ownership | None,
    assignment: dict[str, list[TopicPartitionKey]] | None,
    control_topic: ControlTopicFindings | None = None,
) -> dict[str, Any]:
    """``header`` (who the emitter is) first, then the group and the partitions:
    ``markers`` the last marker of each partition, ``requested`` those whose finish was
    requested, ``owners`` and ``assignment`` the group's (None without a group).
    ``control_topic``, the watch's findings (control_topic_watch.py), makes the header's
    ``control_topic`` an object: its name, whether it is there, its id, partitions,
    cleanup.policy, retention and how often it was lost."""
    partitions = []
    for row in snap.partitions:
        marker = markers.get((row.topic, row.partition))
        partitions.append(
            {
                "topic": row.topic,
                "partition": row.partition,
                "status": row.status.value,
                "offset": marker.offset if marker else None,
                "since": _iso(marker.emitted_at) if marker else None,
                "marker_emitter_id": marker.emitter_id if marker else None,
                "marker_epoch": marker.epoch if marker else None,
                "log_end_offset": row.log_end_offset,
                "still_seconds": round(row.still_seconds, 3),
                "lag_offsets": row.lag_offsets,
                "lag_seconds": None if row.lag_seconds is None else round(row.lag_seconds, 3),
                "finish_requested": (row.topic, row.partition) in requested,
                "owner": owners.owners.get((row.topic, row.partition)) if owners else None,
            }
        )
    if control_topic is not None:
        header = {**header, "control_topic": control_topic.as_status()}
    return {
        **header,
        "missing_topics": snap.missing_topics,
        "partitions_without_owner": snap.partitions_without_owner,
        "members_without_partitions": snap.members_without_partitions,
        # The group's members and the watched partitions each owns (DESCRIBE GROUP).
        "members": None
        if assignment is None
        else {
            member: sorted(f"{topic}:{partition}" for topic, partition in owned)
            for member, owned in sorted(assignment.items())
        },
        "unowned_partitions": None
        if owners is None
        else sorted(f"{t}:{p}" for t, p in owners.partitions_without_owner),
        "partitions": partitions,
    }


def status_time(wall_ms: int | None) -> str | None:
    """A wall time as ``/status`` writes it (ISO 8601, UTC, milliseconds)."""
    return _iso(wall_ms)


def _iso(wall_ms: int | None) -> str | None:
    if wall_ms is None:
        return None
    return datetime.fromtimestamp(wall_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
