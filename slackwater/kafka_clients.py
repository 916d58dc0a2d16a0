"""Every confluent-kafka client of slackwater is made here, one way: the user's Kafka
settings (``kafka_config``: security, timeouts), then librdkafka's logging routed through
Python logging under the client's name (kafka_logging), then the bootstrap servers, then
what the client's job needs, which the user cannot override by accident. (The Spark
source's readers keep their clients across tasks, pooled by these settings: they are
made from ``client_settings`` too, in spark_consumer/source/executor/reader_clients.py.)"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_logging import client_logging, remember_secrets


def answer_wait_s(request_timeout_s: float) -> float:
    """How long to wait for the future of an Admin request sent with
    ``request_timeout_s``. librdkafka resolves it by then, with the answer or an error
    per partition; waiting exactly that long races its own timeout and loses the answer.
    Seen with a leader SIGKILLed on three nodes: ListOffsets answered at its timeout, the
    emitter lost every partition's log end (not only the dead leader's) at every poll,
    and the planner raised TimeoutError, which ended the query. Twice as long leaves the
    answer room on a busy machine: librdkafka's answer ends the wait, not our clock."""
    return 2 * request_timeout_s


def answer(future: concurrent.futures.Future[Any], request_timeout_s: float) -> Any:
    """The result of an Admin request's future, waited for ``answer_wait_s``; none by
    then is a KafkaException (_TIMED_OUT), what every caller takes for a broker that did
    not answer."""
    try:
        return future.result(timeout=answer_wait_s(request_timeout_s))
    except TimeoutError:
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"no answer within {request_timeout_s:.0f}s")
        ) from None


def client_settings(
    name: str,
    bootstrap_servers: str,
    user: Mapping[str, Any] | None = None,
    ours: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings of a client called ``name`` (its logger is ``librdkafka.<name>``).
    Its secrets are made known to the one filter of librdkafka's texts first
    (kafka_logging.redact): whatever the client says later, no line shows them."""
    remember_secrets({**(user or {}), **(ours or {})})
    return {
        **(user or {}),
        **client_logging(name),
        "bootstrap.servers": bootstrap_servers,
        **(ours or {}),
    }


# Kafka creates a topic that a metadata request names (auto.create.topics.enable, true by
# default) unless the client says not to; librdkafka says so by default for consumers
# only, and an AdminClient is a producer inside. A client that asks whether a topic
# exists must never answer by making it: a deleted data topic would come back empty.
NEVER_CREATE_TOPICS: Mapping[str, Any] = {"allow.auto.create.topics": False}


def admin_client(
    name: str, bootstrap_servers: str, user: Mapping[str, Any] | None = None
) -> AdminClient:
    return AdminClient(client_settings(name, bootstrap_servers, user, NEVER_CREATE_TOPICS))


def consumer(
    name: str,
    bootstrap_servers: str,
    user: Mapping[str, Any] | None = None,
    ours: Mapping[str, Any] | None = None,
) -> Consumer:
    return Consumer(
        client_settings(name, bootstrap_servers, user, {**NEVER_CREATE_TOPICS, **(ours or {})})
    )


def producer(
    name: str,
    bootstrap_servers: str,
    user: Mapping[str, Any] | None = None,
    ours: Mapping[str, Any] | None = None,
) -> Producer:
    # librdkafka's producer asks for the topics it writes with auto-creation allowed (its
    # default is true, the consumer's false): a write to a deleted control topic made it
    # again with the broker's defaults (cleanup.policy=delete), without our state.
    return Producer(
        client_settings(name, bootstrap_servers, user, {**NEVER_CREATE_TOPICS, **(ours or {})})
    )


def all_partitions_led(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Whether the broker lists ``topic`` with ``partitions`` partitions, each with a
    leader: a topic just created is not yet writable until it does."""
    described = admin.list_topics(topic, timeout=10).topics.get(topic)
    return (
        described is not None
        and described.error is None
        and len(described.partitions) == partitions
        and all(p.leader >= 0 for p in described.partitions.values())
    )


def partition_counts(metadata: Any, names: Iterable[str]) -> dict[str, int]:
    """Partitions of each of ``names`` in a metadata answer (``list_topics``), in
    ``names``' order; a topic the broker does not list, or lists with an error, is left
    out: partitions come from the broker, and only from a good answer."""
    counts: dict[str, int] = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is not None and topic.error is None:
            counts[name] = len(topic.partitions)
    return counts


def not_listed(metadata: Any, names: Iterable[str]) -> list[str]:
    """Those of ``names`` a metadata answer does not list, or lists with an error."""
    return [n for n in names if (t := metadata.topics.get(n)) is None or t.error is not None]


def asked_by_name(
    admin: AdminClient, names: list[str], timeout_s: float
) -> dict[str, KafkaError | None]:
    """What the broker answers for each topic asked for by name, in one request: None
    if it describes the topic, else the error. A broker lists only the topics the
    principal may describe, so a topic missing from a listing may be refused
    (TOPIC_AUTHORIZATION_FAILED, whether it exists or not) as well as not there
    (UNKNOWN_TOPIC_OR_PART); a request that failed leaves every topic with its error."""
    if not names:
        return {}
    futures = _described(admin, names, timeout_s)
    answers: dict[str, KafkaError | None] = {}
    for name, future in futures.items():
        if not future.done():
            answers[name] = KafkaError(KafkaError._TIMED_OUT, "no answer in time")
            continue
        try:
            future.result()
            answers[name] = None
        except KafkaException as error:
            answers[name] = error.args[0]
    return answers


def topic_ids(admin: AdminClient, names: Collection[str], timeout_s: float) -> dict[str, str]:
    """The id of each topic of ``names`` that the broker describes now, in one request
    (kafka_evidence rule 6: a re-created topic has a new one); a topic not described,
    or a request not answered in time, is left out."""
    return TopicIds(admin, names, timeout_s).result()


class TopicIds:
    """One DescribeTopics sent now, its ids read later (``result``): sent before another
    request, both are answered in one wait."""

    def __init__(self, admin: AdminClient, names: Collection[str], timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._futures = (
            admin.describe_topics(TopicCollection(list(names)), request_timeout=timeout_s)
            if names
            else {}
        )

    def result(self) -> dict[str, str]:
        """The ids described; a topic not described, or not in time, is left out."""
        futures = self._futures
        concurrent.futures.wait(list(futures.values()), timeout=answer_wait_s(self._timeout_s))
        return {
            name: str(future.result().topic_id)
            for name, future in futures.items()
            if future.done() and future.exception() is None
        }


def _described(
    admin: AdminClient, names: Collection[str], timeout_s: float
) -> dict[str, concurrent.futures.Future[Any]]:
    """One DescribeTopics for ``names``, its futures waited for as long as librdkafka may
    take to answer (``answer_wait_s``); one still not done is the caller's to judge."""
    futures = admin.describe_topics(TopicCollection(list(names)), request_timeout=timeout_s)
    concurrent.futures.wait(list(futures.values()), timeout=answer_wait_s(timeout_s))
    return futures


def refresh_leaders(client: AdminClient | Consumer, timeout_s: float) -> None:
    """Updates the client's partition leaders and their epochs before a request is sent
    again. librdkafka's admin ListOffsets sends the leader epoch it has cached and, when
    the leader has moved, gets FENCED_LEADER_EPOCH back until its next metadata refresh
    (``topic.metadata.refresh.interval.ms``, 5 minutes by default); a metadata request
    updates that cache. Kafka's Java clients refresh metadata on these errors likewise
    (KAFKA-9535). No answer is left to the request that follows."""
    with contextlib.suppress(KafkaException):
        client.list_topics(timeout=timeout_s)


def create_topic(admin: AdminClient, topic: NewTopic, timeout_s: float) -> bool:
    """Creates ``topic``; True if this call made it, False if it existed already (made
    by another client since we looked). Any other failure raises KafkaException."""
    future = admin.create_topics([topic], request_timeout=timeout_s)[topic.topic]
    try:
        answer(future, timeout_s)
    except KafkaException as error:
        if error.args and error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
    return True
