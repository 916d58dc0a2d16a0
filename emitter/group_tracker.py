"""The watched consumer group as the polls saw it, for lag and ownership.

The emitter's markers do not depend on the group: this is what metrics and
``/status`` show of it. Each poll's answers update the committed offsets, the
log-end timelines that lag in seconds is read from, the members' assignment and
who owns each watched partition. Not locked: the service reads and updates it
under its own lock.

A partition the poll found on a new log (its topic re-created, its log truncated:
``PollAnswers.new_logs``) starts its timeline again from the new log's answer: the old
log's points would date the new log's offsets (a re-created topic past the old end
would have its lag read off the old log's times).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from emitter.known_ends import NO_NEW_LOG, NewLogs
from emitter.lag import LogEndTimeline, LogEndTimelines, Ownership, lag_offsets, ownership
from emitter.observer import PollAnswers
from slackwater.markers import TopicPartitionKey


class GroupTracker:
    """Committed offsets, log-end timelines, assignment and ownership of one group."""

    def __init__(self) -> None:
        self.timelines = LogEndTimelines()
        self.committed: dict[TopicPartitionKey, int] = {}
        self.ownership: Ownership | None = None
        self._ownership_of: set[TopicPartitionKey] = set()  # the partitions it was derived for
        self.assignment: dict[str, list[TopicPartitionKey]] | None = None

    def record(
        self, answers: PollAnswers, watched: Collection[TopicPartitionKey], wall_ms: int
    ) -> None:
        """Takes in one poll's answers; a failed request leaves what the last one said."""
        self.timelines.record_poll(answers.log_end_offsets, wall_ms)
        if answers.new_logs is not NO_NEW_LOG:
            self._start_again(answers.new_logs, answers.log_end_offsets, wall_ms)
        if answers.committed_offsets is not None:
            self.committed = answers.committed_offsets
        if answers.assignment is not None:
            # Ownership changes with the assignment or the watched partitions only.
            if answers.assignment != self.assignment or watched != self._ownership_of:
                self.ownership = ownership(watched, answers.assignment)
                self._ownership_of = set(watched)
            self.assignment = answers.assignment

    def _start_again(
        self, new_logs: NewLogs, log_ends: Mapping[TopicPartitionKey, int], wall_ms: int
    ) -> None:
        """The timelines of partitions on a new log hold only this poll's answer, if any
        (a re-created topic's is not taken in the poll that finds it: its next one starts
        the timeline, as a partition first seen)."""
        timelines = self.timelines.timelines
        renewed = set(new_logs.truncated)
        if new_logs.recreated:
            renewed |= {key for key in timelines if key[0] in new_logs.recreated}
        for key in renewed:
            end = log_ends.get(key)
            if end is None:
                timelines.pop(key, None)  # (not in this poll: the next one adds it afresh)
            else:
                timelines[key] = LogEndTimeline()
                timelines[key].record(wall_ms, end)

    def lags(
        self, key: TopicPartitionKey, log_end: int | None, now_ms: int
    ) -> tuple[int | None, float | None]:
        """The group's lag on a partition in offsets and in seconds (None: not known)."""
        committed = self.committed.get(key)
        return (
            lag_offsets(log_end, committed) if log_end is not None else None,
            self.timelines.lag_seconds(key, committed, now_ms) if committed is not None else None,
        )
