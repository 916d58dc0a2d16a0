"""Aligning control-topic markers with what the consumer has read (semantics.md §3).

Pure driver-side logic, no Spark: per micro-batch it takes the markers read,
and per data partition the newest event time, the highest record offset and
the read position (next offset to read); it decides each partition's status
and feeds statuses and watermarks into the valve.

Order within one micro-batch, for every partition in partition order:

    1. data beats markers: records at or after the IDLE offset make an IDLE
       partition ACTIVE again at once;
    2. the partition's watermark (newest event time - max out-of-orderness)
       goes into the valve, before any IDLE/FINISHED below, so the data read
       in this batch counts in the flush;
    3. pending markers apply in their order: ACTIVE at once; IDLE@X and
       FINISHED@X once the read position has reached X:

         offset   ... 7   8   9 | 10  11
         read          ^ position 8: IDLE@10 waits
                               ^ position 10, no record >= 10 read: IDLE applies
                                       ^ a record at 10 or 11 was read: IDLE@10
                                         is contradicted by data and dropped

Rules that reject a marker (counted, never applied): an older epoch than one
seen for the partition; anything but FINISHED... after FINISHED (terminal); a
marker for another topic.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slackwater.markers import Marker, MarkerStatus, rejection
from spark_consumer.valve import Emitted, StatusWatermarkValve, WatermarkStatus

NO_OFFSET = -1


class MarkerOutcome(enum.StrEnum):
    PENDING = "pending"
    STALE_EPOCH = "stale_epoch"
    AFTER_FINISHED = "after_finished"
    OTHER_TOPIC = "other_topic"
    # FINISHED again after FINISHED: the same end, not a violation (semantics.md §3 names
    # ACTIVE/IDLE after FINISHED), e.g. the emitter's FINISHED@log_end for a topic the
    # source already saw deleted. Not counted.
    ALREADY_FINISHED = "already_finished"


@dataclass(slots=True)
class PartitionBatch:
    """What Spark computed for one data partition in one micro-batch. Slots, not frozen:
    the planner makes one per partition every plan (as ``progress.Progress``)."""

    records: int = 0
    # Newest readable event time (ms) among the batch's records; None if none.
    max_event_time_ms: int | None = None
    max_offset: int = NO_OFFSET
    # Next offset to read after this batch (past offset gaps); None if not read.
    read_position: int | None = None


@dataclass
class _Partition:
    status: MarkerStatus = MarkerStatus.ACTIVE
    read_position: int = 0
    max_record_offset: int = NO_OFFSET
    newest_event_ms: int | None = None
    epoch: int = -1
    # Offset of the IDLE marker applied last: data at or after it beats it.
    idle_offset: int | None = None
    pending: list[Marker] = field(default_factory=list)
    # Wall time of the last batch with records (for the consumer-side idle timeout).
    last_data_ms: int | None = None

    def row(self, channel: Hashable) -> list[Any]:
        """The partition as one positional row of a snapshot (10,000 partitions travel in
        every offset of the source): [channel, status, read_position, max_record_offset,
        newest_event_ms, epoch, idle_offset, last_data_ms, pending markers]."""
        return [
            channel,
            self.status.value,
            self.read_position,
            self.max_record_offset,
            self.newest_event_ms,
            self.epoch,
            self.idle_offset,
            self.last_data_ms,
            [m.model_dump(mode="json") for m in self.pending] if self.pending else [],
        ]

    @classmethod
    def from_row(cls, row: list[Any]) -> _Partition:
        """The partition of a row (its channel is the row's first item)."""
        _, status, read_position, max_offset, newest, epoch, idle, last_data, pending = row
        return cls(
            status=MarkerStatus(status),
            read_position=read_position,
            max_record_offset=max_offset,
            newest_event_ms=newest,
            epoch=epoch,
            idle_offset=idle,
            last_data_ms=last_data,
            pending=[Marker.model_validate_json(_json(m)) for m in pending],
        )


@dataclass
class Counters:
    markers_applied: int = 0
    markers_superseded: int = 0
    markers_rejected: dict[str, int] = field(default_factory=dict)
    records_after_finished: int = 0
    data_reactivations: int = 0
    consumer_idle_timeouts: int = 0
    # Partitions that appeared after the valve's output was FINISHED (semantics.md §6).
    partitions_after_finished: int = 0


# Which valve channel a marker is for; None for a marker of a topic not read here.
ChannelOf = Callable[[Marker], Hashable | None]


class MarkerAligner:
    """Consumer-side partition statuses, pending markers and the valve.

    Channels are the partitions of one topic by number (``topic``), or any keys a
    ``channel_of`` function gives markers (the source: ``"topic:partition"``).
    """

    def __init__(
        self,
        topic: str | None,
        max_out_of_orderness_ms: int,
        partitions: Iterable[Hashable] = (),
        consumer_idle_timeout_ms: int | None = None,
        channel_of: ChannelOf | None = None,
    ) -> None:
        self.topic = topic
        self.max_out_of_orderness_ms = max_out_of_orderness_ms
        # The fallback without an emitter (semantics.md §6); None = off.
        self.consumer_idle_timeout_ms = consumer_idle_timeout_ms
        self.channel_of: ChannelOf = channel_of or self._partition_of_own_topic
        self.partitions: dict[Hashable, _Partition] = {}
        self.valve = StatusWatermarkValve([])
        self.counters = Counters()
        self.ensure_partitions(partitions)

    def _partition_of_own_topic(self, marker: Marker) -> Hashable | None:
        return marker.partition if marker.topic == self.topic else None

    def ensure_partitions(
        self, partitions: Iterable[Hashable], read_positions: dict[Hashable, int] | None = None
    ) -> list[Emitted]:
        """Adds partitions the consumer did not know (a topic grew): ACTIVE channels,
        whose read position starts where reading them starts (``read_positions``)."""
        emitted: list[Emitted] = []
        for partition in sorted(set(partitions) - set(self.partitions), key=_order):
            position = (read_positions or {}).get(partition, 0)
            if self.valve.status is WatermarkStatus.FINISHED:
                # Every partition had FINISHED, and a FINISHED valve takes no channel: a
                # partition that appears now is data after FINISHED (counted, its records
                # processed and late), not a new input of the watermark.
                self.partitions[partition] = _Partition(
                    status=MarkerStatus.FINISHED, read_position=position
                )
                self.counters.partitions_after_finished += 1
                continue
            self.partitions[partition] = _Partition(read_position=position)
            emitted += self.valve.add_channel(partition)
        return emitted

    def finish(self, partition: Hashable) -> list[Emitted]:
        """The partition is gone for good (its topic was deleted): FINISHED, as the
        emitter's FINISHED@log_end would make it, whatever markers were pending."""
        state = self.partitions.get(partition)
        if state is None or state.status is MarkerStatus.FINISHED:
            return []
        state.status = MarkerStatus.FINISHED
        state.pending.clear()
        return self.valve.input_status(partition, WatermarkStatus.FINISHED)

    def restart_at(self, partition: Hashable, read_position: int) -> None:
        """The partition's offsets started again (its topic re-created, or truncated):
        offsets of the old log mean nothing in the new one, nor do markers aligned to
        them that are still pending (markers read from now on wait for the new read
        position to reach their offsets)."""
        state = self.partitions[partition]
        state.read_position = read_position
        state.max_record_offset = NO_OFFSET
        state.pending.clear()  # aligned to the old log's offsets
        if state.idle_offset is not None:
            state.idle_offset = read_position

    def forget_epochs(self) -> None:
        """The control topic started again (re-created): a new emitter history begins
        there, whose epochs may be lower than those seen in the old one."""
        for state in self.partitions.values():
            state.epoch = -1

    def restart_idle_clocks(self) -> None:
        """The consumer-side idle clock starts again: at a restart (as Flink's does), and
        after the broker did not answer. Idle clocks count only time in which the broker
        was seen: time the query was down, or blind, is not time a partition was silent
        (a partition whose log end alone is unknown: ``advance``'s ``unseen``)."""
        for state in self.partitions.values():
            state.last_data_ms = None

    def take_max_out_of_orderness(self, bound_ms: int) -> list[Emitted]:
        """Another bound from now on (a restart with another maxOutOfOrderness): every
        partition's watermark is its newest event time less ``bound_ms``. A watermark
        never goes back (the valve's rule 1): a larger bound leaves each where it is until
        newer event times pass it, a smaller one raises them now."""
        self.max_out_of_orderness_ms = bound_ms
        emitted: list[Emitted] = []
        for partition in sorted(self.partitions, key=_order):
            state = self.partitions[partition]
            if state.newest_event_ms is not None and state.status is MarkerStatus.ACTIVE:
                emitted += self.valve.input_watermark(partition, state.newest_event_ms - bound_ms)
        return emitted

    def offer(self, marker: Marker) -> MarkerOutcome:
        """A marker read from the control topic: queued for its partition, or rejected."""
        channel = self.channel_of(marker)
        if channel is None:
            return self._reject(MarkerOutcome.OTHER_TOPIC)
        self.ensure_partitions([channel])
        state = self.partitions[channel]
        # The protocol's acceptance rules (an older epoch, anything after FINISHED),
        # FINISHED counting from when it is queued, not only once applied.
        finished = state.status is MarkerStatus.FINISHED or any(
            m.status is MarkerStatus.FINISHED for m in state.pending
        )
        rejected = rejection(marker, state.epoch, finished)
        if rejected is not None and finished and marker.status is MarkerStatus.FINISHED:
            return MarkerOutcome.ALREADY_FINISHED
        if rejected is not None:
            return self._reject(MarkerOutcome(rejected.value))
        state.epoch = marker.epoch
        state.pending.append(marker)
        return MarkerOutcome.PENDING

    def _reject(self, outcome: MarkerOutcome) -> MarkerOutcome:
        rejected = self.counters.markers_rejected
        rejected[outcome.value] = rejected.get(outcome.value, 0) + 1
        return outcome

    def advance(
        self,
        batch: dict[Any, PartitionBatch],
        now_ms: int | None = None,
        unseen: Collection[Hashable] = (),
        waiting: Collection[Hashable] = (),
    ) -> list[Emitted]:
        """Applies one micro-batch (see the module docstring); returns what the valve emits.

        ``now_ms`` (wall time) drives the optional consumer-side idle timeout; the idle
        clocks of ``unseen`` partitions (whose log end the broker did not give) do not
        run: they start at the first plan that sees the partition again. Nor do those of
        ``waiting`` partitions, whose log end is past their read position (records not
        read yet, or held back by watermark alignment: records are there, not silence):
        theirs start at the first plan that finds them read up. Set to None, not to
        now: a plan that changes nothing else leaves the state as it was, so a run
        under availableNow can end while records wait past its ends.
        """
        emitted = self.ensure_partitions(batch)
        for partition in sorted(self.partitions, key=_order):
            state = self.partitions[partition]
            seen = batch.get(partition)
            if seen is not None:
                emitted += self._take_data(partition, state, seen)
            emitted += self._apply_pending(partition, state)
            if now_ms is None or self.consumer_idle_timeout_ms is None:
                continue
            if (unseen and partition in unseen) or (waiting and partition in waiting):
                state.last_data_ms = None  # (unchanged while it stays so)
            else:
                emitted += self._consumer_idle_timeout(partition, state, seen, now_ms)
        return emitted

    def _consumer_idle_timeout(
        self, partition: Hashable, state: _Partition, seen: PartitionBatch | None, now_ms: int
    ) -> list[Emitted]:
        """The fallback without an emitter (Flink's withIdleness): no records for the
        timeout -> IDLE. Records waiting past the read position do not count as silence
        (``advance``); weaker than markers all the same: records its producer has not
        written yet look like none."""
        assert self.consumer_idle_timeout_ms is not None
        if seen is not None and seen.records:
            state.last_data_ms = now_ms
            return []
        if state.last_data_ms is None:
            state.last_data_ms = now_ms  # first sight: the clock starts now
            return []
        if (
            state.status is not MarkerStatus.ACTIVE
            or now_ms - state.last_data_ms < self.consumer_idle_timeout_ms
        ):
            return []
        state.status = MarkerStatus.IDLE
        state.idle_offset = state.read_position  # data from here on makes it ACTIVE again
        self.counters.consumer_idle_timeouts += 1
        return self.valve.input_status(partition, WatermarkStatus.IDLE)

    def _take_data(
        self, partition: Hashable, state: _Partition, seen: PartitionBatch
    ) -> list[Emitted]:
        emitted: list[Emitted] = []
        if seen.read_position is not None:
            state.read_position = max(state.read_position, seen.read_position)
        if seen.records == 0:
            return emitted
        state.max_record_offset = max(state.max_record_offset, seen.max_offset)
        if state.status is MarkerStatus.FINISHED:
            # Data after FINISHED: a protocol violation, counted; the records
            # are still processed (never dropped silently).
            self.counters.records_after_finished += seen.records
            return emitted
        if (
            state.status is MarkerStatus.IDLE
            and state.idle_offset is not None
            and seen.max_offset >= state.idle_offset
        ):
            # Data beats markers: the partition is ACTIVE again at once.
            state.status = MarkerStatus.ACTIVE
            self.counters.data_reactivations += 1
            emitted += self.valve.input_status(partition, WatermarkStatus.ACTIVE)
        if seen.max_event_time_ms is not None:
            if state.newest_event_ms is None or seen.max_event_time_ms > state.newest_event_ms:
                state.newest_event_ms = seen.max_event_time_ms
            emitted += self.valve.input_watermark(
                partition, state.newest_event_ms - self.max_out_of_orderness_ms
            )
        return emitted

    def _apply_pending(self, partition: Hashable, state: _Partition) -> list[Emitted]:
        emitted: list[Emitted] = []
        while state.pending:
            marker = state.pending[0]
            if marker.status is MarkerStatus.ACTIVE:
                # ACTIVE@X applies at once.
                state.pending.pop(0)
                self.counters.markers_applied += 1
                if state.status is MarkerStatus.IDLE:
                    state.status = MarkerStatus.ACTIVE
                    emitted += self.valve.input_status(partition, WatermarkStatus.ACTIVE)
                continue
            # IDLE@X and FINISHED@X wait until the read position reaches X.
            if state.read_position < marker.offset:
                break
            state.pending.pop(0)
            if marker.status is MarkerStatus.IDLE and state.max_record_offset >= marker.offset:
                # A record at or after X was read: the IDLE is contradicted by data.
                self.counters.markers_superseded += 1
                continue
            self.counters.markers_applied += 1
            if state.status is marker.status:
                continue
            state.status = marker.status
            if marker.status is MarkerStatus.IDLE:
                state.idle_offset = marker.offset
            emitted += self.valve.input_status(partition, WatermarkStatus(marker.status.value))
        return emitted

    @property
    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self.partitions.values())

    def status_of(self, partition: Hashable) -> MarkerStatus:
        return self.partitions[partition].status

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "max_out_of_orderness_ms": self.max_out_of_orderness_ms,
            "valve": self.valve.snapshot(),
            "counters": {
                "markers_applied": self.counters.markers_applied,
                "markers_superseded": self.counters.markers_superseded,
                "markers_rejected": dict(self.counters.markers_rejected),
                "records_after_finished": self.counters.records_after_finished,
                "data_reactivations": self.counters.data_reactivations,
                "consumer_idle_timeouts": self.counters.consumer_idle_timeouts,
                "partitions_after_finished": self.counters.partitions_after_finished,
            },
            "consumer_idle_timeout_ms": self.consumer_idle_timeout_ms,
            # One positional row per partition (_Partition.row).
            "partitions": [s.row(p) for p, s in self.partitions.items()],
        }

    @classmethod
    def restore(
        cls, snapshot: dict[str, Any], channel_of: ChannelOf | None = None
    ) -> MarkerAligner:
        aligner = cls(
            snapshot["topic"],
            snapshot["max_out_of_orderness_ms"],
            consumer_idle_timeout_ms=snapshot.get("consumer_idle_timeout_ms"),
            channel_of=channel_of,
        )
        aligner.valve = StatusWatermarkValve.restore(snapshot["valve"])
        counters = snapshot["counters"]
        # A copy: the snapshot may be an offset's, which must not change with the aligner.
        aligner.counters = Counters(
            **{**counters, "markers_rejected": dict(counters["markers_rejected"])}
        )
        partitions = aligner.partitions
        for row in snapshot["partitions"]:
            partitions[row[0]] = _Partition.from_row(row)
        return aligner


def _order(channel: Hashable) -> tuple[str, Any]:
    """Channels in a stable order whatever their type (ints by number, others by text)."""
    return ("", channel) if isinstance(channel, int) else (str(channel), 0)


def _json(document: dict[str, Any]) -> str:
    import json

    return json.dumps(document)
