"""One attempt to start on the control topic: create it, read it back, claim an epoch.

Kept apart from the poll loop, which retries it while the broker is away: an
attempt either returns everything the emitter continues from, or raises NotStarted,
one line saying why in the broker's words (as ``slackwater status`` says it), and
leaves nothing open behind it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from emitter.config import EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    ReadBack,
    claim_epoch,
    ensure_control_topic,
    last_marker_per_partition,
)
from emitter.detector import Detector
from slackwater import kafka_logging
from slackwater.markers import FinishRequest

log = logging.getLogger("emitter.service")  # one logger for the poll loop's lines


@dataclass
class Started:
    """The clients the emitter keeps, its epoch, and every record read back (those read
    while the epoch was being claimed included)."""

    reader: ControlTopicReader
    writer: ControlTopicWriter
    epoch: int
    read_back: ReadBack


class NotStarted(ControlTopicError):
    """A start-up attempt that failed; its text is one line saying why: a failed
    authentication by principal, a TLS handshake, a right the principal lacks, else the
    request's error with the last one a client reported; through kafka_logging.redact."""


# The clients of an attempt (kafka_clients names): the failures they report to their
# error callbacks explain the attempt's (a request after a failed authentication fails
# only as "transport failure").
_STARTUP_CLIENTS = ("admin", "control-reader", "control-writer")
# The control reader's group ids (ControlTopicReader): a consumer finds its coordinator.
_READER_GROUPS = "slackwater-control-reader-<uuid>"


def start_on_control_topic(
    admin: AdminClient,
    config: EmitterConfig,
    timeout_s: float,
    wall_ms: Callable[[], int],
    *,
    epoch_floor: int = 0,
    may_claim: Callable[[], bool] = lambda: True,
) -> Started:
    """Claims an epoch above ``epoch_floor`` too (claim_epoch). Raises NotStarted (from
    what the broker's absence raises: KafkaException, ControlTopicError, KeyError), with
    the clients it opened closed (the reader's consumer, the writer's producer: their
    threads and sockets)."""
    reader = writer = None
    topic = config.control_topic
    step = f"describe or create control topic {topic}"  # what a refusal refused
    try:
        if ensure_control_topic(admin, topic, timeout_s):
            log.info("created control topic %s (cleanup.policy=compact)", topic)
        step = f"read control topic {topic}"
        reader = ControlTopicReader(config.bootstrap_servers, topic, config.kafka_config, timeout_s)
        read_back = reader.read_to_end()
        step = f"write control topic {topic}"  # the epoch's claim
        writer = ControlTopicWriter(
            config.bootstrap_servers,
            topic,
            config.kafka_config,
            delivery_timeout_s=max(timeout_s * 2, 10.0),
        )
        epoch, meanwhile = claim_epoch(
            reader,
            writer,
            config.emitter_id,
            read_back.records,
            wall_ms=wall_ms(),
            timeout_s=max(timeout_s * 2, 10.0),
            epoch_floor=epoch_floor,
            may_claim=may_claim,
        )
    except (KafkaException, ControlTopicError, KeyError) as error:
        line = why_not_started(error, step, admin, config)
        if reader is not None:
            reader.close()
        if writer is not None:
            writer.close(0)  # a claim not delivered is not waited for again
        raise NotStarted(line) from error
    read_back.records += meanwhile.records
    read_back.malformed += meanwhile.malformed
    read_back.tombstones += meanwhile.tombstones
    return Started(reader, writer, epoch, read_back)


def why_not_started(error: Exception, step: str, admin: AdminClient, config: EmitterConfig) -> str:
    """One line for a failed attempt at ``step`` ("read control topic c"), as
    ``slackwater status`` says it: the broker's words, never a secret."""
    admin.poll(0)  # serves the admin client's error callback: an authentication is told there
    kafka = config.kafka_config
    failure = kafka_logging.take_newest_authentication_failure(_STARTUP_CLIENTS)
    if failure is not None:
        return kafka_logging.authentication_problem(failure, kafka)
    answer = kafka_error_in(error)
    if answer is not None:
        refused = kafka_logging.authorization_problem(answer, step, kafka, _READER_GROUPS)
        if refused is not None:
            return refused
    if isinstance(error, KeyError):
        words = f"control topic {config.control_topic!r} is not listed by the broker"
    else:
        words = answer.str() if answer is not None else str(error)
    last = kafka_logging.last_error()
    if last is not None and last.str() not in words:
        words = f"{words} (last: {last.str()})"
    return kafka_logging.redact(words, kafka)


# KafkaError's own text, as ControlTopicWriter.write quotes a delivery error: only as text.
_KAFKA_ERROR_TEXT = re.compile(r'KafkaError\{code=\w+,val=(-?\d+),str="(.*?)"\}')


def kafka_error_in(error: BaseException | None) -> KafkaError | None:
    """The broker's (or librdkafka's) answer behind ``error``: a KafkaException's, one
    that caused it, or one quoted in its text."""
    text = str(error)
    while error is not None:
        if (
            isinstance(error, KafkaException)
            and error.args
            and isinstance(error.args[0], KafkaError)
        ):
            return error.args[0]
        error = error.__cause__
    quoted = _KAFKA_ERROR_TEXT.search(text)
    return KafkaError(int(quoted.group(1)), quoted.group(2)) if quoted else None


def restore(detector: Detector, read_back: ReadBack, topics: Iterable[str]) -> int:
    """Continues every partition of ``topics`` from its last marker and honours pending
    finish requests; returns how many partitions had a marker. Partitions come from the
    broker and the watched topics, not from markers: a marker for a topic this emitter
    does not watch is left to whoever watches it."""
    watched = set(topics)
    latest = {
        key: marker
        for key, marker in last_marker_per_partition(read_back.records).items()
        if key[0] in watched
    }
    detector.restore(latest.values())
    for record in read_back.records:
        if isinstance(record, FinishRequest) and record.topic in watched:
            detector.request_finish(record.topic, record.partition)
    return len(latest)
