"""The source's planner, on the driver (Spark calls it in a Python process of its own).

The driver side (``latestOffset``) runs semantics.md §6's steps in order: the previous
batch's progress (records, newest event time per range, produced by the readers to a
progress topic) advances the channels; new markers are read from the control topic
and applied once the read position (the end of the last batch whose progress arrived)
reaches their offset; the valve's output is planned into this batch's synthetic row.
The offset it returns records the data end offsets, the control and progress topic
positions and the aligner/valve state: Spark logs it before running the batch, so a
replay plans the same row and a restart continues from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from slackwater import kafka_clients, kafka_logging, list_offsets
from slackwater.kafka_logging import once_per_interval
from slackwater.markers import MalformedControlRecord, Marker, Tombstone, decode
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.source.offset import (
    OffsetFormatError,
    Offsets,
    SourceOffset,
    ranges,
)
from spark_consumer.source.options import (
    MAX_HELD_MARKERS,
    SOURCE_CLIENT,
    SourceError,
    SourceOptions,
    channel,
)
from spark_consumer.source.progress import Progress, synthetic_progress_key
from spark_consumer.source.readers import GONE_CHECK_S, read_synthetic, read_task
from spark_consumer.source.splits import (
    SyntheticPartition,
    TaskPartition,
    group_ranges,
)
from spark_consumer.valve import MIN_WATERMARK

log = logging.getLogger(__name__)
# How long a partition must be missing from the broker's metadata before it leaves.
VANISHED_AFTER_S = 5.0
# How long a log end must stay below the read position before the offsets count as gone
# back (a re-created or truncated topic): one answer below it stopped a test's query
# once while leaders were killed and nothing was truncated, and acting on it is final.
WENT_BACK_AFTER_S = 5.0
# What reading a topic that does not exist (any more) answers.
_MISSING_TOPIC_ERRORS = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
# The planner's consumers read by assignment and commit nothing; librdkafka still finds
# this group's coordinator (docs/deploy.md's ACLs allow Describe on it).
PLANNER_GROUP = "slackwater-source-planner"
# Repeats while the broker is away, or refuses a topic: one line per kind per 30 s.
log_refused = once_per_interval(f"{__name__}.refused")
log_unreachable = once_per_interval(f"{__name__}.connection")

# --------------------------------------------------------------------------- planner


@dataclass
class _Plan:
    """The driver's view between two ``latestOffset`` calls (all of it in the offset)."""

    data: Offsets
    control: dict[str, int]
    progress: dict[str, int]
    aligner: MarkerAligner
    counters: dict[str, int] = field(default_factory=dict)
    # How long planning waited for the readers' progress (informational, not compared).
    progress_wait_ms: int = 0
    # Markers (JSON) for partitions the broker does not list yet.
    held: list[dict[str, Any]] = field(default_factory=list)
    # The query's identity, made with its first offset: its progress keys carry it.
    query: str = ""


class SlackwaterStreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # This planner's clients' name: the failed authentication it takes is its own,
        # never another query's in the same driver (kafka_logging keys them by name).
        self._client_name = f"{SOURCE_CLIENT}.planner#{uuid.uuid4().hex[:8]}"
        self._admin: Any = None
        self._control_consumer: Any = None
        self._progress_consumer: Any = None
        self._warned_missing_control = False
        # Whether this reader has planned yet: its first plan restores a checkpoint.
        self._planned = False
        # Whether partitions() made sure the progress topic exists (a replay after a
        # restart runs before any plan).
        self._progress_topic_checked = False
        # Partitions the broker stopped listing, since when (monotonic s): they leave
        # the reading only once their absence lasts (_vanished).
        self._absent_since: dict[tuple[str, int], float] = {}
        self._low_since: dict[tuple[str, int], float] = {}  # log end below the position
        # The offset this planner returned last, and the aligner state it left there
        # (None once a plan has begun changing it): the next call usually starts from
        # that offset and need neither decode it nor rebuild the state from JSON.
        self._last: tuple[SourceOffset, MarkerAligner | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the options only: Kafka clients stay with the planner."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # ---------------------------------------------------------------- Kafka clients

    def _admin_client(self) -> Any:
        if self._admin is None:
            self._admin = kafka_clients.admin_client(
                self._client_name, self.options.bootstrap_servers, self.options.kafka_config
            )
        return self._admin

    def _consumer(self) -> Any:
        return kafka_clients.consumer(
            self._client_name,
            self.options.bootstrap_servers,
            self.options.kafka_config,
            {
                "group.id": PLANNER_GROUP,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            },
        )

    def _partition_counts(self) -> dict[str, int]:
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        return self._subscribed(metadata)

    def _subscribed(self, metadata: Any, planned: Collection[str] = ()) -> dict[str, int]:
        """Partition counts of the subscribed topics the broker lists (``planned``: the
        topics the query has read, see _not_refused)."""
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
            self._admin_client(),
            kafka_clients.not_listed(metadata, named),
            self.options.request_timeout_s,
        )
        for topic, error in answers.items():
            kind = "control topic" if topic == control else "topic"
            refused = error and self.options.refused(error, f"describe {kind} {topic}")
            if not refused:
                continue
            if topic == control or topic in planned:
                raise refused
            log_refused.warning("%s: waiting for it (no data from it until then)", refused)

    def _list_offsets(
        self, partitions: list[tuple[str, int]], spec_name: str, *, wait_for_all: bool = False
    ) -> dict[tuple[str, int], int]:
        """Offsets of the partitions that have one now. A partition just created or
        moving leader answers with an error Kafka's protocol calls retriable: it is left
        out, and stands still until the next trigger, or with ``wait_for_all`` asked
        again until the request timeout."""
        deadline = time.monotonic() + self.options.request_timeout_s
        offsets, not_ready = self._list_offsets_once(partitions, spec_name)
        while wait_for_all and not_ready and time.monotonic() < deadline:
            time.sleep(0.5)
            # A leader that moved is refused with the epoch the client cached until it
            # fetches metadata (kafka_clients.refresh_leaders says why).
            remaining_s = max(0.1, deadline - time.monotonic())
            kafka_clients.refresh_leaders(self._admin_client(), remaining_s)
            more, not_ready = self._list_offsets_once(list(not_ready), spec_name)
            offsets.update(more)
        if not_ready:
            where = ", ".join(f"{t}[{p}] ({name})" for (t, p), name in list(not_ready.items())[:5])
            if wait_for_all:
                raise SourceError(
                    f"{spec_name} offsets not available after "
                    f"{self.options.request_timeout_s:.0f}s: {where}"
                )
            log.info("offsets not ready, retried next trigger: %s", where)
        return offsets

    def _list_offsets_once(
        self, partitions: list[tuple[str, int]], spec_name: str
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], str]]:
        from confluent_kafka import IsolationLevel, KafkaError
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}, {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.options.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        answers = list_offsets.submit(
            self._admin_client(),
            list_offsets.Request(partitions, getattr(OffsetSpec, spec_name)()),
            timeout_s=self.options.request_timeout_s,
            isolation_level=isolation,
        ).result(timeout=self.options.request_timeout_s)
        offsets: dict[tuple[str, int], int] = {}
        not_ready: dict[tuple[str, int], str] = {}
        for (topic, partition), answer in answers.items():
            if isinstance(answer, KafkaError):
                if not list_offsets.retriable(answer):
                    raise self.options.refused(answer, f"describe topic {topic}") or SourceError(
                        f"{spec_name} offset of {topic}[{partition}]: {answer}"
                    )
                not_ready[(topic, partition)] = answer.name()
                continue
            offsets[(topic, partition)] = answer
        return offsets, not_ready

    def _ensure_progress_topic(self) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        name = self.options.progress_topic
        admin = self._admin_client()
        timeout_s = self.options.request_timeout_s
        if not kafka_clients.not_listed(admin.list_topics(timeout=timeout_s), [name]):
            return
        # Not listed: not there, or there but not the principal's to describe (a broker
        # lists only those): asked for by name, a refusal says Describe, not Create.
        answer = kafka_clients.asked_by_name(admin, [name], timeout_s)[name]
        if answer is None:
            return
        refused = self.options.refused(answer, f"describe progress topic {name}")
        if refused:
            raise refused
        # Time retention of its own (a restart needs only the last batch's records, and
        # copes without them): the broker's default may be infinite or size-only.
        config = {
            "cleanup.policy": "delete",
            "retention.ms": str(self.options.progress_retention_ms),
        }
        made = NewTopic(name, num_partitions=1, replication_factor=-1, config=config)
        try:
            kafka_clients.create_topic(admin, made, timeout_s)
        except KafkaException as error:
            raise self.options.refused(
                error.args[0], f"create progress topic {name}"
            ) or SourceError(f"cannot create progress topic {name!r}: {error}") from error

    def _topic_ends(self, topic: str) -> dict[str, int]:
        """The log end of every partition of a topic; empty if the topic does not exist.
        Waits for a partition just created (the progress topic at the first start)."""
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            return {}
        ends = self._list_offsets(
            [(topic, p) for p in described.partitions], "latest", wait_for_all=True
        )
        return {str(p): end for (_, p), end in ends.items()}

    # ---------------------------------------------------------------- offsets

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        # Without a broker there is no first offset: ask until it answers, saying so.
        while True:
            try:
                self._admin_client().list_topics(timeout=min(5.0, self.options.request_timeout_s))
                self._ensure_progress_topic()
                counts = self._partition_counts()
                break
            except KafkaException as error:
                self._unreachable(error)
                time.sleep(1.0)
        partitions = [(t, p) for t, count in counts.items() for p in range(count)]
        starting = self._list_offsets(partitions, self.options.starting_offsets, wait_for_all=True)
        data: Offsets = {}
        for (topic, partition), offset in starting.items():
            data.setdefault(topic, {})[str(partition)] = offset
        aligner = self._new_aligner()
        aligner.ensure_partitions(channel(t, p) for t, p in sorted(starting))
        control = (
            {p: 0 for p in self._topic_ends(self.options.control_topic)}
            if self.options.control_topic
            else {}
        )
        plan = _Plan(
            data=data,
            control=control,
            progress=self._topic_ends(self.options.progress_topic),
            aligner=aligner,
            query=uuid.uuid4().hex,
        )
        first = _offset(
            plan,
            from_data=data,
            planned=MIN_WATERMARK,
            late_threshold=MIN_WATERMARK,
            max_event_time_ahead_ms=self.options.max_event_time_ahead_ms,
            tasks=self.options.tasks_per_batch,
        )
        return self._returned(first)

    def latestOffset(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        start = self._decoded(start_json)
        try:
            now = self._observe(start.data.keys())
        except KafkaException as error:
            self._unreachable(error)
            return start_json  # no batch while the broker is away; the query keeps running
        self._authentication_failure()  # the broker answered: one before is history
        if _nothing_new_since(start, now) and self.options.consumer_idle_timeout_ms is None:
            return start_json  # the common idle trigger: no state to restore or write
        plan = self._restore(start)
        # 1. The previous batch's progress advances the channels' watermarks; its end
        #    offsets are now the read positions.
        last_ranges = start.ranges()
        waited_from = time.monotonic()
        progress = self._wait_for_progress(start, plan)
        plan.progress_wait_ms = int((time.monotonic() - waited_from) * 1000)
        batch_ids = [seen.batch_id for seen in progress.values() if seen.batch_id is not None]
        start_batch_id = max(batch_ids) if batch_ids else None
        progress.pop(("", -1), None)
        batch = _partition_batches(plan.data, last_ranges, progress)
        for seen in progress.values():
            _count(plan, "records", seen.records)
            _count(plan, "records_late", seen.late)
            _count(plan, "records_unreadable", seen.unreadable)
            _count(plan, "records_dropped", seen.dropped)
            _count(plan, "records_lost", seen.lost)
        # Partitions that appeared join as channels (with the markers held for them), and
        # partitions whose offsets went back follow failOnDataLoss: before the markers,
        # so that a marker for a partition that just appeared applies in this plan.
        self._follow_partitions(plan, now, batch)
        # 2. New markers are read, 3. and applied once the read position reaches them.
        self._read_markers(plan, now.control_ends)
        # The consumer-side idle timeout (off by default) counts wall time between plans;
        # a replay uses the logged offset, so this never makes a replay differ.
        now_ms = time.time_ns() // 1_000_000 if self.options.consumer_idle_timeout_ms else None
        plan.aligner.advance(batch, now_ms)
        # Partitions gone from the broker (their last batch applied first) leave the valve.
        self._drop_vanished(plan, now)
        # 4. The data to read next.
        ends = self._data_ends(plan, limit, now)
        planned = plan.aligner.valve.watermark
        offset = _offset(
            plan,
            from_data=plan.data,
            planned=planned,
            late_threshold=start.watermark,
            data=ends,
            previous_threshold=start.late_threshold,
            previous_batch_id=start_batch_id,
            max_event_time_ahead_ms=self.options.max_event_time_ahead_ms,
            tasks=self.options.tasks_for(_records_between(plan.data, ends)),
        )
        if _same_batch(start, offset):
            self._last = (start, plan.aligner)  # still start's state
            return start_json  # nothing new: no batch
        return self._returned(offset, plan.aligner)

    def _decoded(self, raw: dict[str, Any]) -> SourceOffset:
        """An offset Spark handed back; the one this planner returned last is not read
        again (at 10,000 partitions, decoding is tens of milliseconds)."""
        last = self._last
        if last is not None and last[0].plan_id and raw.get("plan_id") == last[0].plan_id:
            return last[0]
        try:
            return SourceOffset.decode(raw)
        except OffsetFormatError as error:
            raise SourceError(str(error)) from error

    def _returned(
        self, offset: SourceOffset, aligner: MarkerAligner | None = None
    ) -> dict[str, Any]:
        self._last = (offset, aligner)
        return offset.encode()

    def _follow_partitions(
        self, plan: _Plan, now: _BrokerView, batch: dict[Any, PartitionBatch]
    ) -> None:
        """The plan's partitions made to match the broker's (semantics.md §6).

        * A partition the broker lists that the plan does not (a new topic or partition)
          starts at its earliest offset, as a new channel.
        * A log end below the read position: the offsets went back (the topic was
          re-created, or truncated); failOnDataLoss stops the query, or the partition
          starts again at its earliest offset.
        """
        went_back = self._offsets_went_back(plan, now)
        listed = [(t, p) for t, count in now.counts.items() for p in range(count)]
        new = [(t, p) for t, p in listed if str(p) not in plan.data.get(t, {})]
        starts = self._list_offsets(new + went_back, "earliest")
        new_set = set(new)
        for (topic, partition), offset in starts.items():
            if (topic, partition) in new_set:
                plan.data.setdefault(topic, {})[str(partition)] = offset  # a new range starts here
                continue
            # Offsets that went back (failOnDataLoss=false): read again from the earliest
            # (one whose earliest is not known yet stands still until it is).
            log.warning(
                "data loss: %s[%d]'s offsets went back; reading again from %d "
                "(failOnDataLoss=false)",
                topic,
                partition,
                offset,
            )
            plan.data[topic][str(partition)] = offset
            plan.aligner.restart_at(channel(topic, partition), offset)
            batch.pop(channel(topic, partition), None)
            _count(plan, "offsets_went_back")
        # (The aligner has a channel for every partition the plan reads: only new ones.)
        positions: dict[Hashable, int] = {
            channel(t, p): plan.data[t][str(p)] for t, p in new if str(p) in plan.data.get(t, {})
        }
        plan.aligner.ensure_partitions(positions, positions)
        self._release_held(plan)

    def _drop_vanished(self, plan: _Plan, now: _BrokerView) -> None:
        """Partitions the broker no longer lists leave the reading and count as FINISHED,
        what the emitter's FINISHED@log_end says of a deleted topic: a topic missing from
        the metadata, or partitions past a topic's count (re-created with fewer).

        One answer is not enough: a topic also goes missing from an all-topics answer
        when the principal loses DESCRIBE, or from a broker behind on metadata. A
        partition leaves once it has been missing for ``VANISHED_AFTER_S`` and, for a
        whole topic, a request for that topic answers that it does not exist.
        """
        if not self._absent_since and all(
            topic in now.counts and len(partitions) <= now.counts[topic]
            for topic, partitions in plan.data.items()
        ):
            return  # every partition read is listed (partitions are numbered from 0)
        missing = {
            (topic, int(partition))
            for topic, partitions in plan.data.items()
            if topic not in now.counts
            for partition in partitions
            if topic not in now.listed
        } | {
            (topic, int(partition))
            for topic, count in now.counts.items()
            for partition in plan.data.get(topic, {})
            if int(partition) >= count
        }
        moment = time.monotonic()
        self._absent_since = {key: self._absent_since.get(key, moment) for key in missing}
        due = [k for k, since in self._absent_since.items() if moment - since >= VANISHED_AFTER_S]
        confirmed: dict[str, bool] = {}
        for topic, partition in sorted(due):
            if topic not in now.listed:
                if topic not in confirmed:
                    confirmed[topic] = self._topic_does_not_exist(topic)
                if not confirmed[topic]:
                    continue
            plan.data[topic].pop(str(partition))
            if not plan.data[topic]:
                del plan.data[topic]
            del self._absent_since[(topic, partition)]
            plan.aligner.finish(channel(topic, partition))
            _count(plan, "partitions_deleted")
            log.warning(
                "%s[%d] is gone from the broker (topic deleted or re-created with fewer "
                "partitions): it counts as FINISHED",
                topic,
                partition,
            )

    def _topic_does_not_exist(self, topic: str) -> bool:
        """A request for this topic alone answers UNKNOWN_TOPIC_OR_PART."""
        try:
            metadata = self._admin_client().list_topics(
                topic, timeout=self.options.request_timeout_s
            )
        except KafkaException:
            return False
        described = metadata.topics.get(topic)
        return (
            described is not None
            and described.error is not None
            and described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )

    def _offsets_went_back(self, plan: _Plan, now: _BrokerView) -> list[tuple[str, int]]:
        """Partitions whose log end has been below the read position for
        ``WENT_BACK_AFTER_S``, at every trigger; until then they stand still (a batch
        never reads past its start). failOnDataLoss=true stops the query at the first."""
        low = {
            (topic, int(partition)): position
            for topic, partitions in plan.data.items()
            for partition, position in partitions.items()
            if now.latest.get((topic, int(partition)), position) < position
        }
        moment = time.monotonic()
        for key in low.keys() - self._low_since.keys():
            log.warning(
                "%s[%d]'s log end %d is below this query's position %d: it stands still, "
                "and counts as gone back (re-created or truncated) if it stays so for %.0fs",
                *key,
                now.latest[key],
                low[key],
                WENT_BACK_AFTER_S,
            )
        self._low_since = {key: self._low_since.get(key, moment) for key in low}
        went_back = sorted(
            key for key, since in self._low_since.items() if moment - since >= WENT_BACK_AFTER_S
        )
        for key in went_back:
            del self._low_since[key]
        if went_back and self.options.fail_on_data_loss:
            topic, number = went_back[0]
            raise SourceError(
                f"data loss: {topic}[{number}]'s log end went back from "
                f"{plan.data[topic][str(number)]} to {now.latest[(topic, number)]} (the "
                "topic was re-created or truncated): records this query had not read may be "
                "gone; the option failOnDataLoss=false starts again at its earliest offset"
            )
        return went_back

    def _unreachable(self, error: KafkaException) -> None:
        """The broker did not answer: said (rate-limited), and the plan waits for it. A
        failed authentication ends the query instead, in one line naming the principal:
        retrying cannot mend credentials, and a query that only waited would look like
        one whose broker is down."""
        failure = self._authentication_failure()
        if failure is not None:
            raise SourceError(
                kafka_logging.authentication_problem(failure, self.options.kafka_config)
            ) from error
        log_unreachable.warning(
            "cannot reach Kafka at %s (%s): no new batch until it answers",
            self.options.bootstrap_servers,
            error.args[0].str() if error.args else error,
        )

    def _authentication_failure(self) -> KafkaError | None:
        """The failed authentication librdkafka reported since the last call, taken.
        Served first: the error callback runs only in a poll (so do log lines, which
        would queue up otherwise)."""
        self._admin_client().poll(0)
        return kafka_logging.take_authentication_failure(self._client_name)

    def _observe(self, planned: Collection[str]) -> _BrokerView:
        """One metadata request and one ListOffsets round for the whole plan: the
        subscribed topics' partitions and log ends, and the control topic's ends."""
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        counts = self._subscribed(metadata, planned)
        wanted = [(t, p) for t, count in counts.items() for p in range(count)]
        control = self.options.control_topic
        if control is not None:
            wanted += [
                (control, p)
                for p in range(kafka_clients.partition_counts(metadata, [control]).get(control, 0))
            ]
        latest = self._list_offsets(wanted, "latest")
        control_ends = {str(p): end for (t, p), end in latest.items() if t == control}
        return _BrokerView(counts, frozenset(metadata.topics), latest, control_ends)

    def _restore(self, offset: SourceOffset) -> _Plan:
        last = self._last
        if last is not None and last[1] is not None and last[0].plan_id == offset.plan_id:
            aligner = last[1]  # the state this planner left in that offset: no restore
            self._last = (last[0], None)  # changed from here on
        else:
            aligner = MarkerAligner.restore(offset.aligner, channel_of=self._channel_of)
        if not self._planned:
            # This reader's first plan: the query (re)started from its checkpoint.
            aligner.restart_idle_clocks()
            self._planned = True
        # The option as the query runs now (it may have changed since the checkpoint).
        aligner.consumer_idle_timeout_ms = self.options.consumer_idle_timeout_ms
        return _Plan(
            data={t: dict(p) for t, p in offset.data.items()},
            control=dict(offset.control),
            progress=dict(offset.progress),
            aligner=aligner,
            counters=dict(offset.counters),
            held=list(offset.held),
            query=offset.query,
        )

    def _new_aligner(self) -> MarkerAligner:
        return MarkerAligner(
            None,
            self.options.max_out_of_orderness_ms,
            consumer_idle_timeout_ms=self.options.consumer_idle_timeout_ms,
            channel_of=self._channel_of,
        )

    def _channel_of(self, marker: Marker) -> str | None:
        return (
            channel(marker.topic, marker.partition)
            if self.options.subscribes(marker.topic)
            else None
        )

    def _data_ends(self, plan: _Plan, limit: ReadLimit, now: _BrokerView) -> Offsets:
        latest = now.latest
        ends: Offsets = {}
        for topic, partitions in plan.data.items():
            for partition, begin in partitions.items():
                # Never go backwards from what was read (offsets that went back stand
                # still until their earliest offset is known: _follow_partitions).
                end = max(begin, latest.get((topic, int(partition)), begin))
                ends.setdefault(topic, {})[partition] = end
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limit(plan.data, ends, limit.max_rows)
        return ends

    # ---------------------------------------------------------------- control topic

    def _read_markers(self, plan: _Plan, ends: dict[str, int]) -> None:
        """Reads the control topic from the plan's position up to ``ends``."""
        from confluent_kafka import KafkaError, TopicPartition

        topic = self.options.control_topic
        if topic is None:
            return
        if not ends:
            if not self._warned_missing_control:
                log.warning(
                    "control topic %s does not exist: the valve works on data alone until it does",
                    topic,
                )
                self._warned_missing_control = True
            return
        for partition, end in ends.items():
            plan.control.setdefault(partition, 0)
            if plan.control[partition] > end:
                # The control topic was re-created (or truncated): read it again from its
                # start, and take the epochs of a new emitter history as they come.
                log.warning(
                    "control topic %s[%s] ends at %d, before this query's position %d: "
                    "re-created? reading it again from its start",
                    topic,
                    partition,
                    end,
                    plan.control[partition],
                )
                plan.control[partition] = 0
                plan.aligner.forget_epochs()
                _count(plan, "control_went_back")
        todo = {p: end for p, end in ends.items() if plan.control[p] < end}
        if not todo:
            return
        malformed: list[str] = []
        if self._control_consumer is None:
            self._control_consumer = self._consumer()
        consumer = self._control_consumer
        consumer.assign([TopicPartition(topic, int(p), plan.control[p]) for p in todo])
        deadline = time.monotonic() + self.options.read_timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise SourceError(f"timed out reading control topic {topic} up to {ends}")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                error = message.error()
                partition = str(message.partition())
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        # Never past the ends this plan read up to: a record written
                        # since (after the ends) is read by the next plan, never skipped.
                        eof = min(message.offset(), ends[partition])
                        plan.control[partition] = max(plan.control[partition], eof)
                        if plan.control[partition] >= ends[partition]:
                            todo.pop(partition, None)
                        continue
                    raise self.options.refused(
                        error, f"read control topic {topic}", PLANNER_GROUP
                    ) or SourceError(f"reading control topic {topic}: {error}")
                if message.offset() >= ends[partition]:
                    todo.pop(partition, None)
                    continue
                plan.control[partition] = message.offset() + 1
                if plan.control[partition] >= ends[partition]:
                    todo.pop(partition, None)
                self._take_control_record(plan, message, malformed)
        consumer.unassign()
        if malformed:
            log.warning(
                "skipped %d malformed control record(s) on %s (first: %s)",
                len(malformed),
                topic,
                malformed[0],
            )

    def _take_control_record(self, plan: _Plan, message: Any, malformed: list[str]) -> None:
        try:
            record = decode(message.key(), message.value())
        except Tombstone:
            _count(plan, "control_tombstones")  # compaction's deletion: not malformed
            return
        except MalformedControlRecord as reason:
            _count(plan, "control_malformed")
            malformed.append(f"{message.offset()}: {reason}")
            return
        if isinstance(record, Marker):
            _count(plan, "markers_read")
            self._offer(plan, record)

    def _offer(self, plan: _Plan, marker: Marker) -> None:
        """Channels come from the broker, not from markers: a marker for a partition the
        broker does not list (yet) is held aside, bounded, until it appears."""
        channel_id = self._channel_of(marker)
        if channel_id is None or channel_id in plan.aligner.partitions:
            plan.aligner.offer(marker)  # (a topic not read here is rejected and counted)
        elif len(plan.held) < MAX_HELD_MARKERS:
            plan.held.append(marker.model_dump(mode="json"))
        else:
            _count(plan, "markers_held_dropped")

    def _release_held(self, plan: _Plan) -> None:
        """Held markers whose partition the broker now lists join their channel."""
        still_held = []
        for raw in plan.held:
            marker = Marker.model_validate_json(json.dumps(raw))
            if self._channel_of(marker) in plan.aligner.partitions:
                plan.aligner.offer(marker)
            else:
                still_held.append(raw)
        plan.held = still_held

    # ---------------------------------------------------------------- progress

    def _wait_for_progress(
        self, start: SourceOffset, plan: _Plan
    ) -> dict[tuple[str, int], Progress]:
        """The progress records of the last batch's ranges (and of its synthetic row).

        Every one was acknowledged before its task ended, so once the progress topic has
        been read to its end, a record still missing is either late to appear or gone:
        gone when records were deleted past the position this plan reads from (the
        topic's retention, while the query was down) or the topic is not there. Gone
        progress is left out (``_partition_batches`` reads it as unknown); any other
        missing record fails the plan after ``progressTimeoutMs``, naming it.
        """
        from confluent_kafka import TopicPartition

        wanted = self._wanted_progress(start)
        if not wanted:
            return {}
        found: dict[tuple[str, int], Progress] = {}
        if self._progress_consumer is None:
            self._progress_consumer = self._consumer()
        consumer = self._progress_consumer
        topic = self.options.progress_topic
        positions = self._progress_positions(plan)
        consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
        deadline = time.monotonic() + self.options.progress_timeout_s
        at_end: set[int] = set()
        # When to ask the broker whether the missing records are gone: at once when the
        # consumer reports the end of every partition or a missing topic, else every
        # few seconds (a consumer assigned to a topic that does not exist may report
        # nothing at all).
        next_gone_check = time.monotonic() + GONE_CHECK_S
        gone = _GoneCheck()
        try:
            while wanted:
                if time.monotonic() > deadline:
                    missing = ", ".join(sorted(wanted)[:5])
                    raise SourceError(
                        f"no progress after {self.options.progress_timeout_s:.0f}s from "
                        f"{len(wanted)} reader task(s) of the last batch, "
                        f"{_ranges_in(wanted.values())} range(s) ({missing}) on "
                        f"topic {topic}: the watermark cannot advance without it"
                    )
                # consume() returns when it has num_messages or at the timeout: asking
                # for what is still wanted returns as soon as it has come.
                wanted_now = min(len(wanted), 10_000)
                messages = consumer.consume(num_messages=wanted_now, timeout=0.2)
                missing_topic = self._take_progress(messages, wanted, found, plan, at_end)
                reported = missing_topic or at_end >= set(positions)
                due = time.monotonic() >= next_gone_check
                if wanted and (due or (reported and not gone.reported)):
                    gone.reported = reported
                    gone.read_to_end = at_end >= set(positions)
                    next_gone_check = time.monotonic() + GONE_CHECK_S
                    read_again_from = self._progress_gone(positions, gone)
                    if read_again_from is not None:
                        # Later batches' progress is written from there on: read it.
                        plan.progress = {str(p): o for p, o in read_again_from.items()}
                        _count(plan, "progress_lost", _ranges_in(wanted.values()))
                        break
        finally:
            consumer.unassign()
        return found

    def _take_progress(
        self,
        messages: list[Any],
        wanted: dict[str, TaskPartition | SyntheticPartition],
        found: dict[tuple[str, int], Progress],
        plan: _Plan,
        at_end: set[int],
    ) -> bool:
        """Takes the wanted records among ``messages`` (from ``wanted`` into ``found``);
        notes the partitions read to their end; True if the topic was reported missing."""
        missing_topic = False
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                if error.code() in _MISSING_TOPIC_ERRORS:
                    missing_topic = True
                    continue
                topic = self.options.progress_topic
                raise self.options.refused(
                    error, f"read progress topic {topic}", PLANNER_GROUP
                ) or SourceError(f"reading progress topic {topic}: {error}")
            at_end.discard(message.partition())
            plan.progress[str(message.partition())] = message.offset() + 1
            key = (message.key() or b"").decode(errors="replace")
            task = wanted.pop(key, None)
            if task is not None:
                try:
                    found.update(task.decode_progress(message.value()))
                except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
                    # Not a reader's record (nothing of ours writes this): skipped, counted;
                    # the reader's own record is still awaited.
                    _count(plan, "progress_malformed")
                    wanted[key] = task
        return missing_topic

    def _progress_positions(self, plan: _Plan) -> dict[int, int]:
        """Every partition of the progress topic, from where the last plan stopped (from
        its beginning if the plan has no position for it: no record is missed)."""
        from confluent_kafka import OFFSET_BEGINNING

        positions = {int(p): o for p, o in plan.progress.items()}
        if not positions:
            topic = self.options.progress_topic
            listed = self._admin_client().list_topics(topic, timeout=self.options.request_timeout_s)
            described = listed.topics.get(topic)
            if described is not None and described.error is None:
                positions = {p: OFFSET_BEGINNING for p in described.partitions}
        return positions

    def _wanted_progress(
        self, start: SourceOffset
    ) -> dict[str, TaskPartition | SyntheticPartition]:
        """The progress keys of the last batch, each with the task that writes it: the
        tasks ``partitions`` made of the same offset."""
        wanted: dict[str, TaskPartition | SyntheticPartition] = {
            task.progress_key(): task for task in self._tasks(start)
        }
        synthetic = self._synthetic(start)
        if synthetic is not None and start.previous_threshold is not None:
            # The batch's synthetic task reports Spark's batch id (ranges do too); an
            # offset planned before it did (no previous threshold) has no such record.
            wanted[synthetic.progress_key] = synthetic
        return wanted

    def _progress_gone(self, positions: dict[int, int], gone: _GoneCheck) -> dict[int, int] | None:
        """Whether records after the plan's positions on the progress topic are gone, and
        if so where to read it from now on; None while they may still come:

        * deleted (retention, DeleteRecords: the log starts past the position) or the
          topic re-created (its log ends before the position): decided only once the
          consumer has read every partition to its end without finding them;
        * the topic missing (two answers in a row): made again, read from its start.
        """
        try:
            read_again_from = self._progress_read_again_from(positions, gone)
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

    def _progress_read_again_from(
        self, positions: dict[int, int], gone: _GoneCheck
    ) -> dict[int, int] | None:
        topic = self.options.progress_topic
        metadata = self._admin_client().list_topics(topic, timeout=self.options.request_timeout_s)
        described = metadata.topics.get(topic)
        missing = described is None or (
            described.error is not None
            and described.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        )
        gone.missing_answers = gone.missing_answers + 1 if missing else 0
        if missing:
            if gone.missing_answers < 2:
                return None  # a broker behind on metadata says so of a topic that exists
            self._ensure_progress_topic()
            return {}
        if described.error is not None or not gone.read_to_end:
            return None  # the broker cannot tell now, or the records may still come
        partitions = [(topic, p) for p in described.partitions]
        earliest = self._list_offsets(partitions, "earliest", wait_for_all=True)
        latest = self._list_offsets(partitions, "latest", wait_for_all=True)
        read_again_from: dict[int, int] = {}
        for _, p in partitions:
            position = max(0, positions.get(p, 0))
            if latest[(topic, p)] < position:
                read_again_from[p] = earliest[(topic, p)]  # re-created: its offsets anew
            else:
                read_again_from[p] = max(position, earliest[(topic, p)])
        if all(read_again_from[p] == max(0, positions.get(p, 0)) for _, p in partitions):
            return None  # nothing deleted: a record still missing is late, not gone
        return read_again_from

    # ---------------------------------------------------------------- planning

    def partitions(
        self, start: dict[str, Any], end_json: dict[str, Any]
    ) -> Sequence[InputPartition]:
        end = self._decoded(end_json)
        if not self._progress_topic_checked:
            # A replay after a restart reads before any plan: the readers' progress
            # needs its topic (the broker's auto-creation would give it no retention).
            with contextlib.suppress(KafkaException):
                self._ensure_progress_topic()
            self._progress_topic_checked = True
        result: list[InputPartition] = list(self._tasks(end))
        synthetic = self._synthetic(end)
        if synthetic is not None:
            result.append(synthetic)
        return result

    def _tasks(self, end: SourceOffset) -> list[TaskPartition]:
        """The batch's reader tasks: its ranges grouped as the offset says."""
        threshold = end.late_threshold  # == the previous offset's watermark
        previous = threshold if end.previous_threshold is None else end.previous_threshold
        return [
            TaskPartition(
                ranges,
                threshold,
                previous,
                end.previous_batch_id,
                query=end.query,
                latest_event_ms=end.latest_event_ms,
                legacy=end.tasks is None,
                event_time=self.options.event_time_field or "timestamp",
            )
            for ranges in group_ranges(end.ranges(), end.tasks)
        ]

    def _synthetic(self, end: SourceOffset) -> SyntheticPartition | None:
        """The batch's synthetic row, once the valve has a watermark."""
        if end.watermark <= MIN_WATERMARK:
            return None
        return SyntheticPartition(
            min(end.watermark, self.options.max_planned_watermark_ms),
            self.options.watermark_delay_ms,
            synthetic_progress_key(end.plan_id),
        )

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint, not in a consumer group

    def stop(self) -> None:
        for client in (self._control_consumer, self._progress_consumer):
            if client is not None:
                client.close()
        self._control_consumer = self._progress_consumer = None

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    # ---------------------------------------------------------------- reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SyntheticPartition):
            return read_synthetic(self.options, partition)
        assert isinstance(partition, TaskPartition)
        return read_task(self.options, partition)


# ------------------------------------------------------------------ offsets, pure


def _offset(
    plan: _Plan,
    *,
    from_data: Offsets,
    planned: int,
    late_threshold: int,
    data: Offsets | None = None,
    previous_threshold: int = MIN_WATERMARK,
    previous_batch_id: int | None = None,
    max_event_time_ahead_ms: int | None = None,
    tasks: int | None = None,
) -> SourceOffset:
    """One batch's offset, from the plan (``SourceOffset`` says what each part is for)."""
    latest_event_ms = (
        None
        if max_event_time_ahead_ms is None
        else time.time_ns() // 10**6 + max_event_time_ahead_ms
    )
    return SourceOffset(
        query=plan.query,
        latest_event_ms=latest_event_ms,
        data=data if data is not None else plan.data,
        data_from={t: dict(p) for t, p in from_data.items()},
        control=dict(plan.control),
        progress=dict(plan.progress),
        watermark=planned,
        late_threshold=late_threshold,
        previous_threshold=previous_threshold,
        previous_batch_id=previous_batch_id,
        status=plan.aligner.valve.status.value,
        counters=dict(plan.counters),
        progress_wait_ms=plan.progress_wait_ms,
        held=list(plan.held),
        aligner=plan.aligner.snapshot(),
        tasks=tasks,
    )


@dataclass
class _GoneCheck:
    """What the planner's checks for gone progress saw so far in one wait."""

    # Whether the consumer had read every partition of the progress topic to its end, or
    # reported the topic missing, at the last check (a new report is checked at once).
    read_to_end: bool = False
    reported: bool = False
    # Answers in a row that the progress topic does not exist.
    missing_answers: int = 0


@dataclass(frozen=True)
class _BrokerView:
    """What one plan saw of the broker (``SlackwaterStreamReader._observe``), as the
    emitter's BrokerView is what one poll saw."""

    counts: dict[str, int]  # partitions per subscribed topic (listed without an error)
    listed: frozenset[str]  # every topic the broker lists, with an error or not
    latest: dict[tuple[str, int], int]  # log ends (last stable offsets if read_committed)
    control_ends: dict[str, int]  # the control topic's log ends; empty if it does not exist


def _nothing_new_since(start: SourceOffset, now: _BrokerView) -> bool:
    """No range to account for, no new record on the data or control topics, no new
    partition: planning would return ``start``."""
    if start.data_from != start.data:
        return False
    known = start.data
    if now.counts.keys() != known.keys() or any(len(known[t]) != n for t, n in now.counts.items()):
        return False
    if any(
        now.latest.get((t, p), known[t][str(p)]) != known[t][str(p)]
        for t, n in now.counts.items()
        for p in range(n)
    ):
        return False  # new records, or offsets that went back
    return bool(now.control_ends.items() <= start.control.items())


def _same_batch(start: SourceOffset, offset: SourceOffset) -> bool:
    """True when the new offset would plan an empty batch that changes nothing."""
    return (
        offset.data == start.data
        and start.data_from == start.data
        and offset.control == start.control
        and offset.watermark == start.watermark
        and offset.held == start.held
        and offset.same_state(start)
    )


def _partition_batches(
    data: Offsets,
    last_ranges: list[tuple[str, int, int, int]],
    progress: dict[tuple[str, int], Progress],
) -> dict[Any, PartitionBatch]:
    """What the last batch read of each partition, for the aligner.

    A range whose progress is gone (the progress topic's retention passed while the
    query was down) counts as unknown, read the conservative way: no event time (its
    watermark does not move) and records up to its last offset (an IDLE marker inside
    it is taken as contradicted by data, so the partition stays ACTIVE). Missing
    progress can hold the watermark back, never make a record late.
    """
    lost = (
        {(t, p): (a, b) for t, p, a, b in last_ranges if (t, p) not in progress}
        if len(progress) < len(last_ranges)
        else {}
    )
    batch: dict[Any, PartitionBatch] = {}
    for topic, partitions in data.items():
        for partition, read_position in partitions.items():
            key = (topic, int(partition))
            seen = progress.get(key)
            if lost and key in lost:
                first, end = lost[key]
                batch[channel(topic, partition)] = PartitionBatch(
                    records=end - first, max_offset=end - 1, read_position=read_position
                )
                continue
            batch[channel(topic, partition)] = PartitionBatch(
                records=seen.records if seen else 0,
                max_event_time_ms=seen.max_event_time_ms if seen else None,
                max_offset=seen.max_offset if seen else -1,
                read_position=read_position,
            )
    return batch


def _records_between(begin: Offsets, end: Offsets) -> int:
    """Records from ``begin`` to ``end`` over every partition; what ``ranges`` would sum,
    without sorting 10,000 of them on every plan (the offset sorts them once, later)."""
    return sum(
        max(0, finish - begin.get(topic, {}).get(partition, finish))
        for topic, partitions in end.items()
        for partition, finish in partitions.items()
    )


def _ranges_in(tasks: Iterable[TaskPartition | SyntheticPartition]) -> int:
    return sum(len(task.ranges) for task in tasks if isinstance(task, TaskPartition))


def _count(plan: _Plan, counter: str, amount: int = 1) -> None:
    plan.counters[counter] = plan.counters.get(counter, 0) + amount


def _rate_limit(begin: Offsets, end: Offsets, max_records: int) -> Offsets:
    """At most ``max_records`` in all, shared in proportion to what each partition has."""
    batch_ranges = ranges(begin, end)
    total = sum(b - a for _, _, a, b in batch_ranges)
    if total <= max_records:
        return end
    limited = {t: dict(p) for t, p in end.items()}
    for topic, partition, a, b in batch_ranges:
        share = max(1, (b - a) * max_records // total)
        limited[topic][str(partition)] = min(b, a + share)
    return limited


# ------------------------------------------------------------------------ public API
