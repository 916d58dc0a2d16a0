"""A range being read on an executor, and records gone from under it: retention, a
deleted or re-created topic (judged by ``slackwater.kafka_evidence``, as the planner
and the emitter judge them), followed as the option failOnDataLoss says."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from slackwater import kafka_clients, kafka_evidence, list_offsets
from slackwater.markers import TopicPartitionKey
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
        gone_until, missing = _gone_until(
            consumer, current, described[current.topic], options.request_timeout_s, out_of_range
        )
        if gone_until is None and missing is False and not out_of_range:
            gone_until = _recreated_under(consumer, current, ids_now, options.request_timeout_s)
        if current.missing.answer(missing):  # (kafka_evidence rule 2: told twice)
            gone_until = current.end  # the topic or partition is gone, the range too
        if gone_until is not None:
            current.lost += _lose(options, current, gone_until)
            current.move_to(gone_until)
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


class _TopicIdsNow:
    """Topic ids asked of the broker (DescribeTopics), through an Admin client made only
    when one is asked for: a reader needs one only when a range stays below its end."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
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


def _recreated_under(
    consumer: Any, split: Reading, topic_id_now: _TopicIdsNow, timeout_s: float
) -> int | None:
    """The range's end if its topic was re-created, or its log truncated, since it was
    planned: the log ends at or before the position, below the planned end (nothing more
    of the range can come, so no fetch will ever say out of range), and the topic's id
    is another (kafka_evidence rule 6) or the leader epoch newer (rule 3). A lower end
    with neither is a stale leader's: the range waits."""
    if split.topic_id is None:
        return None  # planned without the id (a replay before any plan): cannot tell
    try:
        _, log_end = consumer.get_watermark_offsets(
            TopicPartition(split.topic, split.partition), timeout=timeout_s
        )
    except KafkaException:
        return None
    if not (log_end <= split.position and kafka_evidence.lower_end(int(log_end), split.end)):
        return None
    if kafka_evidence.topic_recreated(topic_id_now(split.topic), split.topic_id):
        return split.end
    if split.leader_epoch is None:
        return None
    # The end and the epoch of one answer: a stale end beside a fresh epoch is no proof.
    answer = topic_id_now.log_end(split.topic, split.partition)
    truncated = (
        answer is not None
        and answer[0] <= split.position
        and kafka_evidence.log_end_went_back(answer[0], split.end, answer[1], split.leader_epoch)
    )
    return split.end if truncated else None  # (by an unclean election since it was planned)


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
) -> tuple[int | None, bool | None]:
    """Where the records gone from the range's position on end (``[position, x)``), or
    None when they are there (kafka_evidence rule 4, asked only when the fetch was
    ``out_of_range``, rule 7: retention moved the log start past the position, or the
    offsets went back). And whether the broker says the topic (or partition) does not
    exist (rule 1), which the caller believes only when told twice (rule 2); None if it
    could not tell."""
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
        return min(int(log_start), split.end), False  # (or DeleteRecords)
    if gone is kafka_evidence.Gone.WENT_BACK:
        return split.end, False  # re-created or truncated: the rest is not coming
    return None, False


def _lose(options: SourceOptions, split: Reading, gone_until: int) -> int:
    """failOnDataLoss: stop with one error, or count the gone records and go on."""
    position = split.position
    where = f"{split.topic}[{split.partition}] offsets {position} to {gone_until - 1}"
    if options.fail_on_data_loss:
        raise SourceError(
            f"data loss: {where} are gone (retention, or the topic was deleted or "
            "re-created) before this query read them; the option failOnDataLoss=false "
            "goes on past them"
        )
    log.warning("data loss: %s are gone; skipped (failOnDataLoss=false)", where)
    return gone_until - position
