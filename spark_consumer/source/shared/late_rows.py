"""The rows a job's aggregation will drop, written aside by the readers, exactly once.

A window aggregation drops a row whose windows have all ended by the watermark Spark
judges the row's batch's late input by (Spark's rule: a window is over when its end <=
that watermark; for a session window, the row's own session [t, t + gap) is what is
checked on arrival). The reader knows both the row's event time and that watermark
(``splits.late_events_watermark``), so it can tell, and write the row aside with its
reason, without a second read of the topic.

Exactly once by construction: one file per source range, named by the range; a task
retry or a replay of the batch reads the same range with the same threshold and
writes the same file again. A range with nothing dropped writes nothing.

    threshold (the watermark late input is judged by)
                       |
    window rule 10 s:  [0 ------ 10)[10 ----- 20)[20 --
    row at  8 s        |  dropped: its window ended at 10 <= threshold 12
    row at 11 s        |  kept: its window ends at 20 > 12 (counted, though 11 < 12)
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from slackwater.settings import parse_duration_ms

RULES = "late, window:<size>[:<slide>] or session:<gap> (e.g. window:10s, session:30s)"


@dataclass(frozen=True)
class LateRule:
    """When the job's aggregation drops a row, from its event time and the threshold."""

    kind: str  # "late", "window" or "session"
    size_ms: int = 0
    slide_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> LateRule:
        kind, _, rest = text.strip().partition(":")
        try:
            if kind == "late" and not rest:
                return cls("late")
            if kind == "window":
                size, _, slide = rest.partition(":")
                size_ms = parse_duration_ms(size)
                slide_ms = parse_duration_ms(slide) if slide else size_ms
                if 0 < slide_ms <= size_ms:
                    return cls("window", size_ms, slide_ms)
            if kind == "session":
                gap_ms = parse_duration_ms(rest)
                if gap_ms > 0:
                    return cls("session", gap_ms)
        except ValueError:
            pass
        raise ValueError(f"not a late rule ({RULES}): {text!r}")

    def dropped(self, event_ms: int, threshold_ms: int) -> bool:
        if self.kind == "window":
            # The last window holding the row starts at the last slide boundary <= t.
            last_end = (event_ms // self.slide_ms) * self.slide_ms + self.size_ms
            return last_end <= threshold_ms
        if self.kind == "session":
            return event_ms + self.size_ms <= threshold_ms
        return event_ms < threshold_ms  # "late": the source's own `late` column


LATE_ONLY = LateRule("late")


@dataclass(frozen=True)
class DroppedRow:
    offset: int
    event_time_ms: int | None
    reason: str


def range_file_name(topic: str, partition: int, start: int, end: int) -> str:
    return f"{topic}-{partition}-{start}-{end}.json"


def write_range(
    directory: str,
    rows: Sequence[DroppedRow],
    *,
    topic: str,
    partition: int,
    start: int,
    end: int,
    threshold_ms: int,
) -> None:
    """One JSON-lines file for the range (any pyarrow filesystem: local, HDFS, S3...),
    written aside and moved into place, so a reader of the directory never sees half."""
    from pyarrow import fs

    if not rows:
        return
    filesystem, root = fs.FileSystem.from_uri(_as_uri(directory))
    filesystem.create_dir(root, recursive=True)
    applied = None if threshold_ms <= -(2**62) else _iso(threshold_ms)
    lines = "".join(
        json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "offset": row.offset,
                "event_time": None if row.event_time_ms is None else _iso(row.event_time_ms),
                "reason": row.reason,
                "watermark": applied,
            },
            separators=(",", ":"),
        )
        + "\n"
        for row in rows
    ).encode()
    final = f"{root}/{range_file_name(topic, partition, start, end)}"
    temporary = f"{root}/.{uuid.uuid4().hex}.tmp"
    with filesystem.open_output_stream(temporary) as out:
        out.write(lines)
    filesystem.move(temporary, final)


def _as_uri(path: str) -> str:
    return path if "://" in path else "file://" + os.path.abspath(path)


def _iso(ms: int) -> str:
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms after 1970"  # beyond what a datetime holds (years 1 to 9999)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
