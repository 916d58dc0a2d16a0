"""Where a run ends (docs/source.md, "Scheduled and bounded runs"; issue 32).

Under ``trigger(availableNow=True)`` a run reads every subscribed partition to the log
end seen when it starts, and no further: records written after, partitions and topics
that appear after wait for the next run, and so do markers written after. Spark ends
the run at the first plan that returns its start: no new data, and no no-data batch
owed. The valve's output for the last records is planned one plan after they are read
(their progress comes back then), and Spark applies a planned watermark one batch after
the batch that carries it; so the run's last batch is one more synthetic row of the
same watermark (``owes_eviction``), not Spark's no-data batch, which Spark owes only
while the run that moved the watermark lives::

    plan   1 ........ k            k+1                  k+2               k+3
    reads  records to the ends     nothing              nothing           -
    plans  V from what was read    V(k+1) from the      V(k+1) again      its start:
           before                  last records         (owes_eviction)   the run ends
    Spark  windows up to V(k-1)    windows up to V(k)   windows up to V(k+1)

Each partition's ceiling is the first log end the run sees at or past its read
position: a lower answer is Kafka's evidence's to judge (partition_identity.py, on the plan's
own view of the broker), never an end. A plan that would return its start while a
partition of the run is below its ceiling, or has none yet (no leader answered), asks
again instead (``owes_records``): the others are read meanwhile, and the run does not
end with a partition unread.

A bounded run (option ``endingOffsets``) reads to the ends given, or to the log ends
seen when its first run started (``latest``), and counts every partition FINISHED once
read to its end, as the emitter's FINISHED@end would: the valve's output finishes, and
every window closes. Its ends are kept in the offset (``planned_with``), so that a run
killed halfway ends at the same ones when it runs again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from slackwater.kafka_logging import once_per_interval
from slackwater.markers import MarkerStatus, TopicPartitionKey
from spark_consumer.source.driver.plan import Plan
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.shared.options import (
    SourceError,
    SourceOptions,
    channel,
    ending_by_partition,
)
from spark_consumer.source.wire.offset import SourceOffset

log = logging.getLogger("spark_consumer.source.driver.planner").getChild("run_ends")
# Said at most once every 30 s: the run asks every second.
log_waiting = once_per_interval("spark_consumer.source.driver.planner.run_ends.waiting")
# Where an offset keeps a bounded run's ends (in ``planned_with``).
KEPT = "ends"


@dataclass
class Ends:
    """The ends of one run: the partitions of each topic there were when it started;
    each partition's ceiling, fixed by the first log end the run sees at or past its
    read position; the control topic's likewise."""

    counts: dict[str, int]
    data: dict[TopicPartitionKey, int] = field(default_factory=dict)
    control: dict[str, int] = field(default_factory=dict)

    def within(self, key: TopicPartitionKey) -> bool:
        return key[0] in self.counts and key[1] < self.counts[key[0]]

    def see(
        self, now: PlanAnswers, given: dict[TopicPartitionKey, int], start: SourceOffset
    ) -> None:
        """Fixes the ceilings ``now`` shows for the first time (``given``: offsets asked
        for). A log end below the read position fixes nothing: it is Kafka's evidence's
        to judge (a stale leader's, or gone back), never an end. A topic the query
        reads that the run's first look did not list is taken when it is listed."""
        for topic in set(start.data).intersection(now.counts).difference(self.counts):
            self.counts[topic] = now.counts[topic]
        for key, end in now.latest.items():
            position = start.data.get(key[0], {}).get(str(key[1]))
            if key in self.data or not self.within(key) or end < (position or 0):
                continue
            ceiling = _given_end(key, end, given)
            self.data[key] = ceiling if position is None else max(position, ceiling)
        for partition, end in now.control_ends.items():
            if partition not in self.control and end >= start.control.get(partition, 0):
                self.control[partition] = end

    def capped(self, now: PlanAnswers) -> PlanAnswers:
        """``now`` as this run plans on it: nothing past its ceilings, no partition or
        topic that appeared after it started. (Kafka's evidence judges ``now`` itself.)"""
        counts = {t: min(n, self.counts[t]) for t, n in now.counts.items() if t in self.counts}
        latest = {k: min(e, self.data.get(k, e)) for k, e in now.latest.items() if self.within(k)}
        control = {p: min(e, self.control.get(p, e)) for p, e in now.control_ends.items()}
        return replace(now, counts=counts, latest=latest, control_ends=control)

    def encode(self) -> dict[str, Any]:
        data: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(self.data.items()):
            data.setdefault(topic, {})[str(partition)] = end
        return {"counts": dict(self.counts), "data": data, "control": dict(self.control)}

    @classmethod
    def decode(cls, kept: Any) -> Ends:
        try:
            return cls(
                counts={str(t): int(n) for t, n in kept["counts"].items()},
                data={
                    (str(t), int(p)): int(end)
                    for t, partitions in kept["data"].items()
                    for p, end in partitions.items()
                },
                control={str(p): int(end) for p, end in kept["control"].items()},
            )
        except (LookupError, TypeError, ValueError, AttributeError) as error:
            raise SourceError(
                f"the checkpoint's bounded run ends (endingOffsets) are unreadable: {error}; "
                "start the query on a new checkpointLocation"
            ) from None


def _given_end(key: TopicPartitionKey, log_end: int, given: dict[TopicPartitionKey, int]) -> int:
    asked = given.get(key, -1)
    if asked in (-1, log_end):
        return log_end
    if asked > log_end:
        log.warning(
            "endingOffsets asks %s[%d] to %d; its log ended at %d when the run started: "
            "it ends there",
            key[0],
            key[1],
            asked,
            log_end,
        )
        return log_end
    return asked


class RunEnds:
    """The run's ends, once Spark says it runs under availableNow
    (``prepareForTriggerAvailableNow``); a plan bounds what it plans by them."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.available_now = False
        self.ends: Ends | None = None
        # The offsets endingOffsets names (none: latest, or unbounded).
        self._given = ending_by_partition(options.ending_offsets or "latest") or {}
        # What the last plan saw of the broker (owes_records).
        self._now: PlanAnswers | None = None

    @property
    def bounded(self) -> bool:
        return self.options.ending_offsets is not None

    def prepare(self) -> None:
        """Spark runs this query under availableNow: the ends are the first plan's."""
        self.available_now, self.ends, self._now = True, None, None

    def see(self, now: PlanAnswers, start: SourceOffset) -> None:
        """Fixes the run's ends from what the plan sees (a bounded run: from its first
        run's, kept in the offset)."""
        if not self.available_now:
            if self.bounded:
                raise SourceError(
                    "option 'endingOffsets' makes a run that ends: start the query with "
                    "trigger(availableNow=True) (under another trigger it would never end), "
                    "or leave endingOffsets out"
                )
            return
        if self.ends is None:
            kept = start.planned_with.get(KEPT) if self.bounded else None
            if kept is None:
                self._refuse_partitions_not_there(now)
            self.ends = Ends.decode(kept) if kept is not None else Ends(counts=dict(now.counts))
            if kept is not None and start.status == "FINISHED":
                log.warning(
                    "this checkpoint's bounded run (endingOffsets %s) has ended: every "
                    "partition is FINISHED at its end and every window is written, so this "
                    "run reads nothing; a new backfill needs a new checkpointLocation",
                    self.options.ending_offsets,
                )
        self.ends.see(now, self._given, start)
        self._now = now

    def _refuse_partitions_not_there(self, now: PlanAnswers) -> None:
        """A bounded run's first look: ``endingOffsets`` naming a partition past its topic's
        count (Kafka lists the topic with fewer) is refused, as Spark's batch reader does;
        it would otherwise be ignored. A topic not listed yet is waited for, as ever."""
        absent = sorted(
            (topic, partition)
            for topic, partition in self._given
            if topic in now.counts and partition >= now.counts[topic]
        )
        if absent:
            where = ", ".join(f"{t}[{p}] ({t} has {now.counts[t]})" for t, p in absent[:5])
            raise SourceError(
                f"option 'endingOffsets' names partitions that do not exist: {where}; "
                "name only partitions the topics have (a partition left out ends at its "
                "log end)"
            )

    def capped(self, now: PlanAnswers) -> PlanAnswers:
        """What the plan may plan on: all of ``now``, but under availableNow nothing
        past the run's ends."""
        return self.ends.capped(now) if self.available_now and self.ends is not None else now

    def owes_eviction(self, start: SourceOffset) -> bool:
        """Under availableNow, a batch whose watermark Spark has not applied yet (the
        last one moved it) is followed by one more, its synthetic row alone: Spark owes
        a no-data batch for it only while the run that ran it lives, and a run killed
        in between would never write the windows it closes (a bounded run's: never)."""
        return self.available_now and start.watermark > start.late_threshold

    def owes_records(self, start: SourceOffset) -> bool:
        """Whether a plan that returns ``start`` must not end the run: a partition of
        the run not FINISHED is below its ceiling, has none yet (its log end not
        answered, or only below its position), or is listed but not joined yet."""
        if not self.available_now or self.ends is None or self._now is None:
            return False
        statuses, listed, owed = start.statuses(), self._now.counts, []
        for topic, count in self.ends.counts.items():
            for partition in range(count):
                if statuses.get(channel(topic, partition)) == "FINISHED":
                    continue
                position = start.data.get(topic, {}).get(str(partition))
                ceiling = self.ends.data.get((topic, partition))
                if position is None:
                    if partition < listed.get(topic, 0):
                        owed.append((topic, partition))
                elif ceiling is None or position < ceiling:
                    owed.append((topic, partition))
        if owed:
            log_waiting.warning(
                "the run waits for %s (its log end not answered, or below its position): "
                "a run under availableNow reads every partition to its end",
                ", ".join(f"{t}[{p}]" for t, p in owed[:5])
                + (f" and {len(owed) - 5} more" if len(owed) > 5 else ""),
            )
        return bool(owed)

    def finish_ended(self, plan: Plan) -> None:
        """A bounded run: every partition read to its end counts as FINISHED."""
        if not self.bounded or self.ends is None:
            return
        for (topic, partition), end in self.ends.data.items():
            position = plan.data.get(topic, {}).get(str(partition))
            state = plan.aligner.partitions.get(channel(topic, partition))
            if position is None or position < end or state is None:
                continue
            if state.status is not MarkerStatus.FINISHED:
                plan.aligner.finish(channel(topic, partition))
                plan.count("partitions_ended")

    def kept(self) -> dict[str, Any]:
        """What the offset keeps of a bounded run's ends."""
        return {KEPT: self.ends.encode()} if self.bounded and self.ends is not None else {}
