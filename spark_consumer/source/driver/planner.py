"""The source's face to Spark's micro-batch engine: the calls Spark makes, each short, on
the rooms that do the work (docs/architecture.md draws them)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from slackwater.markers import Marker, TopicPartitionKey
from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.driver import planner_process, restart_options, topic_partitions
from spark_consumer.source.driver.batch_ends import batch_ends
from spark_consumer.source.driver.control_reader import ControlReader
from spark_consumer.source.driver.partition_identity import PartitionIdentity
from spark_consumer.source.driver.plan import (
    Plan,
    PlanMemory,
    Watermarks,
    idle_clock_inputs,
    make_offset,
    nothing_new_since,
    plan_of,
    records_between,
    same_batch,
)
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.driver.progress_collector import ProgressCollector
from spark_consumer.source.driver.progress_topic import ensure_progress_topic
from spark_consumer.source.driver.run_ends import RunEnds
from spark_consumer.source.driver.seen_in import kept_epochs
from spark_consumer.source.shared.options import SourceOptions, channel
from spark_consumer.source.wire.offset import Offsets, SourceOffset
from spark_consumer.source.wire.splits import batch_tasks, options_for
from spark_consumer.valve import MIN_WATERMARK


class SlackwaterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver side of the source: Spark calls it in a Python process of its own, and
    ships it (its options alone) to the executors for ``read``.

    The invoking chain of one micro-batch (semantics.md §6)::

        latestOffset(start, limit)
          1. look at Kafka               kafka.observe (planner_client): partitions, log
                                         ends, control ends
          2. collect progress            progress.collect: what the last batch read
          3. follow partitions           identity.identify: the ids of topics whose ends
                                         changed; topic_partitions.follow: new ones join,
                                         went back (identity.went_back)
          4. read markers                control.read: from the control topic, up to its ends
          5. align                       aligner.advance: progress and markers into the valve;
                                         topic_partitions.drop_vanished: deleted ones FINISH
          6. make the offset             plan.make_offset: data ends, the valve's watermark
        (availableNow: the plan sees up to the run's ends, run_ends.py; a start returned
         while the run owes records is planned again)
        partitions(start, end)           wire/splits.batch_tasks: reader tasks, synthetic row
        read(partition)                  executor/readers.read, on an executor
        commit(end)                      nothing: offsets live in Spark's checkpoint

    The offset returned records the data end offsets, the control and progress topic
    positions and the aligner/valve state: Spark logs it before running the batch, so
    a replay plans the same batch and a restart continues from it.
    """

    def __init__(self, options: SourceOptions, kafka: PlannerClient | None = None) -> None:
        self.options = options
        # The view of the broker every room plans on (a test's may answer otherwise).
        self.kafka = kafka or PlannerClient(options)
        # Whether each partition is still the one read (went back, vanished), judged on
        # what the positions were seen in (topic ids, leader epochs: kept in the offset).
        self.identity = PartitionIdentity(options, self.kafka.describe)
        self.control = ControlReader(options, self.kafka, self.identity, self._channel_of)
        self.progress = ProgressCollector(options, self.kafka)
        self._memory = PlanMemory(options.max_event_time_ahead_ms)
        # Whether this reader has planned yet: its first plan restores a checkpoint.
        self._planned = False
        # Whether the broker did not answer a plan since the last plan it answered.
        self._blind = False
        # Whether the first plan took the topic ids and leader epochs its offset kept.
        self._remembered = False
        # Whether partitions() made sure the progress topic exists (a replay after a
        # restart runs before any plan).
        self._progress_topic_checked = False
        # In Spark's planner process, the query's stop (SIGTERM) runs stop() below.
        planner_process.stop_on_sigterm()
        # The options changed since the checkpoint, once compared (restart_options), and
        # what the offsets it plans keep of them.
        self._changes: restart_options.Changes | None = None
        self._planned_with = restart_options.planned_with(options)
        # Where a run under availableNow, or a bounded one, ends (run_ends.py).
        self.run = RunEnds(options)

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the options only: Kafka clients stay with the planner."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        partitions = self._first_look()
        starting = self.kafka.list_offsets(
            partitions, self.options.starting_offsets, wait_for_all=True
        )
        data: Offsets = {}
        for (topic, partition), offset in starting.items():
            data.setdefault(topic, {})[str(partition)] = offset
        aligner = self._new_aligner()
        aligner.ensure_partitions(channel(t, p) for t, p in sorted(starting))
        control = self.options.control_topic
        plan = Plan(
            data=data,
            control={p: 0 for p in self.kafka.topic_ends(control)} if control else {},
            progress=self.kafka.topic_ends(self.options.progress_topic),
            aligner=aligner,
            query=uuid.uuid4().hex,
        )
        first = make_offset(
            plan,
            Watermarks(planned=MIN_WATERMARK, late_threshold=MIN_WATERMARK),
            from_data=data,
            max_event_time_ahead_ms=self.options.max_event_time_ahead_ms,
            tasks=self.options.tasks_per_batch,
            planned_with=self._planned_with,
        )
        self._changes = restart_options.Changes()  # a new query: nothing to compare
        return self._memory.returned(first)

    def latestOffset(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        # Returning the start is "no new data": under availableNow it ends the run, so
        # while the run owes records (a partition's leader down) it asks again instead.
        while True:
            planned = self._plan(start_json, limit)
            if planned is not start_json:
                planner_process.settled()  # a whole plan ran: its clients and state are built
                return planned
            if not self.run.owes_records(self._memory.decoded(start_json)):
                return planned
            time.sleep(1.0)

    def _plan(self, start_json: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start = self._memory.decoded(start_json)
        changes = self._compared(start)
        self._remember(start, changes)
        now = self._observe(start)  # 1. look at the broker
        if now is None:
            return start_json  # no batch while the broker is away; the query keeps running
        self.kafka.authentication_failure()  # the broker answered: one before is history
        self.run.see(now, start)  # availableNow: the run's ends (Kafka's evidence: ``now``)
        idle_clocks = self.options.consumer_idle_timeout_ms is not None
        owed = idle_clocks or changes.pending or self.run.bounded or self.run.owes_eviction(start)
        run_view = self.run.capped(now)  # what this plan may plan on (``now``: all of it)
        if nothing_new_since(start, run_view) and not owed:
            return start_json  # the common idle trigger: no state to restore or write
        plan = self._restore(start)
        # 2. The previous batch's progress; its end offsets are now the read positions.
        batch, start_batch_id = self.progress.collect(start, plan, now)
        # 3. New partitions join as channels (with their held markers), new logs follow
        #    failOnDataLoss: before the markers, which may be for a partition just joined.
        self.identity.identify(now, start.ends_by_key, self.kafka.topic_ids)
        topic_partitions.follow(
            plan, now, batch, self.kafka, identity=self.identity, joining=run_view.counts
        )
        self.control.release_held(plan)
        # 4. New markers are read up to the ends seen in step 1.
        self.control.read(plan, now, self.run.capped(now).control_ends)  # (judged in 3)
        # 5. Progress advances the channels' watermarks and markers apply once the read
        #    position reaches them. The consumer-side idle timeout (off by default)
        #    counts wall time between plans that saw the broker, not for partitions
        #    whose log end it did not give nor those with records past their read
        #    position (held by alignment, or not read yet); a replay uses the logged
        #    offset, so this never makes a replay differ. Partitions gone from the
        #    broker (their last batch applied first) leave the valve.
        now_ms = time.time_ns() // 1_000_000 if self.options.consumer_idle_timeout_ms else None
        plan.aligner.advance(batch, now_ms, *(idle_clock_inputs(plan.data, now) if now_ms else ()))
        topic_partitions.drop_unsubscribed(plan, self.options, self.identity)
        topic_partitions.drop_vanished(plan, now, self.identity)
        self.run.finish_ended(plan)  # a bounded run: partitions read to their ends FINISH
        # 6. The data to read next, and the valve's output planned into its synthetic row.
        offset = self._next_offset(plan, start, self.run.capped(now).latest, limit, start_batch_id)
        if same_batch(start, offset) and not self.run.owes_eviction(start):
            self._memory.keep(start, plan.aligner)  # still start's state
            return start_json  # nothing new: no batch
        return self._memory.returned(offset, plan.aligner)

    def partitions(
        self, start: dict[str, Any], end_json: dict[str, Any]
    ) -> Sequence[InputPartition]:
        end = self._memory.decoded(end_json)
        self._compared(end)  # a batch Spark runs again after a restart: a refusal ends it
        if not self._progress_topic_checked:
            # A replay after a restart reads before any plan: the readers' progress
            # needs its topic (the broker's auto-creation would give it no retention).
            with contextlib.suppress(KafkaException):
                ensure_progress_topic(self.kafka)
            self._progress_topic_checked = True
        tasks, synthetic = batch_tasks(
            self.options,
            end,
            {**self.identity.topic_ids, **_kept_ids(end)},
            kept_epochs(end.kafka, end.data),
        )
        return [*tasks, synthetic] if synthetic is not None else tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # On an executor: the readers' module is loaded there, never by the planner.
        from spark_consumer.source.executor import readers

        return readers.read(options_for(self.options, partition), partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint, not in a consumer group

    def stop(self) -> None:
        try:
            self.control.close()
            self.progress.close()
        finally:
            planner_process.end_if_asked()  # Spark's SIGTERM asked: the process ends here

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.run.prepare()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    # ------------------------------------------------------------ helpers of the calls

    def _next_offset(
        self,
        plan: Plan,
        start: SourceOffset,
        latest: dict[TopicPartitionKey, int],
        limit: ReadLimit,
        start_batch_id: int | None,
    ) -> SourceOffset:
        """The offset of the batch that reads from the plan's positions up to ``latest``
        (the run's view again: topic_partitions.follow takes out log ends it cannot plan
        on), less what watermark alignment holds, within ``limit``."""
        ends, aligned = batch_ends(
            plan.aligner, plan.data, latest, limit, self.options.max_watermark_drift_ms
        )
        return make_offset(
            plan,
            Watermarks(
                planned=plan.aligner.valve.watermark,
                late_threshold=start.watermark,
                previous_threshold=start.late_threshold,
                previous_batch_id=start_batch_id,
            ),
            from_data=plan.data,
            data=ends,
            max_event_time_ahead_ms=self.options.max_event_time_ahead_ms,
            tasks=self.options.tasks_for(records_between(plan.data, ends)),
            kafka=self.identity.kept(ends),
            alignment=aligned.summary() if aligned else None,
            planned_with={**self._planned_with, **self.run.kept()},
        )

    def _first_look(self) -> list[TopicPartitionKey]:
        """The subscribed partitions, once the broker answers: without a broker there is
        no first offset, so it is asked until it answers, saying so."""
        while True:
            try:
                self.kafka.admin.list_topics(timeout=min(5.0, self.options.request_timeout_s))
                ensure_progress_topic(self.kafka)
                return self.kafka.subscribed_partitions()
            except KafkaException as error:
                self.kafka.unreachable(error)
                time.sleep(1.0)

    def _observe(self, start: SourceOffset) -> PlanAnswers | None:
        """What the broker shows now; None while it is away (no batch; the query keeps
        running). A run under availableNow waits for it instead: returning its start
        would end the run with its records unread."""
        while True:
            try:
                return self.kafka.observe(start.data.keys())
            except KafkaException as error:
                self.kafka.unreachable(error)
                self._blind = True
                if not self.run.available_now:
                    return None
            time.sleep(1.0)

    def _remember(self, start: SourceOffset, changes: restart_options.Changes) -> None:
        """What the query before a restart knew of Kafka, at its first plan."""
        if not self._remembered:
            control = start.control if not changes.control_topic else {}  # another topic's
            positions = {**start.data, self.options.control_topic or "": control}
            self.identity.remember(start.kafka, positions)
            self._remembered = True

    def _restore(self, offset: SourceOffset) -> Plan:
        aligner = self._memory.aligner(offset, self._channel_of)
        # Idle clocks count only time in which the broker was seen (semantics.md §6):
        # this reader's first plan (the query was down), the first since the broker did
        # not answer start them again (a partition whose log end alone it did not give:
        # step 5).
        if not self._planned or self._blind:
            aligner.restart_idle_clocks()
            self._planned, self._blind = True, False
        # The options as the query runs now (they may have changed since the checkpoint).
        restart_options.apply(aligner, self.options)
        plan = plan_of(offset, aligner)
        if self._changes is not None and self._changes.control_topic:
            plan.control = {}  # another topic's positions: the new one from its start
            aligner.forget_epochs()  # and its emitter's history
        self._changes = restart_options.Changes()  # applied: the next plans plan as usual
        return plan

    def _compared(self, offset: SourceOffset) -> restart_options.Changes:
        """The options changed since the checkpoint's ``offset``, compared once (each
        said in one line; a refused one raises)."""
        if self._changes is None:
            self._changes = restart_options.compare(offset, self.options)
        return self._changes

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


def _kept_ids(offset: SourceOffset) -> dict[str, str]:
    """The topic ids the batch was planned against (a replay after a restart plans
    before this planner has seen any)."""
    ids = offset.kafka.get("ids")
    return {str(t): str(i) for t, i in ids.items()} if isinstance(ids, dict) else {}
