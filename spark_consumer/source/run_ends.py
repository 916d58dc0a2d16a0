"""Where a run ends (docs/source.md, "Scheduled and bounded runs"; issue 32).

Under ``trigger(availableNow=True)`` a run reads every subscribed partition to the log
end seen when it starts, and no further: records written after, partitions and topics
that appear after wait for the next run, and so do markers written after. Spark ends
the run at the first plan that returns its start: no new data, and no batch owed to a
watermark that moved. The valve's output for the last records is planned one plan
after they are read (their progress comes back then), so a run ends like this::

    plan   1 ........ k            k+1                  k+2           k+3
    reads  records to the ends     nothing              nothing       -
    plans  V from what was read    V from the last      (Spark's own  start again:
           before                  records + markers    no-data batch) the run ends
    Spark  windows up to V(k-1)    windows up to V(k)   evicts to V(k+1)

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
from slackwater.markers import MarkerStatus
from spark_consumer.source.broker import BrokerView
from spark_consumer.source.offset import SourceOffset
from spark_consumer.source.options import (
    SourceError,
    SourceOptions,
    channel,
    ending_by_partition,
)
from spark_consumer.source.plan import Plan

log = logging.getLogger("spark_consumer.source.planner").getChild("run_ends")
# Said at most once every 30 s: the run asks every second.
log_waiting = once_per_interval("spark_consumer.source.planner.run_ends.waiting")
# A partition of a topic: (topic, partition).
Key = tuple[str, int]
# Where an offset keeps a bounded run's ends (in ``planned_with``).
KEPT = "ends"


@dataclass
class Ends:
    """The ends of one run: each partition's log end, fixed the first time the run sees
    it; the partitions of each topic there were when it started; the control topic's
    ends likewise."""

    counts: dict[str, int]
    data: dict[Key, int] = field(default_factory=dict)
    control: dict[str, int] = field(default_factory=dict)

    def bound(self, now: BrokerView, given: dict[Key, int], read: set[str]) -> BrokerView:
        """``now`` as this run sees it: nothing past its ends (``given``: offsets asked
        for, taken up to the log end). A topic the query reads (``read``) that the run's
        first look did not list is taken as first listed: it never vanishes for that."""
        for topic in read.intersection(now.counts).difference(self.counts):
            self.counts[topic] = now.counts[topic]
        for key, end in now.latest.items():
            if key[0] in self.counts and key[1] < self.counts[key[0]]:
                self.data.setdefault(key, _given_end(key, end, given))
        for partition, end in now.control_ends.items():
            self.control.setdefault(partition, end)
        counts = {t: min(n, self.counts[t]) for t, n in now.counts.items() if t in self.counts}
        latest = {k: min(e, self.data[k]) for k, e in now.latest.items() if k in self.data}
        control = {p: min(e, self.control[p]) for p, e in now.control_ends.items()}
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


def _given_end(key: Key, log_end: int, given: dict[Key, int]) -> int:
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
    (``prepareForTriggerAvailableNow``); a plan bounds what it sees by them."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.available_now = False
        self.ends: Ends | None = None
        self._given = (
            ending_by_partition(options.ending_offsets) or {} if options.ending_offsets else {}
        )

    @property
    def bounded(self) -> bool:
        return self.options.ending_offsets is not None

    def prepare(self) -> None:
        """Spark runs this query under availableNow: the ends are the first plan's."""
        self.available_now, self.ends = True, None

    def bound(self, now: BrokerView, start: SourceOffset) -> BrokerView:
        """What the plan may see of ``now``: all of it, but under availableNow nothing
        past the run's ends (a bounded run: the ends its first run fixed)."""
        if not self.available_now:
            if self.bounded:
                raise SourceError(
                    "option 'endingOffsets' makes a run that ends: start the query with "
                    "trigger(availableNow=True) (under another trigger it would never end), "
                    "or leave endingOffsets out"
                )
            return now
        if self.ends is None:
            kept = start.planned_with.get(KEPT) if self.bounded else None
            self.ends = Ends.decode(kept) if kept is not None else Ends(counts=dict(now.counts))
        return self.ends.bound(now, self._given, set(start.data))

    def waits_for(self, now: BrokerView) -> bool:
        """Whether a run must ask again before it plans: a partition of the run whose
        log end the broker did not give (its leader is down, or moving) would stand
        still, and a run whose plan returns its start ends, that partition unread."""
        if not self.available_now:
            return False
        missing = [
            (t, p) for t, n in now.counts.items() for p in range(n) if (t, p) not in now.latest
        ]
        if missing:
            said = ", ".join(f"{t}[{p}]" for t, p in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            log_waiting.warning(
                "the run waits for the log end of %s%s (no leader answered): a run under "
                "availableNow reads every partition to its end",
                said,
                more,
            )
        return bool(missing)

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
