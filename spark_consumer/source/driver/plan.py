"""The plan: the driver's view between two ``latestOffset`` calls and the offset it becomes
(what a batch may read: batch_ends.py). Pure: no Kafka client here.

Every part of a plan is in the offset it becomes (``SourceOffset`` says what each part is
for): Spark logs that offset before running the batch, so a replay plans the same batch
and a restart continues from it. ``PlanMemory`` keeps the offset returned last, so that
the next plan, which usually starts from it, needs neither decode it nor rebuild the
aligner from JSON.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slackwater.markers import Marker
from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.shared.options import SourceError, channel
from spark_consumer.source.wire.offset import (
    Offsets,
    SourceOffset,
    unreadable,
)
from spark_consumer.source.wire.offset_error import OffsetFormatError
from spark_consumer.valve import MIN_WATERMARK

if TYPE_CHECKING:
    from spark_consumer.source.driver.plan_answers import PlanAnswers


@dataclass
class Plan:
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

    def count(self, counter: str, amount: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + amount


@dataclass(frozen=True)
class Watermarks:
    """The watermarks an offset carries (``SourceOffset`` says what each is for)."""

    planned: int
    late_threshold: int
    previous_threshold: int = MIN_WATERMARK
    previous_batch_id: int | None = None


def make_offset(
    plan: Plan,
    watermarks: Watermarks,
    *,
    from_data: Offsets,
    data: Offsets | None = None,
    max_event_time_ahead_ms: int | None = None,
    tasks: int | None = None,
    kafka: dict[str, Any] | None = None,
    planned_with: dict[str, Any] | None = None,
    alignment: dict[str, Any] | None = None,
) -> SourceOffset:
    """One batch's offset: the batch reads ``from_data`` to ``data`` (the plan's data);
    ``planned_with``: the options it is planned with (restart_options.planned_with)."""
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
        watermark=watermarks.planned,
        late_threshold=watermarks.late_threshold,
        previous_threshold=watermarks.previous_threshold,
        previous_batch_id=watermarks.previous_batch_id,
        status=plan.aligner.valve.status.value,
        counters=dict(plan.counters),
        progress_wait_ms=plan.progress_wait_ms,
        held=list(plan.held),
        aligner=plan.aligner.snapshot(),
        tasks=tasks,
        kafka=kafka or {},
        planned_with=planned_with or {},
        alignment=alignment or {},
    )


class PlanMemory:
    """The offset this planner returned (or read) last, and the aligner state it left
    there (None once a plan has begun changing it). At 10,000 partitions, decoding an
    offset and restoring its aligner are tens of milliseconds each. An offset it cannot read or
    restore ends the query with one line (``offset.unreadable``), never Python's own."""

    def __init__(self, max_event_time_ahead_ms: int | None = None) -> None:
        self._last: tuple[SourceOffset, MarkerAligner | None] | None = None
        # The option as the query runs: an offset of version 1 may need it to decode.
        self._max_event_time_ahead_ms = max_event_time_ahead_ms

    def decoded(self, raw: dict[str, Any]) -> SourceOffset:
        """An offset Spark handed back; the one returned or read last is not read again.
        Spark plans from one it did not take from this planner's last return for as long
        as no batch runs: after a restart, or from the first of the two initial offsets
        it asks for (55 ms a trigger at 10,000 partitions, each idle one)."""
        last = self._last
        if last is not None and last[0].plan_id and raw.get("plan_id") == last[0].plan_id:
            return last[0]
        try:
            offset = SourceOffset.decode(raw, max_event_time_ahead_ms=self._max_event_time_ahead_ms)
        except OffsetFormatError as error:
            raise SourceError(str(error)) from error
        if offset.plan_id:
            self.keep(offset, None)  # its aligner is restored from it when a plan needs it
        return offset

    def returned(
        self, offset: SourceOffset, aligner: MarkerAligner | None = None
    ) -> dict[str, Any]:
        """``offset`` as Spark takes it, kept with the aligner state it holds."""
        self.keep(offset, aligner)
        return offset.encode()

    def keep(self, offset: SourceOffset, aligner: MarkerAligner | None) -> None:
        self._last = (offset, aligner)

    def aligner(
        self, offset: SourceOffset, channel_of: Callable[[Marker], str | None]
    ) -> MarkerAligner:
        """The aligner state of ``offset``: the one left there, or restored from it."""
        last = self._last
        if last is not None and last[1] is not None and last[0].plan_id == offset.plan_id:
            self._last = (last[0], None)  # changed from here on
            return last[1]
        try:
            return MarkerAligner.restore(offset.aligner, channel_of=channel_of)
        except (LookupError, TypeError, ValueError, AttributeError) as error:
            # Decoding checked the offset's form, not every value (a pending marker's).
            raise SourceError(str(unreadable(offset.version, error))) from error


def plan_of(offset: SourceOffset, aligner: MarkerAligner) -> Plan:
    """A plan that starts where ``offset`` ended."""
    return Plan(
        data={t: dict(p) for t, p in offset.data.items()},
        control=dict(offset.control),
        progress=dict(offset.progress),
        aligner=aligner,
        counters=dict(offset.counters),
        held=list(offset.held),
        query=offset.query,
    )


def nothing_new_since(start: SourceOffset, now: PlanAnswers) -> bool:
    """No range to account for, no new record on the data or control topics, no new
    partition: planning would return ``start``."""
    if start.data_from != start.data:
        return False
    known = start.data
    if now.counts.keys() != known.keys() or any(len(known[t]) != n for t, n in now.counts.items()):
        return False
    # Every log end given is the one planned (one not given: no news of it). Compared
    # as dict views, in C: a loop in Python was 8 ms of an idle plan at 10,000. What
    # differs is the control topic's (compared below) or news.
    differing = now.latest.items() - start.ends_by_key.items()
    if any(topic in known for (topic, _), _ in differing):
        return False  # new records, or offsets that went back
    return bool(now.control_ends.items() <= start.control.items())


def idle_clock_inputs(data: Offsets, now: PlanAnswers) -> tuple[set[str], set[str]]:
    """The channels whose idle clocks do not count silence this plan: those whose log end
    the broker did not give (semantics.md, "Kafka's evidence"), and those whose log end
    is past the read position (records wait: not read yet, or held by alignment)."""
    unseen: set[str] = set()
    waiting: set[str] = set()
    for topic, partitions in data.items():
        for partition, position in partitions.items():
            log_end = now.latest.get((topic, int(partition)))
            if log_end is None:
                unseen.add(channel(topic, partition))
            elif log_end > position:
                waiting.add(channel(topic, partition))
    return unseen, waiting


def same_batch(start: SourceOffset, offset: SourceOffset) -> bool:
    """True when the new offset would plan an empty batch that changes nothing."""
    return (
        offset.data == start.data
        and start.data_from == start.data
        and offset.control == start.control
        and offset.watermark == start.watermark
        and offset.held == start.held
        and offset.same_state(start)
    )


def records_between(begin: Offsets, end: Offsets) -> int:
    """Records from ``begin`` to ``end`` over every partition; what ``ranges`` would sum,
    without sorting 10,000 of them on every plan (the offset sorts them once, later)."""
    return sum(
        max(0, finish - begin.get(topic, {}).get(partition, finish))
        for topic, partitions in end.items()
        for partition, finish in partitions.items()
    )
