"""One judge of a partition's log that may have changed under us: the emitter, the
source's planner and its readers give Kafka's answers to this function alone, so the
same answers get the same verdict wherever and whenever they are seen (issue 41). The
rules are ``kafka_evidence``'s (docs/semantics.md, "Kafka's evidence"), applied here in
one order:

    an answer for a partition, against what this side saw of it before
    (the highest log end seen or read up to, the leader epoch and topic id it was in):

        the topic's id is another (rule 6)                   -> RECREATED
        said missing, TOLD_IN_A_ROW times in a row (1, 2)    -> DELETED
        said missing fewer times, or no log end, or an
          unknown one (-1001 and the like: rule 5)           -> UNKNOWN
        from an older leader epoch than seen                 -> UNKNOWN (a stale leader)
        below the end seen:
            from a newer leader epoch (rule 3)               -> TRUNCATED
            otherwise                                        -> UNKNOWN (a stale leader)
        at the end seen                                      -> SAME
        past it, or nothing seen before                      -> GREW

UNKNOWN is never a judgment: the side acts as if it had no answer this time (a plan
stands still for that partition, a poll keeps its idle clock). What records a verdict
lost, and why, is ``lost`` (the source's failOnDataLoss then decides what to do).

         log start        position         new log end     end seen
    log:     |==============|.................|...............|
    TRUNCATED (newer epoch):  [max(position, new end), end seen) lost, never read
    DELETED, RECREATED:       [position, end seen) lost, never read
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from slackwater import kafka_evidence


class Verdict(enum.Enum):
    """What one answer says happened to a partition's log."""

    SAME = "same log"
    GREW = "grew"
    TRUNCATED = "truncated"  # by an unclean leader election (rule 3)
    RECREATED = "re-created"  # its topic deleted and made again under its name (rule 6)
    DELETED = "deleted"  # its topic deleted, or re-created with fewer partitions (1, 2)
    UNKNOWN = "unknown"  # no answer, an unknown offset, or a stale leader's

    @property
    def new_log(self) -> bool:
        """The log seen before is gone: what was seen of it no longer applies."""
        return self in (Verdict.TRUNCATED, Verdict.RECREATED, Verdict.DELETED)


class Seen(NamedTuple):
    """What this side saw of a partition before the answer (None: nothing yet). (Named
    tuples: made per partition per plan, half the cost of frozen dataclasses.)"""

    end: int | None = None  # the highest log end seen, or the position read up to
    leader_epoch: int | None = None  # the newest leader epoch an end was answered in
    topic_id: str | None = None  # its topic's id when first seen


class Answer(NamedTuple):
    """One round of answers for a partition (None: not asked, or not answered)."""

    log_end: int | None = None
    leader_epoch: int | None = None
    topic_id: str | None = None
    # Answers in a row, this one included, that its topic or partition does not exist
    # (rule 1: only UNKNOWN_TOPIC_OR_PART, or a partition past its topic's count).
    missing_in_a_row: int = 0


def judge(seen: Seen, answer: Answer) -> Verdict:
    """The verdict on ``answer`` (the module's table, top to bottom)."""
    # Rule 6: another id is another log, whatever its length (a log re-created and
    # already past the old end is as new as an empty one).
    if kafka_evidence.topic_recreated(answer.topic_id, seen.topic_id):
        return Verdict.RECREATED
    # Rules 1 and 2: believed missing only when told so twice in a row.
    if answer.missing_in_a_row >= kafka_evidence.TOLD_IN_A_ROW:
        return Verdict.DELETED
    if answer.missing_in_a_row > 0:
        return Verdict.UNKNOWN
    # Rule 5: an offset Kafka did not give is no answer.
    if answer.log_end is None or not kafka_evidence.known_offset(answer.log_end):
        return Verdict.UNKNOWN
    # An older leader's answer is a stale one, whatever its end (a leader that lost its
    # place answers from its old log for a while).
    if (
        answer.leader_epoch is not None
        and seen.leader_epoch is not None
        and answer.leader_epoch < seen.leader_epoch
    ):
        return Verdict.UNKNOWN
    if seen.end is None:
        return Verdict.GREW
    # Rule 3: a lower end is a truncation only from a newer leader epoch; otherwise a
    # stale leader's, for as long as it lasts.
    if kafka_evidence.lower_end(answer.log_end, seen.end):
        if kafka_evidence.log_end_went_back(
            answer.log_end, seen.end, answer.leader_epoch, seen.leader_epoch
        ):
            return Verdict.TRUNCATED
        return Verdict.UNKNOWN
    return Verdict.SAME if answer.log_end == seen.end else Verdict.GREW


def lost(verdict: Verdict, position: int, seen: Seen, answer: Answer) -> tuple[int, int] | None:
    """The offsets ``[first, end)`` of the old log that a side which read up to
    ``position`` never read and now never will, by ``verdict``; None if none. Only
    records some answer showed can be counted (``seen.end``): any written after the
    last answer seen cannot be, and whoever reports the loss says so."""
    if not verdict.new_log or seen.end is None:
        return None
    first = position
    if verdict is Verdict.TRUNCATED and answer.log_end is not None:
        first = max(position, answer.log_end)  # below the new end, the records are there
    return (first, seen.end) if seen.end > first else None


def after(seen: Seen, answer: Answer, verdict: Verdict) -> Seen:
    """What this side has seen once ``answer`` is judged: a stale or missing answer
    changes nothing; a re-created topic's log is seen from its next answer (this one's
    log end may still be the old log's: ids and log ends come from two requests); a
    truncated log from this answer (a newer leader's); a same or grown log keeps the
    highest end and the newest epoch."""
    if verdict is Verdict.UNKNOWN or verdict is Verdict.DELETED:
        return seen
    topic_id = answer.topic_id if answer.topic_id is not None else seen.topic_id
    if verdict is Verdict.RECREATED:
        return Seen(None, None, topic_id)
    if verdict is Verdict.TRUNCATED:
        return Seen(answer.log_end, answer.leader_epoch, topic_id)
    epoch = seen.leader_epoch
    if answer.leader_epoch is not None and (epoch is None or answer.leader_epoch > epoch):
        epoch = answer.leader_epoch
    end = answer.log_end if seen.end is None or (answer.log_end or 0) > seen.end else seen.end
    return Seen(end, epoch, topic_id)
