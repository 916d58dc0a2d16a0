"""The control-topic reader: the emitter's markers, read once each, up to the ends one
plan looked at, offered to the aligner (which applies them once the read position
reaches their offset, and fences older epochs); markers for partitions the broker does
not list yet are held in the plan until they appear.

Every partition of the control topic is read, those added while the query runs too
(its partitions come from the plan's metadata, each read from its start), and the
markers of one read are offered in the protocol's order (``markers.in_protocol_order``),
not in the order the partitions' records interleaved: an emitter writes to partition 0
alone (``markers.CONTROL_PARTITION``), whose log order stays the order, but an old
deployment's hashed keys or a user's writes may sit in others."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from slackwater.markers import (
    MalformedControlRecord,
    Marker,
    Tombstone,
    decode,
    in_protocol_order,
)
from spark_consumer.source.driver.partition_identity import PartitionIdentity
from spark_consumer.source.driver.plan import Plan
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner_client import PLANNER_GROUP, PlannerClient
from spark_consumer.source.shared.options import MAX_HELD_MARKERS, SourceError, SourceOptions

# Under the planner's logger, whose lines these were before the planner had rooms.
log = logging.getLogger("spark_consumer.source.driver.planner").getChild("control_reader")


class ControlReader:
    """Reads the control topic for the planner, with one consumer kept across plans."""

    def __init__(
        self,
        options: SourceOptions,
        kafka: PlannerClient,
        identity: PartitionIdentity,
        channel_of: Callable[[Marker], str | None],
    ) -> None:
        self.options = options
        self._kafka = kafka
        self._identity = identity
        self._channel_of = channel_of
        self._consumer: Any = None
        self._warned_missing = False

    def read(self, plan: Plan, now: PlanAnswers, ends: dict[str, int] | None = None) -> None:
        """Reads the control topic from the plan's position up to its log ends when the
        plan looked at the broker (none: the topic does not exist), or up to ``ends``
        (a run under availableNow: those it started with)."""
        ends = now.control_ends if ends is None else ends
        topic = self.options.control_topic
        if topic is None:
            return
        if not ends:
            if not self._warned_missing:
                log.warning(
                    "control topic %s does not exist: the valve works on data alone until it does",
                    topic,
                )
                self._warned_missing = True
            return
        self._follow_ends(plan, now)
        todo = {p: end for p, end in ends.items() if plan.control[p] < end}
        if not todo:
            return
        malformed: list[str] = []
        markers: list[tuple[int, Marker]] = []  # (control partition, marker), as read
        if self._consumer is None:
            self._consumer = self._kafka.consumer("control")
        self._consumer.assign([TopicPartition(topic, int(p), plan.control[p]) for p in todo])
        deadline = time.monotonic() + self.options.read_timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise SourceError(f"timed out reading control topic {topic} up to {ends}")
            for message in self._consumer.consume(num_messages=10_000, timeout=0.2):
                self._take(plan, message, ends, todo, malformed=malformed, markers=markers)
        self._consumer.unassign()
        for marker in in_protocol_order(markers):
            self._offer(plan, marker)
        if malformed:
            log.warning(
                "skipped %d malformed control record(s) on %s (first: %s)",
                len(malformed),
                topic,
                malformed[0],
            )

    def _follow_ends(self, plan: Plan, now: PlanAnswers) -> None:
        """A partition whose offsets went back (``PartitionIdentity.control_went_back``: the
        control topic was re-created or truncated, on Kafka's evidence) is read again
        from its start, and the epochs of a new emitter history are taken as they come.
        One below the position without that evidence stands still."""
        for partition in now.control_ends:
            plan.control.setdefault(partition, 0)
        for partition in self._identity.control_went_back(plan.control, now):
            log.warning(
                "control topic %s[%s] is a new log (re-created, or truncated below this "
                "query's position %d): reading it again from its start",
                self.options.control_topic,
                partition,
                plan.control[partition],
            )
            plan.control[partition] = 0
            plan.aligner.forget_epochs()
            plan.count("control_went_back")

    def _take(
        self,
        plan: Plan,
        message: Any,
        ends: dict[str, int],
        todo: dict[str, int],
        *,
        malformed: list[str],
        markers: list[tuple[int, Marker]],
    ) -> None:
        """One consumed message: a position moved, a partition done, a record taken."""
        error = message.error()
        partition = str(message.partition())
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                topic = self.options.control_topic
                raise self.options.refused(
                    error, f"read control topic {topic}", PLANNER_GROUP
                ) or SourceError(f"reading control topic {topic}: {error}")
            # Never past the ends this plan read up to: a record written since (after
            # the ends) is read by the next plan, never skipped.
            eof = min(message.offset(), ends[partition])
            plan.control[partition] = max(plan.control[partition], eof)
            if plan.control[partition] >= ends[partition]:
                todo.pop(partition, None)
            return
        if message.offset() >= ends[partition]:
            todo.pop(partition, None)
            return
        plan.control[partition] = message.offset() + 1
        if plan.control[partition] >= ends[partition]:
            todo.pop(partition, None)
        self._take_record(plan, message, malformed, markers)

    def _take_record(
        self, plan: Plan, message: Any, malformed: list[str], markers: list[tuple[int, Marker]]
    ) -> None:
        try:
            record = decode(message.key(), message.value())
        except Tombstone:
            plan.count("control_tombstones")  # compaction's deletion: not malformed
            return
        except MalformedControlRecord as reason:
            plan.count("control_malformed")
            malformed.append(f"{message.offset()}: {reason}")
            return
        if isinstance(record, Marker):
            plan.count("markers_read")
            # Offered once the read is whole, in the protocol's order.
            markers.append((message.partition(), record))

    def _offer(self, plan: Plan, marker: Marker) -> None:
        """Channels come from the broker, not from markers: a marker for a partition the
        broker does not list (yet) is held aside, bounded, until it appears."""
        channel_id = self._channel_of(marker)
        if channel_id is None or channel_id in plan.aligner.partitions:
            plan.aligner.offer(marker)  # (a topic not read here is rejected and counted)
        elif len(plan.held) < MAX_HELD_MARKERS:
            plan.held.append(marker.model_dump(mode="json"))
        else:
            plan.count("markers_held_dropped")

    def release_held(self, plan: Plan) -> None:
        """Held markers whose partition the broker now lists join their channel."""
        still_held = []
        for raw in plan.held:
            marker = Marker.model_validate_json(json.dumps(raw))
            if self._channel_of(marker) in plan.aligner.partitions:
                plan.aligner.offer(marker)
            else:
                still_held.append(raw)
        plan.held = still_held

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
