"""ListOffsets for many partitions as one future, for the emitter and the source.

confluent-kafka's public ``AdminClient.list_offsets`` builds one Python future per
partition (about 25 µs of CPU each: a quarter of a second at 10,000 partitions). Its
own C method takes a single future for the whole request, resolved with a dict of
per-partition results; we call that, and fall back to the public API (same answers,
one future per partition) if a release changes it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from importlib import metadata
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ListOffsetsResultInfo, OffsetSpec

from slackwater import kafka_clients, kafka_evidence

log = logging.getLogger(__name__)

# The confluent-kafka releases whose private C method we have checked (its signature and
# its results); any other release uses the public API.
C_METHOD_RELEASES = ((2, 16), (3, 0))


def c_method_if_checked() -> Any:
    """The binding's private C method, only on a checked release; else None."""
    release = tuple(int(part) for part in metadata.version("confluent-kafka").split(".")[:2])
    lowest, above = C_METHOD_RELEASES
    if not lowest <= release < above:
        return None
    try:
        from confluent_kafka.cimpl import _AdminClientImpl
    except ImportError:
        return None
    return getattr(_AdminClientImpl, "list_offsets", None)


# The C method, or None once it failed (then the public API for the process's life).
C_METHODS: dict[str, Any] = {"list_offsets": c_method_if_checked()}


class Request:
    """ListOffsets of fixed partitions with one spec, built once and sent as often as
    wanted: the emitter's partitions change only with the metadata, and building 10,000
    TopicPartition objects costs more than a millisecond per thousand at every poll."""

    def __init__(self, partitions: Iterable[tuple[str, int]], spec: OffsetSpec) -> None:
        self.partitions = tuple(partitions)
        self.spec = spec
        spec_value = int(spec._value)
        self.c_request = [TopicPartition(t, p, spec_value) for t, p in self.partitions]


def submit(
    admin: AdminClient,
    request: Request,
    *,
    timeout_s: float,
    isolation_level: IsolationLevel | None = None,
) -> Future[dict[tuple[str, int], Any]]:
    """One ListOffsets: a future of {(topic, partition): offset or the KafkaError that
    partition answered}."""
    options: dict[str, Any] = {"request_timeout": timeout_s}
    raw_list_offsets = C_METHODS["list_offsets"]
    if raw_list_offsets is not None:
        raw: Future[dict[TopicPartition, Any]] = Future()
        raw.set_running_or_notify_cancel()
        if isolation_level is not None:
            options["isolation_level_value"] = isolation_level.value
        try:
            raw_list_offsets(admin, request.c_request, raw, **options)
            return _by_key(raw)
        except (TypeError, AttributeError) as error:
            log.warning("falling back to AdminClient.list_offsets: %s", error)
            C_METHODS["list_offsets"] = None
            options.pop("isolation_level_value", None)
    if isolation_level is not None:
        options["isolation_level"] = isolation_level
    futures = admin.list_offsets(
        {TopicPartition(t, p): request.spec for t, p in request.partitions}, **options
    )
    result: Future[dict[tuple[str, int], Any]] = Future()
    result.set_running_or_notify_cancel()
    answers = Answers()
    for tp, one in futures.items():
        try:
            info = kafka_clients.answer(one, timeout_s)
            answers[(tp.topic, tp.partition)] = info.offset
            if info.leader_epoch is not None:
                answers.leader_epochs[(tp.topic, tp.partition)] = info.leader_epoch
        except KafkaException as error:
            answers[(tp.topic, tp.partition)] = error.args[0]
    result.set_result(_unknown_as_errors(answers))
    return result


class Answers(dict[tuple[str, int], Any]):
    """{(topic, partition): offset or the KafkaError that partition answered}, and the
    leader epoch each offset was answered in (kafka_evidence rules 3 and 6 judge a lower
    log end by it): absent where the broker gave none."""

    def __init__(self) -> None:
        super().__init__()
        self.leader_epochs: dict[tuple[str, int], int] = {}


def _by_key(raw: Future[dict[TopicPartition, Any]]) -> Future[dict[tuple[str, int], Any]]:
    keyed: Future[dict[tuple[str, int], Any]] = Future()
    keyed.set_running_or_notify_cancel()

    def done(finished: Future[dict[TopicPartition, Any]]) -> None:
        error = finished.exception()
        if error is not None:
            keyed.set_exception(error)
            return
        answers = Answers()
        epochs = answers.leader_epochs
        for tp, answer in finished.result().items():
            key = (tp.topic, tp.partition)
            # Offsets first: errors are the rare case.
            if type(answer) is ListOffsetsResultInfo:
                answers[key] = answer.offset
                if answer.leader_epoch is not None:
                    epochs[key] = answer.leader_epoch
            else:
                answers[key] = _error(answer)
        keyed.set_result(_unknown_as_errors(answers))

    raw.add_done_callback(done)
    return keyed


def _unknown_as_errors(answers: Answers) -> Answers:
    """Every answer that is not an offset Kafka gave (kafka_evidence rule 5) becomes the
    error it is: librdkafka answers -1001 for a partition whose leader it cannot reach
    (seen while a leader was SIGKILLed), and the emitter once proposed IDLE@-1001. It is
    LEADER_NOT_AVAILABLE: retriable (the planner asks again, or waits for the next
    trigger), and a leader error (the emitter fetches metadata before its next poll)."""
    unknown = [
        key
        for key, answer in answers.items()
        if type(answer) is int and not kafka_evidence.known_offset(answer)
    ]
    for key in unknown:
        answers[key] = KafkaError(
            KafkaError.LEADER_NOT_AVAILABLE,
            f"no offset in the answer ({answers[key]}): unknown, not an offset",
        )
    return answers


def _error(answer: Any) -> Any:
    if isinstance(answer, KafkaException):
        return answer.args[0]
    if isinstance(answer, KafkaError):
        return answer
    return int(answer.offset)  # a subclass of ListOffsetsResultInfo, should one appear


# ListOffsets errors Kafka's protocol marks retriable (a RetriableException in the Java
# client) that librdkafka's admin result does not flag ``retriable()``: what a partition
# answers while it is being created or its leader moves.
_RETRIABLE_NAMES = (
    "NOT_LEADER_FOR_PARTITION",
    "LEADER_NOT_AVAILABLE",
    "UNKNOWN_TOPIC_OR_PART",
    "REPLICA_NOT_AVAILABLE",
    "OFFSET_NOT_AVAILABLE",
    "FENCED_LEADER_EPOCH",
    "UNKNOWN_LEADER_EPOCH",
    "NOT_ENOUGH_REPLICAS",
    "KAFKA_STORAGE_ERROR",
    "REQUEST_TIMED_OUT",
    # librdkafka's own, for a partition its metadata does not hold (yet, or any more: a
    # topic re-created with fewer): asked again; the planner's vanished() judges it.
    "_UNKNOWN_PARTITION",
)
RETRIABLE_ERRORS = frozenset(
    getattr(KafkaError, n) for n in _RETRIABLE_NAMES if hasattr(KafkaError, n)
)


# Answers of a client that sent the request to a leader, or a leader epoch, no longer
# current: fetching metadata again ends them (kafka_clients.refresh_leaders).
LEADER_MOVED = frozenset(
    getattr(KafkaError, n)
    for n in (
        "NOT_LEADER_FOR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    )
    if hasattr(KafkaError, n)
)


def retriable(error: KafkaError) -> bool:
    """Whether a partition's ListOffsets answer may be another next time."""
    return bool(error.retriable()) or error.code() in RETRIABLE_ERRORS
