"""Version 1 of the source's offset, read (never written): the offset logs of queries
checkpointed before version 2 (issue 22), in every shape main wrote (tests/data). It
imports nothing of the offset but its error (``offset_error``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_consumer.source.wire.offset_error import OffsetFormatError


def offsets(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}


def aligner(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1's aligner snapshot as the aligner restores it: rows by name (e3eeae9 to
    8404e02) by place (2dd89a8 on); counters 0d924d2 added start at 0, as they did then."""
    rows = []
    for row in snapshot["partitions"]:
        if len(row) == 2 and isinstance(row[1], Mapping):
            named = row[1]  # its restore read a missing last_data_ms as None: no data yet
            fields = ("status", "read_position", "max_record_offset", "newest_event_ms")
            values = [named[f] for f in (*fields, "epoch", "idle_offset")]
            rows.append([row[0], *values, named.get("last_data_ms"), list(named["pending"])])
        elif len(row) == 9:
            rows.append(row)
        else:
            raise OffsetFormatError(f"aligner row {row[:1]} has {len(row)} values, not 9")
    return {**snapshot, "partitions": rows}
