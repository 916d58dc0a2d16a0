"""What Kafka's answers mean: each judgment slackwater makes from the broker's answers,
written once (docs/semantics.md, "Kafka's evidence").

The emitter, the source's planner and its readers ask the broker different questions,
through different clients; they judge the answers by these rules alone, so that a rule
changes in one place. Each rule is numbered as in docs/semantics.md (rule 5, "unknown is
not an offset", is applied first wherever an answer is read: ``list_offsets`` turns it
into the error it is).

A position is the next offset to read; ``known_end`` is a log end this side has seen
(or read up to) before, so records below it existed.

            log start           position           known end
    log:        |=================|......................|
    retention:                 |<- log start moved past the position: [position, start) gone
    went back:      |<- log end at or below the position, and below the known end:
                        [position, known end) gone (the topic re-created or truncated)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

# Rule 1: a topic does not exist only when the broker says UNKNOWN_TOPIC_OR_PART. A
# refusal (TOPIC_AUTHORIZATION_FAILED, said of a topic there or not), a timeout or no
# leader is not that: a deleted topic's partitions become FINISHED for good.
_MISSING_TOPIC = KafkaError.UNKNOWN_TOPIC_OR_PART
# What a consumer reading a topic that does not exist (any more) reports, as events:
# the broker's code, or librdkafka's own for a topic or partition its metadata lacks.
_MISSING_TOPIC_EVENTS = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)

# Rule 2: believe that a topic (or partition) does not exist only when told so this many
# times in a row: a broker just behind on metadata says so once of a topic that exists.
TOLD_IN_A_ROW = 2


def says_topic_missing(error: KafkaError | None) -> bool:
    """Rule 1, for an answer to a request naming the topic (describe, metadata)."""
    return error is not None and error.code() == _MISSING_TOPIC


def topic_missing(described: Any) -> bool:
    """Rule 1, for one topic of a metadata answer (``list_topics(topic).topics.get``):
    not listed at all, or listed with UNKNOWN_TOPIC_OR_PART."""
    return described is None or says_topic_missing(described.error)


def partition_missing(described: Any, partition: int) -> bool:
    """Rule 1 for a partition: its topic is missing, or the topic is described without
    an error and without this partition (re-created with fewer)."""
    return topic_missing(described) or (
        described.error is None and partition not in described.partitions
    )


def missing_topic_event(error: KafkaError) -> bool:
    """Rule 1, for an error event a consumer reports while reading a partition."""
    return error.code() in _MISSING_TOPIC_EVENTS


@dataclass
class MissingAnswers:
    """Rule 2: answers in a row that a topic (or partition) does not exist."""

    in_a_row: int = 0

    def answer(self, missing: bool | None) -> bool:
        """Takes one answer (None: the broker could not tell, the count stands); True
        once the absence is to be believed."""
        if missing is not None:
            self.in_a_row = self.in_a_row + 1 if missing else 0
        return self.in_a_row >= TOLD_IN_A_ROW


class Gone(enum.Enum):
    """Why records past a position are gone (rule 4)."""

    # Retention (or DeleteRecords) moved the log start past the position.
    RETENTION = "retention"
    # The offsets went back: the topic was re-created or truncated.
    WENT_BACK = "went back"


def lower_end(log_end: int, known_end: int) -> bool:
    """A log end below one seen before: an answer to look into (rules 3 and 6), never a
    judgment by itself. A leader that lost its place (killed, partitioned away) can
    answer from its old log for a while; the planner once took one such answer, held for
    5 s, for a topic re-created, and read a whole partition twice."""
    return known_offset(log_end) and log_end < known_end


def log_end_went_back(
    log_end: int, known_end: int, leader_epoch: int | None, known_leader_epoch: int | None
) -> bool:
    """Rule 3: a log end below a known end went back (truncated by an unclean leader
    election) only when the answer comes from a newer leader epoch than any the known
    end was seen in. Within one topic Kafka's log end never moves down otherwise: a new
    leader from the in-sync replicas holds every record below the old high watermark,
    and while its own is behind it answers OFFSET_NOT_AVAILABLE (KIP-207), not a lower
    end. So a lower end from the same or an older epoch is a stale leader's, and one
    without an epoch tells nothing: either stands still, for as long as it lasts. (A
    re-created topic is rule 6: its epochs start again.)"""
    return (
        lower_end(log_end, known_end)
        and leader_epoch is not None
        and known_leader_epoch is not None
        and leader_epoch > known_leader_epoch
    )


def topic_recreated(topic_id: str | None, known_topic_id: str | None) -> bool:
    """Rule 6: a topic was deleted and made again under its name when its id differs
    from the one its known offsets were seen in (DescribeTopics gives it; Kafka never
    reuses one). Every record this side had not read of the old one is gone; the new one
    is read from its start. Either id unknown tells nothing."""
    return topic_id is not None and known_topic_id is not None and topic_id != known_topic_id


# Rule 7: what a consumer's fetch says of a position outside the log of the partition's
# current leader (a fetch carries the leader epoch, so a stale leader fences it instead):
# the broker's OFFSET_OUT_OF_RANGE, librdkafka's own under auto.offset.reset=error, and
# its log truncation found by KIP-320's validation after a leader change.
_OUT_OF_RANGE_EVENTS = frozenset(
    {KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET, KafkaError._LOG_TRUNCATION}
)


def fetch_out_of_range(error: KafkaError) -> bool:
    """Rule 7: records past a reader's position may be gone only when its own fetch says
    the position is out of range; a partition that stays quiet, or one low watermark
    answer, is not that (a leader moving answers low once). Rule 4 then says how far."""
    return error.code() in _OUT_OF_RANGE_EVENTS


def records_gone(position: int, log_start: int, log_end: int, known_end: int) -> Gone | None:
    """Rule 4: whether the records from ``position`` on are gone, and why (the module's
    timeline); None while they are there or may still come. Asked only once Kafka has
    said the position is out of its log (rule 7, or ends that cannot be stale: asked of
    the leader with ``wait_for_all``), since one stale answer alone would say WENT_BACK.

    * RETENTION: ``[position, log_start)`` is gone, the records after it are there.
    * WENT_BACK: ``[position, known_end)`` is gone; the log ends at or before the
      position (so nothing there is to be read) and below where records were seen.

    An unknown log start or end (rule 5) tells nothing: None.
    """
    if not (known_offset(log_start) and known_offset(log_end)):
        return None
    if log_start > position:
        return Gone.RETENTION
    if log_end <= position and lower_end(log_end, known_end):
        return Gone.WENT_BACK
    return None


def known_offset(offset: int) -> bool:
    """Rule 5: an offset Kafka did not give is not an offset. librdkafka answers its
    logical offsets where it has no answer (-1001 "invalid": no leader reached, a request
    not sent; -1 end; -2 beginning), for the specs slackwater asks (earliest, latest) and
    for a consumer's watermarks: never a log end, a log start or a position to judge
    by."""
    return offset >= 0


# Not an answer: a request the broker did not answer (the connection lost, no broker
# reached, the request timed out, the controller moved) tells nothing of what it asked.
_NOT_ANSWERED = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
    }
)


def not_answered(error: KafkaError) -> bool:
    """A request's error that is no answer (or one Kafka calls retriable): the request is
    asked again, never judged. Seen: the planner's CreateTopics of its progress topic
    failed with _TRANSPORT while a cluster's node went down, and ended the query at its
    start instead of waiting for the broker."""
    return error.code() in _NOT_ANSWERED or bool(error.retriable())
