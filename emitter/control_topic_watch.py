"""The control topic watched while the emitter runs: is it there, is it still the topic
the emitter writes (its topic id), how many partitions it has, and whether it keeps
markers (its cleanup.policy and retention.ms).

The control topic is the emitter's memory: deleted, or deleted and made again under its
name, it holds none of the claims and markers consumers and a restarted emitter read
back. One check (DescribeTopics and DescribeConfigs, sent together) at most once per
metadata interval, driven by the poll loop (``check``); its answers are judged by
kafka_evidence's rules, so a broker that does not answer, or refuses, never makes the
topic look gone:

    answer                                   verdict
    described, the id seen before (or none)  SAME
    described, another id, never seen        RECREATED (once; the new id is kept)
    UNKNOWN_TOPIC_OR_PART, told twice        GONE      (at every check while gone)
    told once, refused, no answer, an old id UNKNOWN
"""

from __future__ import annotations

import concurrent.futures
import enum
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from slackwater import kafka_clients, kafka_evidence


class Verdict(enum.StrEnum):
    """What one check says of the control topic."""

    SAME = "same"
    GONE = "gone"
    RECREATED = "recreated"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class TopicAnswer:
    """What one check's requests said (None: not said)."""

    # True: the broker says the topic does not exist (UNKNOWN_TOPIC_OR_PART); False: it
    # describes it; None: no answer, or a refusal (kafka_evidence rule 1: not an absence).
    missing: bool | None
    topic_id: str | None = None
    partitions: int | None = None
    cleanup_policy: str | None = None
    retention_ms: int | None = None
    # Why the topic could not be judged (None when it could).
    unanswered: str | None = None


@dataclass
class ControlTopicFindings:
    """What is known of the control topic, for ``/metrics`` and ``/status``: None where
    the broker has not told (yet); the last answer stands while it does not answer."""

    name: str
    present: bool | None = None
    topic_id: str | None = None
    partitions: int | None = None
    cleanup_policy: str | None = None
    retention_ms: int | None = None
    # Times the topic was found gone or made again under its name: each time the
    # emitter's memory on Kafka was lost.
    recreations: int = 0
    verdict: Verdict | None = None
    unanswered: str | None = None

    @property
    def compacted(self) -> bool | None:
        """Whether compaction keeps every partition's last marker (``compact`` or
        ``compact,delete``); None while the policy is unknown."""
        if self.cleanup_policy is None:
            return None
        return "compact" in self.cleanup_policy.split(",")

    def as_status(self) -> dict[str, Any]:
        """The ``control_topic`` object of ``/status``."""
        return {
            "name": self.name,
            "present": self.present,
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "cleanup_policy": self.cleanup_policy,
            "compacted": self.compacted,
            "retention_ms": self.retention_ms,
            "recreations": self.recreations,
            "last_check": None if self.verdict is None else self.verdict.value,
            "unanswered": self.unanswered,
        }


@dataclass
class TopicIdentity:
    """Judges the answers of successive checks (pure: no client, no clock)."""

    findings: ControlTopicFindings
    # The id of the topic the emitter writes; None until an answer gives one.
    _known_id: str | None = None
    # Ids of incarnations the topic had before: Kafka never gives one again, so an
    # answer with one is a broker behind on metadata, not the topic.
    _retired: set[str] = field(default_factory=set)
    _absent: kafka_evidence.MissingAnswers = field(default_factory=kafka_evidence.MissingAnswers)

    def judge(self, answer: TopicAnswer) -> Verdict:
        verdict = self._judged(answer)
        self.findings.verdict = verdict
        self.findings.unanswered = answer.unanswered
        return verdict

    def rebase(self) -> None:
        """The topic as it is now is the emitter's: the next described id is kept without
        a verdict (after the emitter wrote its state to it, or read it at a start)."""
        self._known_id = None

    def _judged(self, answer: TopicAnswer) -> Verdict:
        findings = self.findings
        # Rule 2: an absence counts when told TOLD_IN_A_ROW times in a row; no answer
        # (None) leaves the count where it is.
        believed_gone = self._absent.answer(answer.missing)
        if answer.missing is None:
            return Verdict.UNKNOWN
        if answer.missing:
            if not believed_gone:
                return Verdict.UNKNOWN
            if findings.present is not False:  # once per loss, not once per check
                findings.recreations += 1
            findings.present, findings.topic_id, findings.partitions = False, None, None
            if self._known_id is not None:
                self._retired.add(self._known_id)
                self._known_id = None
            return Verdict.GONE
        if answer.topic_id is not None and answer.topic_id in self._retired:
            return Verdict.UNKNOWN  # an old incarnation's id: a stale answer, not the topic
        self._take(answer)
        if answer.topic_id is None or self._known_id is None:
            self._known_id = answer.topic_id or self._known_id
            return Verdict.SAME
        if answer.topic_id == self._known_id:
            return Verdict.SAME
        # Rule 6: another id is another topic under the same name.
        self._retired.add(self._known_id)
        self._known_id = answer.topic_id
        findings.recreations += 1
        return Verdict.RECREATED

    def _take(self, answer: TopicAnswer) -> None:
        findings = self.findings
        findings.present = True
        findings.topic_id = answer.topic_id or findings.topic_id
        findings.partitions = answer.partitions or findings.partitions
        # DescribeConfigs may fail where DescribeTopics answered: the last policy stands.
        if answer.cleanup_policy is not None:
            findings.cleanup_policy = answer.cleanup_policy
        if answer.retention_ms is not None:
            findings.retention_ms = answer.retention_ms


class ControlTopicWatch:
    """The control topic's checks, at most one per metadata interval (``check``)."""

    def __init__(
        self,
        admin: AdminClient,
        topic: str,
        request_timeout_s: float,
        metadata_interval_s: float,
    ) -> None:
        self._admin = admin
        self._topic = topic
        self._timeout_s = request_timeout_s
        self._interval_s = metadata_interval_s
        self._identity = TopicIdentity(ControlTopicFindings(topic))
        self._next_s: float | None = None

    @property
    def findings(self) -> ControlTopicFindings:
        return self._identity.findings

    def rebase(self) -> None:
        """The topic as it is now is the emitter's (its state written, or read at a
        start): checked again at once, not one metadata interval later (a re-creation
        in between would be taken for the topic's own id)."""
        self._identity.rebase()
        self._next_s = None

    def check(self, now_s: float, *, due: bool = False) -> Verdict | None:
        """Asks and judges, if a check is due at ``now_s`` (monotonic) or ``due`` says it
        is; None if not."""
        if not due and self._next_s is not None and now_s < self._next_s:
            return None
        answer = self.ask()
        verdict = self._identity.judge(answer)
        # An absence told once is asked again at the next poll (rule 2 wants it twice),
        # not a whole interval later: the loss is known one poll after the first word.
        told_once = answer.missing is True and verdict is Verdict.UNKNOWN
        self._next_s = now_s if told_once else now_s + self._interval_s
        return verdict

    def ask(self) -> TopicAnswer:
        """One DescribeTopics and one DescribeConfigs, sent together."""
        timeout_s = self._timeout_s
        resource = ConfigResource(ResourceType.TOPIC, self._topic)
        try:
            topics = TopicCollection([self._topic])
            described = self._admin.describe_topics(topics, request_timeout=timeout_s)
            configs = self._admin.describe_configs([resource], request_timeout=timeout_s)
        except KafkaException as error:  # not sent: no answer
            return TopicAnswer(missing=None, unanswered=str(error))
        description = described[self._topic]
        config = configs[resource]
        wait_s = kafka_clients.answer_wait_s(timeout_s)
        concurrent.futures.wait([description, config], timeout=wait_s)
        if not description.done():
            return TopicAnswer(missing=None, unanswered=f"no answer within {timeout_s:.0f}s")
        failure = description.exception()
        if failure is not None:
            said = failure.args[0] if failure.args else None
            # Rule 1: only the broker's UNKNOWN_TOPIC_OR_PART says it is not there.
            if isinstance(said, KafkaError) and kafka_evidence.says_topic_missing(said):
                return TopicAnswer(missing=True)
            return TopicAnswer(missing=None, unanswered=str(said or failure))
        topic = description.result()
        policy, retention_ms = _policy(config)
        return TopicAnswer(
            missing=False,
            topic_id=str(topic.topic_id),
            partitions=len(topic.partitions),
            cleanup_policy=policy,
            retention_ms=retention_ms,
        )


def _policy(config: concurrent.futures.Future[Any]) -> tuple[str | None, int | None]:
    """cleanup.policy and retention.ms of a DescribeConfigs answer; None for each not
    answered (in time)."""
    if not config.done() or config.exception() is not None:
        return None, None
    entries = config.result()
    policy = entries.get("cleanup.policy")
    retention = entries.get("retention.ms")
    retention_ms = None
    if retention is not None and retention.value is not None:
        retention_ms = int(retention.value)
    return (None if policy is None else str(policy.value)), retention_ms
