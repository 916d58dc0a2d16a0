"""The progress collector: what the last batch's readers saw, from the progress topic, for
the aligner (semantics.md §6: progress reaches the driver as records the readers produce,
keyed by task, so that retries, replays and executors on other machines agree).

Every record was acknowledged before its task ended, so once the progress topic has been
read to its end, a record still missing is either late to appear or gone: gone when
records were deleted past the position this plan reads from (the topic's retention,
while the query was down), the topic was re-created, or it is not there. Gone progress
is read as unknown (``partition_batches``); any other missing record fails the plan
after ``progressTimeoutMs``, naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from slackwater import kafka_evidence
from slackwater.markers import TopicPartitionKey
from spark_consumer.alignment import NO_OFFSET, PartitionBatch
from spark_consumer.source.driver.plan import Plan
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner_client import PLANNER_GROUP, PlannerClient
from spark_consumer.source.driver.progress_topic import ensure_progress_topic
from spark_consumer.source.shared.options import GONE_CHECK_S, SourceError, SourceOptions, channel
from spark_consumer.source.wire.offset import Offsets, SourceOffset
from spark_consumer.source.wire.progress import Progress
from spark_consumer.source.wire.splits import SyntheticPartition, TaskPartition, batch_tasks

# Under the planner's logger, whose lines these were before the planner had rooms.
log = logging.getLogger("spark_consumer.source.driver.planner").getChild("progress_collector")
# A progress record's task: the reader task's split, or the batch's synthetic row.
Task = TaskPartition | SyntheticPartition
# Each range's progress by partition, and the batch's synthetic row's under ("", -1).
Found = dict[TopicPartitionKey, Progress]


# The progress consumer's prefetch, at most (KiB): what it fetches between plans waits in
# its queue until the next plan.
PREFETCH_BOUND = {"queued.max.messages.kbytes": 1024}


class _HeldError(Exception):
    """An error a kept assignment's consumer reported: perhaps queued between plans."""


@dataclass
class _GoneCheck:
    """What the checks for gone progress saw so far in one wait."""

    # Whether the consumer had read every partition of the progress topic to its end, or
    # reported the topic missing, at the last check (a new report is checked at once).
    read_to_end: bool = False
    reported: bool = False
    # Answers in a row that the progress topic does not exist (kafka_evidence rule 2).
    missing: kafka_evidence.MissingAnswers = field(default_factory=kafka_evidence.MissingAnswers)


class ProgressCollector:
    """Waits for the progress records of a batch's tasks, with one consumer kept across
    plans; asks the broker (through ``PlannerClient``) whether missing ones are gone."""

    def __init__(self, options: SourceOptions, kafka: PlannerClient) -> None:
        self.options = options
        self._kafka = kafka
        self._consumer: Any = None
        # The consumer's assignment, kept from one wait to the next while the next plan
        # reads on from where it stopped: its records are fetched while the batch runs,
        # not after the plan asks (an assignment made at each wait cost about 10 ms of
        # every plan, docs/performance.md). Where each partition would read next, and
        # the partitions it has read to their end (no record since the end was reported:
        # librdkafka reports an end once per arrival there). None: not assigned.
        self._assigned: dict[int, int] | None = None
        self._at_end: set[int] = set()

    def collect(
        self, start: SourceOffset, plan: Plan, now: PlanAnswers | None = None
    ) -> tuple[dict[Any, PartitionBatch], int | None]:
        """What the batch that ended at ``start`` read of each partition, for the aligner,
        and Spark's id of that batch (None if unknown); its counts go to the plan
        (``now``: the plan's view of the broker, which lists the progress topic)."""
        last_ranges = start.ranges()
        waited_from = time.monotonic()
        found = self.wait_for_progress(start, plan, now)
        plan.progress_wait_ms = int((time.monotonic() - waited_from) * 1000)
        batch_ids = [seen.batch_id for seen in found.values() if seen.batch_id is not None]
        found.pop(("", -1), None)
        if found:  # summed first: one count per kind, not per partition
            seen = found.values()
            plan.count("records", sum(s.records for s in seen))
            plan.count("records_late", sum(s.late for s in seen))
            plan.count("records_unreadable", sum(s.unreadable for s in seen))
            plan.count("records_dropped", sum(s.dropped for s in seen))
            plan.count("records_lost", sum(s.lost for s in seen))
        batch = partition_batches(plan.data, last_ranges, found)
        return batch, max(batch_ids) if batch_ids else None

    def wait_for_progress(
        self, start: SourceOffset, plan: Plan, now: PlanAnswers | None = None
    ) -> Found:
        """The progress records of the last batch's tasks (and of its synthetic row)."""
        wanted = self._wanted(start)
        if not wanted:
            return {}
        if self._consumer is None:
            # Between plans it holds what it fetched: a shared topic's other queries'
            # records too, bounded here (librdkafka's default is 64 MB).
            self._consumer = self._kafka.consumer("progress", PREFETCH_BOUND)
        positions = self._positions(plan, now)
        kept = self._assigned == positions
        if not kept:  # another start (a replay, a plan not taken): from its positions
            self._assign(positions)
        before = dict(plan.progress), dict(plan.counters)
        completed = False
        try:
            try:
                found, completed = self._consume(wanted, plan, positions, kept)
            except _HeldError:
                # An error the consumer queued while it sat assigned between plans (a
                # fetch refused for a moment): the wait starts again on an assignment of
                # its own, where an error that lasts ends the plan as it always did.
                plan.progress, plan.counters = before
                self._assign(positions)
                found, completed = self._consume(self._wanted(start), plan, positions, False)
            return found
        finally:
            if not completed:  # gone, missing or failed: the next wait assigns afresh
                self._unassign()

    def _assign(self, positions: dict[int, int]) -> None:
        self._unassign()
        topic = self.options.progress_topic
        self._consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
        self._assigned = dict(positions)

    def _unassign(self) -> None:
        if self._assigned is not None:
            self._consumer.unassign()
        self._assigned = None
        self._at_end = set()

    def _consume(
        self, wanted: dict[str, Task], plan: Plan, positions: dict[int, int], kept: bool
    ) -> tuple[Found, bool]:
        """The wanted records, and whether they all came (the assignment may be kept);
        ``kept``: the assignment is the last wait's (an error may be from before)."""
        found: Found = {}
        deadline = time.monotonic() + self.options.progress_timeout_s
        at_end = self._at_end
        # When to ask the broker whether the missing records are gone: at once when the
        # consumer reports the end of every partition or a missing topic, else every
        # few seconds (a consumer assigned to a topic that does not exist may report
        # nothing at all).
        next_gone_check = time.monotonic() + GONE_CHECK_S
        gone = _GoneCheck()
        troubled = False  # the topic reported missing in this wait
        while wanted:
            if time.monotonic() > deadline:
                raise SourceError(
                    f"no progress after {self.options.progress_timeout_s:.0f}s from "
                    f"{len(wanted)} reader task(s) of the last batch, "
                    f"{_ranges_in(wanted.values())} range(s) "
                    f"({', '.join(sorted(wanted)[:5])}) on topic "
                    f"{self.options.progress_topic}: the watermark cannot advance without it"
                )
            # consume() returns when it has num_messages or at the timeout: asking for
            # what is still wanted returns as soon as it has come.
            asked = min(len(wanted), 10_000)
            messages = self._consumer.consume(num_messages=asked, timeout=0.2)
            missing_topic = self._take(messages, wanted, found, plan, kept=kept)
            # The ends reported hold once nothing more is queued (an end kept from the
            # last wait may stand before records fetched since, on another partition).
            read_to_end = len(messages) < asked and at_end >= set(positions)
            reported = missing_topic or read_to_end
            due = time.monotonic() >= next_gone_check
            if wanted and (due or (reported and not gone.reported)):
                gone.reported = reported
                gone.read_to_end = read_to_end
                next_gone_check = time.monotonic() + GONE_CHECK_S
                read_again_from = self._gone(positions, gone)
                if read_again_from is not None:
                    # Later batches' progress is written from there on: read it.
                    plan.progress = {str(p): o for p, o in read_again_from.items()}
                    plan.count("progress_lost", _ranges_in(wanted.values()))
                    return found, False
            troubled = troubled or missing_topic
        return found, not troubled

    def _take(
        self,
        messages: list[Any],
        wanted: dict[str, Task],
        found: Found,
        plan: Plan,
        *,
        kept: bool,
    ) -> bool:
        """Takes the wanted records among ``messages`` (from ``wanted`` into ``found``);
        notes the partitions read to their end; True if the topic was reported missing.
        An error on a ``kept`` assignment is _HeldError: it may be from between plans."""
        missing_topic = False
        at_end = self._at_end
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                if kafka_evidence.missing_topic_event(error):
                    missing_topic = True
                    continue
                if kept:
                    raise _HeldError(error)
                topic = self.options.progress_topic
                raise self.options.refused(
                    error, f"read progress topic {topic}", PLANNER_GROUP
                ) or SourceError(f"reading progress topic {topic}: {error}")
            at_end.discard(message.partition())
            plan.progress[str(message.partition())] = message.offset() + 1
            if self._assigned is not None:
                self._assigned[message.partition()] = message.offset() + 1
            key = (message.key() or b"").decode(errors="replace")
            task = wanted.pop(key, None)
            if task is not None:
                try:
                    found.update(task.decode_progress(message.value()))
                except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
                    # Not a reader's record (nothing of ours writes this): skipped, counted;
                    # the reader's own record is still awaited.
                    plan.count("progress_malformed")
                    wanted[key] = task
        return missing_topic

    def _positions(self, plan: Plan, now: PlanAnswers | None) -> dict[int, int]:
        """Every partition of the progress topic, from where the last plan stopped; from
        its beginning if the plan has no position for it (the topic is new, or was given
        more partitions since: readers' keyed records go to any of them), so no record
        is missed. The topic's partitions as the broker lists them now, at every wait:
        in the plan's metadata, or asked for by name where that does not list it."""
        positions = {int(p): o for p, o in plan.progress.items()}
        listed = now.progress_partitions if now is not None else None
        if listed is None:
            try:
                described = self._kafka.describe(self.options.progress_topic)
            except KafkaException:
                if not positions:
                    raise
                described = None  # the known partitions now, all of them at the next wait
            if described is not None and described.error is None:
                listed = tuple(described.partitions)
        for partition in listed or ():
            positions.setdefault(partition, OFFSET_BEGINNING)
        return positions

    def _wanted(self, start: SourceOffset) -> dict[str, Task]:
        """The progress keys of the last batch, each with the task that writes it: the
        tasks ``partitions`` made of the same offset."""
        tasks, synthetic = batch_tasks(self.options, start)
        wanted: dict[str, Task] = {task.progress_key(): task for task in tasks}
        if synthetic is not None and start.previous_threshold is not None:
            # The batch's synthetic task reports Spark's batch id (ranges do too); an
            # offset planned before it did (no previous threshold) has no such record.
            wanted[synthetic.progress_key] = synthetic
        return wanted

    def _gone(self, positions: dict[int, int], gone: _GoneCheck) -> dict[int, int] | None:
        """Whether records after the plan's positions on the progress topic are gone, and
        if so where to read it from now on; None while they may still come:

        * deleted (retention) or the topic re-created (kafka_evidence rule 4): decided
          only once the consumer has read every partition to its end without them;
        * the topic missing (rule 2: told twice in a row): made again, read from its
          start.
        """
        try:
            read_again_from = self._read_again_from(positions, gone)
        except (KafkaException, SourceError) as error:
            log.info("cannot tell whether progress is gone (%s): waiting on", error)
            return None
        if read_again_from is not None:
            log.warning(
                "progress of the last batch is gone from %s (its retention passed while the "
                "query was down, or the topic was re-created?): read as unknown, which can "
                "hold the watermark back, never make a row late",
                self.options.progress_topic,
            )
        return read_again_from

    def _read_again_from(
        self, positions: dict[int, int], gone: _GoneCheck
    ) -> dict[int, int] | None:
        topic = self.options.progress_topic
        described = self._kafka.describe(topic)
        missing = kafka_evidence.topic_missing(described)
        if gone.missing.answer(missing):
            ensure_progress_topic(self._kafka)
            return {}
        if missing or described.error is not None or not gone.read_to_end:
            return None  # the broker cannot tell now, or the records may still come
        partitions = [(topic, p) for p in described.partitions]
        earliest = self._kafka.list_offsets(partitions, "earliest", wait_for_all=True)
        latest = self._kafka.list_offsets(partitions, "latest", wait_for_all=True)
        read_again_from: dict[int, int] = {}
        for key in partitions:
            position = max(0, positions.get(key[1], 0))
            gone_now = kafka_evidence.records_gone(position, earliest[key], latest[key], position)
            read_again_from[key[1]] = earliest[key] if gone_now is not None else position
        if all(read_again_from[p] == max(0, positions.get(p, 0)) for _, p in partitions):
            return None  # nothing deleted: a record still missing is late, not gone
        return read_again_from

    def close(self) -> None:
        self._assigned, self._at_end = None, set()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def partition_batches(
    data: Offsets, last_ranges: list[tuple[str, int, int, int]], found: Found
) -> dict[Any, PartitionBatch]:
    """What the last batch read of each partition, for the aligner.

    A range whose progress is gone (the progress topic's retention passed while the
    query was down) counts as unknown, read the conservative way: no event time (its
    watermark does not move) and records up to its last offset (an IDLE marker inside
    it is taken as contradicted by data, so the partition stays ACTIVE). Missing
    progress can hold the watermark back, never make a record late.
    """
    lost = (
        {(t, p): (a, b) for t, p, a, b in last_ranges if (t, p) not in found}
        if len(found) < len(last_ranges)
        else {}
    )
    batch: dict[Any, PartitionBatch] = {}
    for topic, partitions in data.items():
        for partition, read_position in partitions.items():
            key = (topic, int(partition))
            if lost and key in lost:
                first, end = lost[key]
                batch[channel(topic, partition)] = PartitionBatch(
                    records=end - first, max_offset=end - 1, read_position=read_position
                )
                continue
            seen = found.get(key)
            batch[channel(topic, partition)] = (
                PartitionBatch(seen.records, seen.max_event_time_ms, seen.max_offset, read_position)
                if seen is not None
                else PartitionBatch(0, None, NO_OFFSET, read_position)
            )
    return batch


def _ranges_in(tasks: Iterable[Task]) -> int:
    return sum(len(task.ranges) for task in tasks if isinstance(task, TaskPartition))
