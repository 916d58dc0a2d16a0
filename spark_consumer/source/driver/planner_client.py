"""The planner's Kafka clients: every metadata, describe and ListOffsets request the
driver makes, and what a refusal or no answer means for the query. Whether a partition
went back or vanished is judged apart, on these answers (``partition_identity``).

As the emitter's ``observer.py`` is the emitter's, and Spark's ``KafkaOffsetReader`` is
its ``KafkaMicroBatchStream``'s: one object asks, the planner decides. What the answers
mean is judged by ``slackwater.kafka_evidence``, the rules the emitter and the readers
use too; this room adds only how long the planner waits before acting on them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException
from confluent_kafka.admin import OffsetSpec

from slackwater import kafka_clients, kafka_logging, list_offsets
from slackwater.kafka_logging import once_per_interval
from slackwater.list_offsets import Answers
from slackwater.list_offsets import Request as OffsetsRequest
from slackwater.markers import TopicPartitionKey
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.shared.options import PLANNER, SOURCE_CLIENT, SourceError, SourceOptions

# Under the planner's logger, whose lines these were before the planner had rooms.
log = logging.getLogger("spark_consumer.source.driver.planner").getChild("broker")
# The planner's consumers read by assignment and commit nothing; librdkafka still finds
# this group's coordinator (docs/deploy.md's ACLs allow Describe on it).
PLANNER_GROUP = "slackwater-source-planner"
# Repeats while the broker is away, or refuses a topic: one line per kind per 30 s.
log_refused = once_per_interval("spark_consumer.source.driver.planner.refused")
log_unreachable = once_per_interval("spark_consumer.source.driver.planner.connection")
# ListOffsets go out in requests of this many partitions, all submitted before any is
# awaited: librdkafka's CPU per partition grows with the size of one request (the
# emitter's measure, emitter/observer.py; the planner's, docs/performance.md, issue 33).
REQUEST_PARTITIONS = 250


class PlannerClient:
    """The planner's Kafka clients and every question they ask; every request bounded by
    the option requestTimeoutMs."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # Its clients' names (``client``): one's failure is never discarded when another
        # answers, nor another query's (kafka_logging keys failures by the whole name).
        self.client_name = f"{SOURCE_CLIENT}.planner#{uuid.uuid4().hex[:8]}"
        self._admin: Any = None
        # The plan's ListOffsets requests: (the log ends asked, the spec, their requests).
        self._built: tuple[list[TopicPartitionKey], str, list[OffsetsRequest]] | None = None
        # The log ends a plan asks, by the partition counts they were made of.
        self._asked_shape: tuple[tuple[Any, int], list[TopicPartitionKey]] | None = None

    def client(self, role: str) -> str:
        """The name of this planner's client ``role``: admin, control or progress."""
        return f"{self.client_name}.{role}"

    @property
    def admin(self) -> Any:
        if self._admin is None:
            try:
                self._admin = kafka_clients.admin_client(
                    self.client("admin"), self.options.bootstrap_servers, self.options.kafka_config
                )
            except KafkaException as error:  # a CA file or keystore missing on the driver
                raise self.options.not_made(error.args[0], PLANNER) from None
        return self._admin

    def consumer(self, role: str, settings: dict[str, Any] | None = None) -> Any:
        """A consumer of the control or progress topic (``role``), reading by assignment,
        with ``settings`` of its own; a refusal it meets ends the query (_RefusedEnds)."""
        name = self.client(role)
        try:
            made = kafka_clients.consumer(
                name,
                self.options.bootstrap_servers,
                self.options.kafka_config,
                {
                    "group.id": PLANNER_GROUP,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    **(settings or {}),
                },
            )
        except KafkaException as error:
            raise self.options.not_made(error.args[0], PLANNER) from None
        return _RefusedEnds(made, name, self.options)

    @property
    def _timeout_s(self) -> float:
        return self.options.request_timeout_s

    # ---------------------------------------------------------------- what is there

    def observe(self, planned: Collection[str]) -> PlanAnswers:
        """One metadata request and one ListOffsets round for the whole plan: the
        subscribed topics' partitions and log ends, and the control topic's (``planned``:
        the topics the query has read, see ``_not_refused``). The topics' ids are asked
        apart (``topic_ids``), of those whose answers call for it."""
        metadata = self.admin.list_topics(timeout=self._timeout_s)
        counts = self._subscribed(metadata, planned)
        control = self.options.control_topic
        control_count = (
            kafka_clients.partition_counts(metadata, [control]).get(control, 0) if control else 0
        )
        latest = self.list_offsets(self._log_ends_asked(counts, control_count), "latest")
        control_ends = {
            str(p): latest[(control, p)]
            for p in range(control_count)
            if control is not None and (control, p) in latest
        }
        progress = metadata.topics.get(self.options.progress_topic)
        return PlanAnswers(
            counts,
            frozenset(metadata.topics),
            latest,
            control_ends,
            latest.leader_epochs,
            None if progress is None or progress.error else tuple(progress.partitions),
        )

    def _log_ends_asked(
        self, counts: dict[str, int], control_count: int
    ) -> list[TopicPartitionKey]:
        """Every partition of the subscribed topics, then the control topic's: the same
        list while the counts stay the same (10 ms to build at 10,000 partitions)."""
        shape = (tuple(counts.items()), control_count)
        if self._asked_shape is None or self._asked_shape[0] != shape:
            asked = [(t, p) for t, count in counts.items() for p in range(count)]
            control = self.options.control_topic
            asked += [(control, p) for p in range(control_count)] if control else []
            self._asked_shape = (shape, asked)
        return self._asked_shape[1]

    def subscribed_partitions(self) -> list[TopicPartitionKey]:
        """Every partition of the subscribed topics the broker lists now."""
        counts = self._subscribed(self.admin.list_topics(timeout=self._timeout_s))
        return [(t, p) for t, count in counts.items() for p in range(count)]

    def _subscribed(self, metadata: Any, planned: Collection[str] = ()) -> dict[str, int]:
        self._not_refused(metadata, planned)
        names = [name for name in metadata.topics if self.options.subscribes(name)]
        return kafka_clients.partition_counts(metadata, names)

    def _not_refused(self, metadata: Any, planned: Collection[str]) -> None:
        """A broker lists only the topics the principal may describe: the topics this
        query names that are not listed are asked for by name (one request, only while
        some are missing). A refused control topic, or a refused data topic the query
        has read, ends the query: it would run without markers, or stop reading the
        topic without a word. A data topic it has not read yet is waited for, saying so
        (Kafka refuses a topic not there yet alike, when no ACL names it yet). Topics
        of a pattern cannot be asked for: one refused is one not there."""
        control = self.options.control_topic
        named = (*self.options.topics, *([control] if control else []))
        answers = kafka_clients.asked_by_name(
            self.admin, kafka_clients.not_listed(metadata, named), self._timeout_s
        )
        for topic, error in answers.items():
            kind = "control topic" if topic == control else "topic"
            refused = error and self.options.refused(error, f"describe {kind} {topic}")
            if not refused:
                continue
            if topic == control or topic in planned:
                raise refused
            log_refused.warning("%s: waiting for it (no data from it until then)", refused)

    def topic_ids(self, names: Collection[str]) -> dict[str, str]:
        """The ids of ``names``, in one DescribeTopics (a topic not described is left
        out): about 12 ms of CPU per 1,000 partitions, so asked only of topics whose
        answers changed (``PartitionIdentity.to_ask``)."""
        return kafka_clients.topic_ids(self.admin, names, self._timeout_s)

    def describe(self, topic: str) -> Any:
        """The metadata of one topic, asked for by name (None: not listed)."""
        return self.admin.list_topics(topic, timeout=self._timeout_s).topics.get(topic)

    def topic_ends(self, topic: str) -> dict[str, int]:
        """The log end of every partition of a topic; empty if the topic does not exist.
        Waits for a partition just created (the progress topic at the first start)."""
        metadata = self.admin.list_topics(timeout=self._timeout_s)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            return {}
        ends = self.list_offsets(
            [(topic, p) for p in described.partitions], "latest", wait_for_all=True
        )
        return {str(p): end for (_, p), end in ends.items()}

    # ---------------------------------------------------------------- offsets

    def list_offsets(
        self, partitions: list[TopicPartitionKey], spec_name: str, *, wait_for_all: bool = False
    ) -> Answers:
        """Offsets of the partitions that have one now. A partition just created or
        moving leader answers with an error Kafka's protocol calls retriable: it is left
        out, and stands still until the next trigger, or with ``wait_for_all`` asked
        again until the request timeout."""
        deadline = time.monotonic() + self._timeout_s
        offsets, not_ready = self._asked(partitions, spec_name, wait_for_all)
        while wait_for_all and not_ready and time.monotonic() < deadline:
            time.sleep(0.5)
            # A leader that moved is refused with the epoch the client cached until it
            # fetches metadata (kafka_clients.refresh_leaders says why).
            remaining_s = max(0.1, deadline - time.monotonic())
            kafka_clients.refresh_leaders(self.admin, remaining_s)
            more, not_ready = self._asked(list(not_ready), spec_name, wait_for_all)
            offsets.update(more)
            offsets.leader_epochs.update(more.leader_epochs)
        if not_ready:
            where = ", ".join(f"{t}[{p}] ({name})" for (t, p), name in list(not_ready.items())[:5])
            if wait_for_all:
                raise SourceError(
                    f"{spec_name} offsets not available after {self._timeout_s:.0f}s: {where}"
                )
            log.info("offsets not ready, retried next trigger: %s", where)
        return offsets

    def _asked(
        self, partitions: list[TopicPartitionKey], spec_name: str, wait_for_all: bool
    ) -> tuple[Answers, dict[TopicPartitionKey, str]]:
        """One round; when waiting for all, a request that failed whole (no leader known
        for any partition, no answer in time: seen while a whole cluster restarts) leaves
        every partition not ready, asked again until the deadline. Otherwise it is the
        caller's: a plan stands still as blind (``PlannerClient.unreachable``)."""
        try:
            return self._list_offsets_once(partitions, spec_name)
        except KafkaException as error:
            if not wait_for_all:
                raise
            reason = error.args[0] if error.args else None
            if isinstance(reason, KafkaError):
                refused = self.options.refused(reason, f"list offsets of {partitions[0][0]}")
                if refused:
                    raise refused from error
            self.unreachable(error)  # a failed authentication ends the wait in one line
            name = reason.name() if isinstance(reason, KafkaError) else str(error)
            return Answers(), dict.fromkeys(partitions, name)

    def _requests(
        self, partitions: list[TopicPartitionKey], spec_name: str
    ) -> list[OffsetsRequest]:
        """The requests of ``partitions``, REQUEST_PARTITIONS each. The plan's log ends
        (``_log_ends_asked``'s list, the same while the partition counts stay the same)
        are built once; any other question (a few partitions, now and then) for itself."""
        built = self._built
        if built is not None and built[0] is partitions and built[1] == spec_name:
            return built[2]
        spec = getattr(OffsetSpec, spec_name)()
        requests = [
            OffsetsRequest(partitions[i : i + REQUEST_PARTITIONS], spec)
            for i in range(0, len(partitions), REQUEST_PARTITIONS)
        ]
        if self._asked_shape is not None and partitions is self._asked_shape[1]:
            self._built = (partitions, spec_name, requests)
        return requests

    def _list_offsets_once(
        self, partitions: list[TopicPartitionKey], spec_name: str
    ) -> tuple[Answers, dict[TopicPartitionKey, str]]:
        if not partitions:
            return Answers(), {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.options.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        pending = [
            list_offsets.submit(
                self.admin, request, timeout_s=self._timeout_s, isolation_level=isolation
            )
            for request in self._requests(partitions, spec_name)
        ]
        offsets = Answers()
        for future in pending:
            answered = kafka_clients.answer(future, self._timeout_s)
            offsets.update(answered)
            offsets.leader_epochs.update(getattr(answered, "leader_epochs", {}))
        # The errors taken out of the offsets (the rare case: found in one pass).
        not_ready: dict[TopicPartitionKey, str] = {}
        for key in [key for key, answer in offsets.items() if isinstance(answer, KafkaError)]:
            answer = offsets.pop(key)
            if not list_offsets.retriable(answer):
                raise self.options.refused(answer, f"describe topic {key[0]}") or SourceError(
                    f"{spec_name} offset of {key[0]}[{key[1]}]: {answer}"
                )
            not_ready[key] = answer.name()
        return offsets, not_ready

    # ---------------------------------------------------------------- no answer

    def unreachable(self, error: KafkaException) -> None:
        """The broker did not answer: said (rate-limited), and the plan waits for it. A
        failed authentication ends the query instead, in one line naming the principal:
        retrying cannot mend credentials, and a query that only waited would look like
        one whose broker is down."""
        failure = self.authentication_failure()
        if failure is not None:
            raise self.options.not_authenticated(failure, PLANNER) from error
        log_unreachable.warning(
            "cannot reach Kafka at %s (%s): no new batch until it answers",
            self.options.bootstrap_servers,
            error.args[0].str() if error.args else error,
        )

    def authentication_failure(self) -> KafkaError | None:
        """The failed authentication the admin client reported since the last call,
        taken. Served first: the error callback runs only in a poll (so do log lines,
        which would queue up otherwise). The consumers' are theirs (_RefusedEnds)."""
        self.admin.poll(0)
        return kafka_logging.take_authentication_failure(self.client("admin"))


@dataclass
class _RefusedEnds:
    """A planner's consumer whose consume call ends the query on a refusal it brought
    with nothing else (SourceOptions.not_refused), as a reader's does."""

    consumer: Any
    name: str
    options: SourceOptions

    def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
        messages: list[Any] = self.consumer.consume(*args, **kwargs)
        self.options.not_refused(self.name, PLANNER, answered=bool(messages))
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)
