"""Consumer-group lag in offsets and in seconds, and partition ownership.

Lag in seconds is estimated the way kafka-lag-exporter does it: the emitter
keeps, per partition, a timeline of (wall time, log end offset) points, and
the lag of a committed offset C is "now" minus the interpolated time at which
the log end passed C:

    log end
      130 |                         * (t3)
          |                       /
      100 |  *-----------------*  (t1 .. t2: flat, both ends kept)
          | /        C = 115 lies between t2 and t3: t(C) = t2 + (t3 - t2) * 15 / 30
       70 * (t0)
          +------------------------------------ wall time

Runs of equal log ends keep only their first and last point, so the table
stays small and the interpolation is exact to one poll. A flat run's last point
is written only when the run ends (the log end moves, or a poll does not read
the partition): a poll costs in proportion to the partitions whose log end moved.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slackwater import kafka_evidence
from slackwater.markers import TopicPartitionKey


@dataclass
class LogEndTimeline:
    """(wall_ms, log_end_offset) points of one partition; log ends never decrease."""

    max_points: int = 512
    wall_ms: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def record(self, wall_ms: int, log_end_offset: int) -> None:
        if self.offsets and self.offsets[-1] == log_end_offset and self.wall_ms[-1] == wall_ms:
            return  # the same point again
        if self.offsets and kafka_evidence.lower_end(log_end_offset, self.offsets[-1]):
            # A lower end: the log went back (topic re-created), or a stale leader's
            # answer; either way the timeline starts again from it (it only dates lag,
            # and the observer's next answers rebuild it; no marker reads it).
            self.wall_ms.clear()
            self.offsets.clear()
        if (
            len(self.offsets) >= 2
            and self.offsets[-1] == log_end_offset
            and self.offsets[-2] == log_end_offset
        ):
            self.wall_ms[-1] = wall_ms  # extend the flat run: keep its first and last point
            return
        self.wall_ms.append(wall_ms)
        self.offsets.append(log_end_offset)
        if len(self.offsets) > self.max_points:
            del self.wall_ms[0], self.offsets[0]

    def lag_seconds(self, committed_offset: int, now_ms: int) -> float | None:
        """Seconds since the log end passed ``committed_offset``; None with no points.

        0 when the group is caught up. An offset older than the first point
        gives the time since that point: a lower bound.
        """
        if not self.offsets:
            return None
        if committed_offset >= self.offsets[-1]:
            return 0.0
        # First point whose log end is beyond the committed offset.
        index = bisect.bisect_right(self.offsets, committed_offset)
        if index == 0:
            return max(0.0, (now_ms - self.wall_ms[0]) / 1000)
        before_offset, after_offset = self.offsets[index - 1], self.offsets[index]
        before_ms, after_ms = self.wall_ms[index - 1], self.wall_ms[index]
        share = (committed_offset - before_offset) / (after_offset - before_offset)
        passed_ms = before_ms + share * (after_ms - before_ms)
        return max(0.0, (now_ms - passed_ms) / 1000)


@dataclass
class LogEndTimelines:
    """The timelines of every watched partition, recorded from whole polls."""

    timelines: dict[TopicPartitionKey, LogEndTimeline] = field(default_factory=dict)
    _previous: dict[TopicPartitionKey, int] = field(default_factory=dict)
    _previous_wall_ms: int = 0

    def record_poll(self, log_ends: Mapping[TopicPartitionKey, int], wall_ms: int) -> None:
        """What one poll read. Only moved log ends are written, each with the end of the
        flat run before it (the previous poll); a partition this poll did not read gets
        its flat run's end now, as it would have had it been written every poll."""
        previous, previous_wall_ms = self._previous, self._previous_wall_ms
        for key, log_end in log_ends.items() - previous.items():
            timeline = self.timelines.get(key)
            if timeline is None:
                timeline = self.timelines[key] = LogEndTimeline()
            before = previous.get(key)
            if before is not None:  # the flat run's end (record skips a repeated point)
                timeline.record(previous_wall_ms, before)
            timeline.record(wall_ms, log_end)
        for key in previous.keys() - log_ends.keys():
            self.timelines[key].record(previous_wall_ms, previous[key])
        self._previous, self._previous_wall_ms = dict(log_ends), wall_ms

    def lag_seconds(
        self, key: TopicPartitionKey, committed_offset: int, now_ms: int
    ) -> float | None:
        """LogEndTimeline.lag_seconds of one partition (None before it was read)."""
        timeline = self.timelines.get(key)
        return None if timeline is None else timeline.lag_seconds(committed_offset, now_ms)


def lag_offsets(log_end_offset: int, committed_offset: int | None) -> int | None:
    """Records the group has not consumed yet (None when it never committed, or its
    offset is none Kafka gave: rule 5)."""
    if committed_offset is None or not kafka_evidence.known_offset(committed_offset):
        return None
    return max(0, log_end_offset - committed_offset)


@dataclass(frozen=True)
class Ownership:
    partitions_without_owner: frozenset[TopicPartitionKey]
    members_without_partitions: frozenset[str]
    # Which member owns each watched partition that has an owner.
    owners: Mapping[TopicPartitionKey, str] = field(default_factory=dict)


def ownership(
    watched: Iterable[TopicPartitionKey],
    assignment: Mapping[str, Iterable[TopicPartitionKey]],
) -> Ownership:
    """Which watched partitions no group member owns, and which members own nothing watched."""
    owners: dict[TopicPartitionKey, str] = {}
    idle_members: set[str] = set()
    watched_set = set(watched)
    for member, partitions in assignment.items():
        mine = watched_set.intersection(partitions)
        owners.update(dict.fromkeys(mine, member))
        if not mine:
            idle_members.add(member)
    return Ownership(frozenset(watched_set - owners.keys()), frozenset(idle_members), owners)
