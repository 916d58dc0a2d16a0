"""One attempt to start on the control topic: create it, read it back, claim an epoch.

Kept apart from the poll loop, which retries it while the broker is away: an
attempt either returns everything the emitter continues from, or raises and
leaves nothing open behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from emitter.config import EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    ReadBack,
    claim_epoch,
    ensure_control_topic,
)

log = logging.getLogger("emitter.service")  # one logger for the poll loop's lines


@dataclass
class Started:
    """The clients the emitter keeps, its epoch, and every record read back (those read
    while the epoch was being claimed included)."""

    reader: ControlTopicReader
    writer: ControlTopicWriter
    epoch: int
    read_back: ReadBack


def start_on_control_topic(
    admin: AdminClient, config: EmitterConfig, timeout_s: float, wall_ms: Callable[[], int]
) -> Started:
    """Raises what the broker's absence raises (KafkaException, ControlTopicError,
    KeyError), with the reader it opened closed (its consumer's threads and sockets)."""
    reader = None
    try:
        if ensure_control_topic(admin, config.control_topic, timeout_s):
            log.info("created control topic %s (cleanup.policy=compact)", config.control_topic)
        reader = ControlTopicReader(
            config.bootstrap_servers,
            config.control_topic,
            config.kafka_config,
            timeout_s,
        )
        read_back = reader.read_to_end()
        writer = ControlTopicWriter(
            config.bootstrap_servers,
            config.control_topic,
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
        )
    except (KafkaException, ControlTopicError, KeyError):
        if reader is not None:
            reader.close()
        raise
    read_back.records += meanwhile.records
    read_back.malformed += meanwhile.malformed
    read_back.tombstones += meanwhile.tombstones
    return Started(reader, writer, epoch, read_back)
