"""Reads the broker's view of the watched partitions through the Admin API.

One round of requests per poll, never one request per partition (semantics.md §4): topic
metadata (every metadata interval, and after a leader moved), ListOffsets(latest) for the
watched partitions and, with a group, its committed offsets, in batches of 250, and the
group's members' assignment; then, only where the log ends call for it, one
DescribeTopics for topic ids. A failed request leaves its part of the
:class:`PollAnswers` empty; it never invents values. The log ends are judged against
what was seen before by ``slackwater.log_verdict`` (known_ends.py): a stale one is left
out, a new log is said.

When the log ends were asked for and answered is stamped around ListOffsets
(``requested_s``, ``answered_s``): the detector counts stillness from those, so that
what the poll waits for afterwards (DescribeTopics, the group) adds none (issue 42).

The group's requests are carried (:class:`_InFlight`), its committed offsets and its
description each on its own: one still in flight when the poll is done is carried into
the next polls, not abandoned, and no new one of its kind is sent while it is pending;
its answer is taken by the poll in which it has come (issue 42, finding 7: with a 1 s
request timeout on a loaded machine, every poll gave its group requests up and the
group's owners were never seen). DescribeGroups is kept in flight for
GROUP_REQUEST_TIMEOUT_S, so a coordinator slower than the request timeout still answers.
OffsetFetch keeps the request timeout: librdkafka's admin client dereferences a null
consumer group when an OffsetFetch is answered NOT_COORDINATOR (a coordinator that moved
while it was in flight) and the process dies (confluentinc/librdkafka#5040, open; seen
here with a coordinator SIGSTOPped until the cluster fenced it, then continued: SIGSEGV
in ``rd_kafka_cgrp_op``); a longer life would widen that window.
"""

from __future__ import annotations

import concurrent.futures
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

# How long librdkafka keeps DescribeGroups (and the FindCoordinator before it) before
# giving it up, when the request timeout is shorter: the default request.timeout.ms of
# Kafka's own clients. The poll does not wait that long: it carries the request.
GROUP_REQUEST_TIMEOUT_S = 30.0


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
    # Monotonic times: just before ListOffsets was sent (None: not sent this poll), and
    # once its answers were all in (without it: when the poll ended). A log end is seen
    # between the two: still up to the first only, and from the second only (detector.py).
    requested_s: float | None = None
    answered_s: float = 0.0  # (set by every poll)


@dataclass
class _InFlight:
    """Requests of one kind for the group, sent together (its committed offsets in the
    batches of ListOffsets, or its description), carried until every one is answered."""

    group: str
    sent: list[dict[str, Future[Any]] | None]
    new: bool = True  # sent by the current poll, which waits for it

    def futures(self) -> list[Future[Any]]:
        return [
            future for futures in self.sent if futures is not None for future in futures.values()
        ]

    def done(self) -> bool:
        return all(future.done() for future in self.futures())


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
        # The group's requests still in flight, carried from poll to poll.
        self._committed: _InFlight | None = None
        self._described: _InFlight | None = None

    def observe(self, topics: Iterable[str], group: str | None) -> PollAnswers:
        """One poll's round of requests; see the module docstring."""
        answers = PollAnswers()
        # Without metadata nothing else about the partitions is trustworthy this poll.
        if self._read_metadata(answers, list(topics)) and self._batches:
            self._observe_log_ends(answers, group)
        elif group is not None and self._batches:
            # The group's answers do not hang on this poll's metadata: the batches of
            # the last one read serve its requests (a slow answer costs only its part).
            self._send_group(group, answers.errors)
        if group is not None:
            self._take_group(group, answers)
        if answers.requested_s is None:
            answers.answered_s = self._monotonic_s()  # no log end: the poll's own time
        return answers

    def _observe_log_ends(self, answers: PollAnswers, group: str | None) -> None:
        """ListOffsets, stamped when sent and when answered, then judged; the group's
        requests sent beside it, those of a kind not in flight."""
        # Stamped before the request goes out: an answer proves the log still up to here.
        answers.requested_s = self._monotonic_s()
        offsets_pending = [
            self._submit("list_offsets", answers.errors, self._list_latest, batch.log_ends)
            for batch in self._batches
        ]
        if group is not None:
            self._send_group(group, answers.errors)
        log_ends, epochs = self._collect_log_ends(offsets_pending, answers.errors)
        # Stamped once every answer is in: a log end is new from here at the latest. What
        # the poll waits for next (DescribeTopics, the group) is after it.
        answers.answered_s = self._monotonic_s()
        answers.reachable = answers.reachable or bool(log_ends)
        answers.new_logs = self._judge(log_ends, epochs, answers.errors)
        answers.log_end_offsets = log_ends

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

    def _send_group(self, group: str, errors: dict[str, str]) -> None:
        """The group's committed offsets, in the same batches as ListOffsets (one request
        without a partition list, "every partition the group committed", measured 7x the
        CPU at 10,000), and its description; each unless one of its kind is in flight."""
        if self._committed is None:
            committed = [
                self._submit(
                    "group_offsets",
                    errors,
                    self._admin.list_consumer_group_offsets,
                    [ConsumerGroupTopicPartitions(group, batch.committed)],
                    request_timeout=self._timeout_s,  # not longer: the module's docstring
                )
                for batch in self._batches
            ]
            self._committed = _InFlight(group, committed)
        if self._described is None:
            described = self._submit(
                "describe_group",
                errors,
                self._admin.describe_consumer_groups,
                [group],
                request_timeout=max(self._timeout_s, GROUP_REQUEST_TIMEOUT_S),
            )
            self._described = _InFlight(group, [described])

    def _take_group(self, group: str, answers: PollAnswers) -> None:
        """The group's answers that have come: waited for up to the request timeout by
        the poll that sent them, taken as they are by the polls after; a request still in
        flight is carried, and this poll shows nothing of its kind (what the last one
        showed stands: group_tracker.py)."""
        in_flight = [kind for kind in (self._committed, self._described) if kind is not None]
        if any(kind.group != group for kind in in_flight):  # (the emitter's group is fixed)
            self._committed = self._described = None
            return
        sent_now = [future for kind in in_flight if kind.new for future in kind.futures()]
        if sent_now:
            concurrent.futures.wait(sent_now, timeout=self._timeout_s)
        for kind in in_flight:
            kind.new = False
        if self._committed is not None and self._committed.done():
            answers.committed_offsets = self._collect_committed(
                group, self._committed.sent, answers.errors
            )
            self._committed = None
        if self._described is not None and self._described.done():
            (described,) = self._described.sent
            answers.assignment = self._collect_assignment(group, described, answers.errors)
            self._described = None

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
