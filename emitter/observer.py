"""Reads the broker's view of the watched partitions through the Admin API.

One round of requests per poll, never one request per partition (semantics.md §4): topic
metadata (every metadata interval, and after a leader moved), ListOffsets(latest) for the
watched partitions and, with a group, its committed offsets, in batches of 250, and the
group's members' assignment; then, only where the log ends call for it, one
DescribeTopics for topic ids. A failed request leaves its part of the
:class:`PollAnswers` empty; it never invents values. The log ends are judged against
what was seen before by ``slackwater.log_verdict`` (known_ends.py): a stale one is left
out, a new log is said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from emitter.known_ends import NO_NEW_LOG, KnownEnds, NewLogs
from slackwater import kafka_clients, kafka_evidence, kafka_logging, list_offsets
from slackwater.list_offsets import LEADER_MOVED
from slackwater.markers import TopicPartitionKey

log = logging.getLogger(__name__)


class _Batch:
    """One batch of partitions, as both requests take it (built once per metadata)."""

    def __init__(self, partitions: list[TopicPartitionKey], latest: OffsetSpec) -> None:
        self.log_ends = list_offsets.Request(partitions, latest)
        self.committed = [TopicPartition(topic, index) for topic, index in partitions]


@dataclass
class PollAnswers:
    """What one poll read from the broker; None / empty where a request failed.

    ``topics`` is set only on polls that refreshed metadata (and it succeeded);
    ``unseen_topics`` then holds the watched topics it did not show but the broker did
    not say are not there (it refused to describe them, or did not answer by name).
    """

    reachable: bool = False
    topics: dict[str, int] | None = None
    unseen_topics: frozenset[str] = frozenset()
    log_end_offsets: dict[TopicPartitionKey, int] = field(default_factory=dict)
    committed_offsets: dict[TopicPartitionKey, int] | None = None
    assignment: dict[str, list[TopicPartitionKey]] | None = None
    errors: dict[str, str] = field(default_factory=dict)
    # Partitions and topics whose log this poll found new (truncated, re-created).
    new_logs: NewLogs = NO_NEW_LOG


class BrokerObserver:
    """Thin wrapper over AdminClient: every call bounded by ``request_timeout_s``.

    ListOffsets and the group's committed offsets go out in batches of
    ``batch_partitions`` (built once per metadata), all submitted before any is awaited,
    together with the group's description: one round of requests per poll, and a second
    (one DescribeTopics) only when the log ends call for topic ids (``_judge``).
    (librdkafka's CPU per partition grows with the size of one request: at 10,000
    partitions, batches of 250 cost 59 ms of CPU per poll, of 1,000 109 ms;
    bench/emitter_requests_bench.py, docs/performance.md.)
    """

    def __init__(
        self,
        admin: AdminClient,
        request_timeout_s: float,
        *,
        metadata_interval_s: float,
        batch_partitions: int = 250,
        monotonic_s: Callable[[], float] = time.monotonic,
        kafka_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._admin = admin
        self._kafka_config = kafka_config or {}  # whose rights: named in a refusal
        self._timeout_s = request_timeout_s
        # How long an answer is waited for: past the request timeout, by which
        # librdkafka answers (kafka_clients.answer_wait_s says why).
        self._wait_s = kafka_clients.answer_wait_s(request_timeout_s)
        self._metadata_interval_s = metadata_interval_s
        self._monotonic_s = monotonic_s
        self._batch = batch_partitions
        self._partition_counts: dict[str, int] | None = None
        self._metadata_at_s = 0.0
        # A log end refused by a leader that moved: librdkafka asks again with the
        # leader it cached, and its epoch (FENCED_LEADER_EPOCH), until metadata is
        # fetched, so the next poll fetches it (kafka_clients.refresh_leaders says why).
        self._leaders_moved = False
        self._latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        self._batches: list[_Batch] = []  # of the partition counts above
        # Log ends are judged against what was seen before (known_ends.py).
        self._known = KnownEnds()

    def observe(self, topics: Iterable[str], group: str | None) -> PollAnswers:
        """One poll's round of requests; see the module docstring."""
        answers = PollAnswers()
        if not self._read_metadata(answers, list(topics)):
            return answers  # without metadata nothing else is trustworthy this poll
        batches = self._batches
        if not batches:
            return answers
        offsets_pending = [
            self._submit("list_offsets", answers.errors, self._list_latest, batch.log_ends)
            for batch in batches
        ]
        committed_pending: list[dict[str, Future[Any]] | None] = []
        described: dict[str, Future[Any]] | None = None
        if group is not None:
            committed_pending, described = self._submit_group(group, batches, answers.errors)
        log_ends, epochs = self._collect_log_ends(offsets_pending, answers.errors)
        answers.reachable = answers.reachable or bool(log_ends)
        answers.new_logs = self._judge(log_ends, epochs, answers.errors)
        answers.log_end_offsets = log_ends
        if group is not None:
            answers.committed_offsets = self._collect_committed(
                group, committed_pending, answers.errors
            )
            answers.assignment = self._collect_assignment(group, described, answers.errors)
        return answers

    def _judge(
        self,
        log_ends: dict[TopicPartitionKey, int],
        epochs: Mapping[TopicPartitionKey, int],
        errors: dict[str, str],
    ) -> NewLogs:
        """The log ends judged (known_ends.py), ``log_ends`` left with those taken. The
        ids asked first, after the log ends (they say which): one DescribeTopics for the
        topics not known yet and those with an answer other than what was seen; a
        quiet poll asks none."""
        changed = self._known.changed(log_ends, epochs)
        asked = self._known.to_ask(self._partition_counts or (), changed)
        topic_ids: dict[str, str] = {}
        if asked:
            pending = self._submit(
                "describe_topics",
                errors,
                kafka_clients.TopicIds,
                self._admin,
                asked,
                self._timeout_s,
            )
            topic_ids = pending.result() if pending is not None else {}
            if len(topic_ids) < len(asked):  # their changed log ends wait (known_ends.py)
                unanswered = ", ".join(t for t in asked if t not in topic_ids)
                errors.setdefault("describe_topics", f"no topic id answered for {unanswered}")
        return self._known.believed(log_ends, epochs, changed, asked, topic_ids)

    def _read_metadata(self, answers: PollAnswers, watched: list[str]) -> bool:
        """Refreshes topics, partition counts and leaders when they are due: every
        metadata interval, at every poll while a watched topic is missing, and at the poll
        after one whose ListOffsets met a leader that moved. False when metadata was due
        and could not be read."""
        counts = self._partition_counts
        due = (
            counts is None
            or len(counts) < len(watched)
            or self._monotonic_s() - self._metadata_at_s >= self._metadata_interval_s
        )
        metadata = None
        if due or self._leaders_moved:
            try:
                metadata = self._admin.list_topics(timeout=self._timeout_s)
            except KafkaException as error:
                answers.errors["metadata"] = str(error.args[0] if error.args else error)
                if due:
                    return False
                # Asked only for the leaders: the partitions known still hold.
        if metadata is not None:
            counts = kafka_clients.partition_counts(metadata, watched)
            if counts != self._partition_counts:
                self._batches = self._batches_of(counts)
            self._partition_counts, self._metadata_at_s = counts, self._monotonic_s()
            answers.topics, answers.reachable = counts, True
            answers.unseen_topics = self._unseen(metadata, watched, answers.errors)
        return True

    def _submit_group(
        self, group: str, batches: list[_Batch], errors: dict[str, str]
    ) -> tuple[list[dict[str, Future[Any]] | None], dict[str, Future[Any]] | None]:
        """The group's committed offsets, in the same batches as ListOffsets (one request
        without a partition list, "every partition the group committed", measured 7x the
        CPU at 10,000), and its description."""
        committed_pending = [
            self._submit(
                "group_offsets",
                errors,
                self._admin.list_consumer_group_offsets,
                [ConsumerGroupTopicPartitions(group, batch.committed)],
                request_timeout=self._timeout_s,
            )
            for batch in batches
        ]
        described = self._submit(
            "describe_group",
            errors,
            self._admin.describe_consumer_groups,
            [group],
            request_timeout=self._timeout_s,
        )
        return committed_pending, described

    @staticmethod
    def _submit(kind: str, errors: dict[str, str], call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except KafkaException as error:
            errors[kind] = str(error)
            return None

    def _unseen(self, metadata: Any, watched: list[str], errors: dict[str, str]) -> frozenset[str]:
        """Watched topics the metadata does not show, whose absence the broker did not
        confirm. A broker lists only the topics the principal may describe: the topics
        not listed are asked for by name (one request, only while some are missing), and
        only the broker's word is a topic not there (not created yet, or deleted;
        kafka_evidence rule 1). A refusal (an ACL taken away) or no answer is not: a
        deleted topic's partitions become FINISHED, for good."""
        answers = kafka_clients.asked_by_name(
            self._admin, kafka_clients.not_listed(metadata, watched), self._timeout_s
        )
        unseen: set[str] = set()
        problems: list[str] = []
        for topic, error in answers.items():
            if kafka_evidence.says_topic_missing(error):
                continue  # not there (kafka_evidence rule 1)
            unseen.add(topic)  # (or described just now: created in between, next poll)
            if error is not None:
                problems.append(
                    kafka_logging.authorization_problem(
                        error, f"describe topic {topic}", self._kafka_config
                    )
                    or f"topic {topic}: {error.str()}"
                )
        if problems:
            errors["metadata"] = "; ".join(problems)
        return frozenset(unseen)

    def _batches_of(self, counts: dict[str, int]) -> list[_Batch]:
        """The request batches of these partition counts: built when the metadata shows
        a different set of partitions, then sent at every poll."""
        partitions = [(name, index) for name, count in counts.items() for index in range(count)]
        return [
            _Batch(partitions[i : i + self._batch], self._latest)
            for i in range(0, len(partitions), self._batch)
        ]

    def _list_latest(self, request: list_offsets.Request) -> Future[Any]:
        """One ListOffsets(latest) for a batch, as a single future (list_offsets.py)."""
        return list_offsets.submit(self._admin, request, timeout_s=self._timeout_s)

    def _collect_log_ends(
        self, pending: list[Future[Any] | None], errors: dict[str, str]
    ) -> tuple[dict[TopicPartitionKey, int], dict[TopicPartitionKey, int]]:
        """The log ends answered, and the leader epochs they were answered in."""
        offsets: dict[TopicPartitionKey, int] = {}
        epochs: dict[TopicPartitionKey, int] = {}
        failures = 0
        self._leaders_moved = False
        for future in pending:
            if future is None:
                continue
            results = _result(future, self._wait_s)
            if isinstance(results, BaseException):
                failures += 1
                errors["list_offsets"] = str(results)
                continue
            epochs.update(getattr(results, "leader_epochs", {}))
            for key, result in results.items():
                if isinstance(result, BaseException | KafkaError):
                    failures += 1
                    errors["list_offsets"] = str(result)
                    moved = isinstance(result, KafkaError) and result.code() in LEADER_MOVED
                    self._leaders_moved = self._leaders_moved or moved
                else:
                    offsets[key] = result
        if failures:
            log.warning("log end offsets of %d partitions could not be read", failures)
        return offsets, epochs

    def _collect_committed(
        self, group: str, pending: list[dict[str, Future[Any]] | None], errors: dict[str, str]
    ) -> dict[TopicPartitionKey, int] | None:
        committed: dict[TopicPartitionKey, int] = {}
        for futures in pending:
            result = (
                _result(futures[group], self._wait_s)
                if futures is not None
                else KafkaException("not sent")
            )
            if isinstance(result, BaseException):
                errors["group_offsets"] = str(result)
                return None  # a partial view of the group's offsets would show false lag
            committed.update(
                ((tp.topic, tp.partition), tp.offset)
                for tp in result.topic_partitions
                if tp.error is None and kafka_evidence.known_offset(tp.offset)
            )
        return committed

    def _collect_assignment(
        self, group: str, futures: dict[str, Future[Any]] | None, errors: dict[str, str]
    ) -> dict[str, list[TopicPartitionKey]] | None:
        if futures is None:
            return None
        result = _result(futures[group], self._wait_s)
        if isinstance(result, BaseException):
            errors["describe_group"] = str(result)
            return None
        assignment: dict[str, list[TopicPartitionKey]] = {}
        for member in result.members:
            owned = member.assignment.topic_partitions if member.assignment else []
            assignment[member.member_id] = [(tp.topic, tp.partition) for tp in owned]
        return assignment


def _result(future: Future[Any], timeout_s: float) -> Any:
    """The future's result, or the exception it failed with (timeouts included)."""
    try:
        return future.result(timeout=timeout_s)
    except BaseException as error:
        return error
