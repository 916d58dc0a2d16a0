"""A range being read on an executor, and records gone from under it: retention, a
deleted or re-created topic, a truncated log (judged by ``slackwater.kafka_evidence`` and
``slackwater.log_verdict``, as the planner and the emitter judge them), followed as the
one data-loss policy says (``shared/data_loss.py``: failOnDataLoss)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from slackwater import kafka_clients, kafka_evidence, list_offsets, log_verdict
from slackwater.log_verdict import Answer, Seen, Verdict
from slackwater.markers import TopicPartitionKey
from spark_consumer.source.shared import data_loss
from spark_consumer.source.shared.data_loss import Cause, Loss
from spark_consumer.source.shared.options import READER, READER_CLIENT, SourceError, SourceOptions

log = logging.getLogger("spark_consumer.source.executor.readers")
# Readers read by assignment and commit nothing; librdkafka still finds this group's
# coordinator (docs/deploy.md's ACLs allow Describe on it).
READER_GROUP = "slackwater-reader"
# A range's partition: (topic, partition).


@dataclass
class Reading:
    """One range being read: the next offset to read, and records found gone."""

    topic: str
    partition: int
    start: int
    end: int
    # Its topic's id and its partition's leader epoch when the range was planned (None:
    # not known then).
    topic_id: str | None = None
    leader_epoch: int | None = None
    position: int = -1
    lost: int = 0
    # Answers in a row that its topic or partition does not exist.
    missing: kafka_evidence.MissingAnswers = field(default_factory=kafka_evidence.MissingAnswers)
    # When the position last moved (monotonic s): a range still for GONE_CHECK_S is
    # asked after (are its records gone?).
    moved_at: float = 0.0

    def __post_init__(self) -> None:
        self.position = self.start
        self.moved_at = time.monotonic()

    def move_to(self, position: int) -> None:
        if position > self.position:
            self.position = position
            self.moved_at = time.monotonic()

    @property
    def done(self) -> bool:
        return self.position >= self.end


def follow_gone(
    consumer: Any,
    options: SourceOptions,
    open_ranges: dict[TopicPartitionKey, Reading],
    stalled: dict[TopicPartitionKey, Any],
) -> bool:
    """Ranges whose records are gone move past them (failOnDataLoss=false) or stop the
    query; a range that failed with its records there fails the task. One metadata
    request per topic: while the broker cannot answer, nothing is asked per partition.
    True if a range moved.

    Records are gone only on Kafka's evidence (kafka_evidence): the topic or partition
    said missing twice (rules 1, 2), or the fetch itself out of range (rule 7), then the
    log start and end say how far (rule 4). A range that is only quiet, or one low
    watermark answer, is never that: a leader moving answers low once."""
    moved = False
    fetch_again: list[Reading] = []
    described: dict[str, Any] = {}
    ids_now = _TopicIdsNow(options)
    for key, failure in stalled.items():
        current = open_ranges.get(key)
        if current is None or current.done:
            continue  # read whole (in the consume call that brought the error): nothing lost
        if current.topic not in described:
            described[current.topic] = _describe(consumer, current.topic, options.request_timeout_s)
        out_of_range = failure is not None and kafka_evidence.fetch_out_of_range(failure)
        gone = _gone(consumer, current, described[current.topic], out_of_range, ids_now)
        if gone is not None:
            loss = Loss(current.topic, current.partition, current.position, *gone, planned=True)
            current.lost += data_loss.report(options, loss, log)
            current.move_to(gone[0])
            moved = True
        elif out_of_range:
            # The log start and end do not bear the fetch out (a stale answer): fetched
            # again from the position, which fetches the evidence again.
            log.info("%s[%d] at %d: %s; fetched again", key[0], key[1], current.position, failure)
            fetch_again.append(current)
        elif failure is not None:
            raise options.refused(
                failure,
                f"read topic {current.topic} (partition {current.partition})",
                READER_GROUP,
                READER,
            ) or SourceError(
                f"reading {current.topic}[{current.partition}] at {current.position}: {failure}"
            )
    if moved or fetch_again:
        # Fetching starts again where each range now is (a partition whose records were
        # out of range stopped fetching).
        consumer.assign(
            [TopicPartition(r.topic, r.partition, r.position) for r in open_ranges.values()]
        )
    return moved


def _gone(
    consumer: Any, current: Reading, described: Any, out_of_range: bool, ids_now: _TopicIdsNow
) -> tuple[int, Cause] | None:
    """Where the records gone from the range's position end, and why; None if none are
    (or the broker cannot tell yet)."""
    timeout_s = ids_now.timeout_s
    until, missing = _gone_until(consumer, current, described, timeout_s, out_of_range)
    gone: tuple[int, Cause] | None = None
    if until is not None:  # (a cause None: went back, re-created or truncated)
        gone = (until[0], until[1] or _went_back_cause(current, ids_now))
    if gone is None and missing is False and not out_of_range:
        gone = _new_log_under(consumer, current, ids_now, timeout_s)
    if current.missing.answer(missing):  # (kafka_evidence rule 2: told twice)
        gone = (current.end, Cause.DELETED)  # the topic or partition is gone, the range too
    return gone


class _TopicIdsNow:
    """Topic ids asked of the broker (DescribeTopics), through an Admin client made only
    when one is asked for: a reader needs one only when a range stays below its end."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self.timeout_s = options.request_timeout_s
        self._admin: Any = None
        self._ids: dict[str, str | None] = {}

    @property
    def admin(self) -> Any:
        if self._admin is None:  # the reader's settings; it never creates a topic
            self._admin = kafka_clients.admin_client(
                READER_CLIENT, self._options.bootstrap_servers, self._options.kafka_config
            )
        return self._admin

    def __call__(self, topic: str) -> str | None:
        if topic not in self._ids:
            timeout_s = self._options.request_timeout_s
            self._ids[topic] = kafka_clients.topic_ids(self.admin, [topic], timeout_s).get(topic)
        return self._ids[topic]

    def log_end(self, topic: str, partition: int) -> tuple[int, int | None] | None:
        """The partition's log end and the leader epoch one ListOffsets answer carries
        (the consumer's watermark answer has no epoch); None without an answer."""
        timeout_s = self._options.request_timeout_s
        request = list_offsets.Request([(topic, partition)], OffsetSpec.latest())  # type: ignore[no-untyped-call]
        try:
            answers = kafka_clients.answer(
                list_offsets.submit(self.admin, request, timeout_s=timeout_s), timeout_s
            )
        except KafkaException:
            return None
        end = answers.get((topic, partition))
        if not isinstance(end, int):
            return None  # an error for the partition (an unknown offset is one: rule 5)
        return end, answers.leader_epochs.get((topic, partition))


def _new_log_under(
    consumer: Any, split: Reading, ask: _TopicIdsNow, timeout_s: float
) -> tuple[int, Cause] | None:
    """The range's end and why, if its log is a new one since it was planned
    (``slackwater.log_verdict``: RECREATED, or TRUNCATED at or below the position): the
    log ends at or before the position, below the planned end, so nothing more of the
    range can come and no fetch will ever say out of range. Any other verdict (a stale
    leader's lower end above all) leaves the range waiting."""
    if split.topic_id is None:
        return None  # planned without the id (a replay before any plan): cannot tell
    try:
        _, log_end = consumer.get_watermark_offsets(
            TopicPartition(split.topic, split.partition), timeout=timeout_s
        )
    except KafkaException:
        return None
    if not (log_end <= split.position and kafka_evidence.lower_end(int(log_end), split.end)):
        return None  # (the cheap look first: the consumer's cached watermark)
    # The end and the epoch of one answer: a stale end beside a fresh epoch is no proof.
    end, epoch = ask.log_end(split.topic, split.partition) or (None, None)
    seen = Seen(split.end, split.leader_epoch, split.topic_id)
    verdict = log_verdict.judge(seen, Answer(end, epoch, ask(split.topic)))
    if verdict is Verdict.RECREATED or (
        verdict is Verdict.TRUNCATED and end is not None and end <= split.position
    ):
        return split.end, _CAUSES[verdict]
    return None


def _went_back_cause(split: Reading, ask: _TopicIdsNow) -> Cause:
    """Why a fetch found the position past a log that ends below the planned end (rule
    7, then rule 4's WENT_BACK): another topic id says re-created (rule 6); the same one,
    or none known, a truncation."""
    recreated = kafka_evidence.topic_recreated(ask(split.topic), split.topic_id)
    return Cause.RECREATED if recreated else Cause.TRUNCATED


_CAUSES = {Verdict.RECREATED: Cause.RECREATED, Verdict.TRUNCATED: Cause.TRUNCATED}


# What _describe answers when the broker cannot tell now.
_CANNOT_TELL = object()


def _describe(consumer: Any, topic: str, timeout_s: float) -> Any:
    """The broker's metadata of one topic (None: not listed), or _CANNOT_TELL."""
    try:
        return consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return _CANNOT_TELL


def _gone_until(
    consumer: Any, split: Reading, described: Any, timeout_s: float, out_of_range: bool
) -> tuple[tuple[int, Cause | None] | None, bool | None]:
    """Where the records gone from the range's position on end (``[position, x)``) and
    why (None: the offsets went back, which the caller tells apart), or None when they
    are there (kafka_evidence rule 4, asked only when the fetch was ``out_of_range``,
    rule 7: retention moved the log start past the position, or the offsets went back).
    And whether the broker says the topic (or partition) does not exist (rule 1), which
    the caller believes only when told twice (rule 2); None if it could not tell."""
    if described is _CANNOT_TELL:
        return None, None  # the broker cannot tell now: keep reading until the timeout
    if kafka_evidence.partition_missing(described, split.partition):
        # Nothing to ask of a partition the broker does not know: asking would wait for
        # a leader until the timeout, or get an answer from a log on its way out.
        return None, True
    if not out_of_range:
        return None, False  # there, and no evidence that anything is gone
    try:
        log_start, log_end = consumer.get_watermark_offsets(
            TopicPartition(split.topic, split.partition), timeout=timeout_s
        )
    except KafkaException:
        return None, None
    if not (kafka_evidence.known_offset(log_start) and kafka_evidence.known_offset(log_end)):
        return None, None  # librdkafka has no answer (kafka_evidence rule 5)
    # The range was planned up to its end: records below it existed.
    gone = kafka_evidence.records_gone(split.position, int(log_start), int(log_end), split.end)
    if gone is kafka_evidence.Gone.RETENTION:
        return (min(int(log_start), split.end), Cause.RETENTION), False  # (or DeleteRecords)
    if gone is kafka_evidence.Gone.WENT_BACK:
        return (split.end, None), False  # re-created or truncated: the rest is not coming
    return None, False
