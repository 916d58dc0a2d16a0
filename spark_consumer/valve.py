"""The StatusWatermarkValve: Apache Flink's rules for combining per-channel
watermarks and statuses into one output, plus the FINISHED status of
FLINK-38477.

Channels are data partitions. The rules are semantics.md §5; each is restated in a
comment at the line that implements it. This module imports nothing from
Spark so that the rules can be tested on their own.

Finding the minimum does not scan the channels. Aligned channels sit in a
binary heap (as in Flink since FLINK-30544), with one twist that suits
Python's C-implemented ``heapq``: a heap entry holds a *lower bound* of its
channel's watermark, not the exact value. Channel watermarks only grow, so a
bound stays a bound; a watermark input only updates the channel, and the
heap top is refreshed (``heapreplace``) when it is looked at and found stale.
Every input re-derives the min (semantics.md §5, as Flink master after FLINK-40475):
a look at the heap top, O(1) when it is fresh, plus at most one O(log n)
refresh per stale entry, each paid for by an earlier watermark input.

The only walk over all channels is the "flush" (rules 2 and 4) after the
channel holding the running maximum has finished, and it runs at most once per
such finish.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

MIN_WATERMARK = -(2**63)
MAX_WATERMARK = 2**63 - 1


class WatermarkStatus(enum.Enum):
    """Status of a channel or of the valve's output (Flink's WatermarkStatus + FINISHED)."""

    ACTIVE = "ACTIVE"
    IDLE = "IDLE"
    FINISHED = "FINISHED"


@dataclass(frozen=True, slots=True)
class Watermark:
    """A watermark the valve emits: event time in milliseconds since the epoch."""

    timestamp: int


Emitted = Watermark | WatermarkStatus


class _Channel:
    """Per-channel state: watermark, status, alignment, heap membership."""

    __slots__ = ("aligned", "id", "in_heap", "status", "watermark")

    def __init__(self, channel_id: Hashable) -> None:
        self.id = channel_id
        self.watermark = MIN_WATERMARK
        self.status = WatermarkStatus.ACTIVE
        self.aligned = False
        self.in_heap = False


class StatusWatermarkValve:
    """Combines the watermarks and statuses of many channels into one output.

    Every method that takes an input returns the elements it emits, in order:
    ``Watermark`` objects and ``WatermarkStatus`` members (an empty list when
    the input changes nothing downstream).
    """

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self._channels: dict[Hashable, _Channel] = {}
        # Heap of (lower bound of watermark, insertion number, channel): the
        # insertion number keeps comparisons away from channel ids of any type.
        self._aligned_heap: list[tuple[int, int, _Channel]] = []
        self._insertions = 0
        self._active_count = 0
        self._finished_count = 0
        # Running maximum over channels that are not FINISHED (for the flush);
        # None when a finish removed the channel that held it.
        self._max_unfinished: int | None = MIN_WATERMARK
        self._output_watermark = MIN_WATERMARK
        self._output_status = WatermarkStatus.ACTIVE
        for channel_id in channels:
            if channel_id in self._channels:
                raise ValueError(f"duplicate channel {channel_id!r}")
            channel = _Channel(channel_id)
            self._channels[channel_id] = channel
            self._active_count += 1
            # Every channel starts ACTIVE and aligned at MIN_WATERMARK.
            self._mark_aligned(channel)

    # ------------------------------------------------------------------ output

    @property
    def watermark(self) -> int:
        """The last watermark emitted (MIN_WATERMARK before the first)."""
        return self._output_watermark

    @property
    def status(self) -> WatermarkStatus:
        """The last status emitted (ACTIVE at start)."""
        return self._output_status

    @property
    def channels(self) -> list[Hashable]:
        return list(self._channels)

    def channel_watermark(self, channel_id: Hashable) -> int:
        return self._channel(channel_id).watermark

    def channel_status(self, channel_id: Hashable) -> WatermarkStatus:
        return self._channel(channel_id).status

    def waits_for(self, channel_id: Hashable) -> bool:
        """Whether the output waits for the channel: ACTIVE and counted in the minimum
        (False for a channel the valve does not have)."""
        channel = self._channels.get(channel_id)
        return channel is not None and channel.aligned

    def channel_aligned(self, channel_id: Hashable) -> bool:
        """Whether the channel counts in the minimum (ACTIVE and caught up with the output)."""
        return self._channel(channel_id).aligned

    # ------------------------------------------------------------------ inputs

    def add_channel(self, channel_id: Hashable) -> list[Emitted]:
        """Adds a channel (a new partition): ACTIVE at MIN_WATERMARK.

        Emits ``WatermarkStatus.ACTIVE`` when the output was IDLE, as rule 3 does for a
        channel that becomes active; a channel at MIN_WATERMARK never moves the output.
        """
        if self._output_status is WatermarkStatus.FINISHED:
            # Rule 4: a FINISHED output is final; no channel may join it.
            raise ValueError(f"cannot add channel {channel_id!r}: the valve is FINISHED")
        if channel_id in self._channels:
            raise ValueError(f"channel {channel_id!r} already exists")
        channel = _Channel(channel_id)
        self._channels[channel_id] = channel
        self._active_count += 1
        # A new channel is aligned only if its watermark >= the output watermark.
        if channel.watermark >= self._output_watermark:
            self._mark_aligned(channel)
        # As rule 3: ACTIVE first if the output was IDLE, then re-derive the min.
        return self._active_output_then_min()

    def input_watermark(self, channel_id: Hashable, timestamp: int) -> list[Emitted]:
        """Rule 1: a watermark from one channel."""
        channel = self._channel(channel_id)
        # Rule 1: ignored unless the channel and the output are both ACTIVE
        # (so a FINISHED channel's MAX_WATERMARK changes nothing either).
        if (
            channel.status is not WatermarkStatus.ACTIVE
            or self._output_status is not WatermarkStatus.ACTIVE
        ):
            return []
        # Rule 1: only a watermark above the channel's own one counts.
        if timestamp <= channel.watermark:
            return []
        channel.watermark = timestamp
        max_unfinished = self._max_unfinished
        if max_unfinished is not None and timestamp > max_unfinished:
            self._max_unfinished = timestamp
        # Rule 1: an unaligned channel aligns once its watermark reaches the output.
        if not channel.aligned and timestamp >= self._output_watermark:
            self._mark_aligned(channel)
        # Rule 1: then re-derive the min, whether or not this channel is aligned now:
        # another aligned channel may be waiting to be emitted (FLINK-40475).
        return self._rederive_min()

    def input_status(self, channel_id: Hashable, status: WatermarkStatus) -> list[Emitted]:
        """Rules 2 to 5: a status from one channel."""
        channel = self._channel(channel_id)
        # Rule 5: the same status again, or anything after FINISHED, changes nothing.
        if status is channel.status or channel.status is WatermarkStatus.FINISHED:
            return []
        if status is WatermarkStatus.IDLE:
            return self._active_to_idle(channel)
        if status is WatermarkStatus.ACTIVE:
            return self._idle_to_active(channel)
        return self._to_finished(channel)

    # ------------------------------------------------------------ transitions

    def _active_to_idle(self, channel: _Channel) -> list[Emitted]:
        # Rule 2: the channel becomes IDLE and unaligned.
        channel.status = WatermarkStatus.IDLE
        self._active_count -= 1
        channel.aligned = False
        if self._active_count == 0:
            # Rule 2: no channel is ACTIVE any more: flush (the max over channels not
            # FINISHED, whatever this channel's watermark: the result must not depend on
            # the order in which channels went idle, FLINK-40475), then emit IDLE.
            emitted = self._flush()
            self._output_status = WatermarkStatus.IDLE
            emitted.append(WatermarkStatus.IDLE)
            return emitted
        # Rule 2: otherwise re-derive the min over the remaining aligned ACTIVE channels.
        return self._rederive_min()

    def _idle_to_active(self, channel: _Channel) -> list[Emitted]:
        # Rule 3: the channel becomes ACTIVE ...
        channel.status = WatermarkStatus.ACTIVE
        self._active_count += 1
        # ... aligned only if its watermark >= the output watermark ...
        if channel.watermark >= self._output_watermark:
            self._mark_aligned(channel)
        # ... if the output was IDLE, ACTIVE is emitted first (downstream must not
        # drop the watermark that follows while it still sees IDLE), then the min is
        # re-derived: a channel realigned as the only aligned one moves the output at
        # once instead of stalling it (FLINK-40475).
        return self._active_output_then_min()

    def _to_finished(self, channel: _Channel) -> list[Emitted]:
        # Rule 4: FINISHED is terminal; the channel leaves every min and max.
        if channel.status is WatermarkStatus.ACTIVE:
            self._active_count -= 1
        channel.status = WatermarkStatus.FINISHED
        channel.aligned = False
        self._finished_count += 1
        if self._max_unfinished is not None and channel.watermark >= self._max_unfinished:
            self._max_unfinished = None  # recomputed by the next flush that needs it
        if self._finished_count == len(self._channels):
            # Rule 4: every channel FINISHED: MAX_WATERMARK (if greater), then FINISHED.
            emitted: list[Emitted] = []
            if self._output_watermark < MAX_WATERMARK:
                self._output_watermark = MAX_WATERMARK
                emitted.append(Watermark(MAX_WATERMARK))
            self._output_status = WatermarkStatus.FINISHED
            emitted.append(WatermarkStatus.FINISHED)
            return emitted
        if self._active_count == 0 and self._output_status is WatermarkStatus.ACTIVE:
            # Rule 4: no channel ACTIVE and the output ACTIVE: the unconditional
            # flush of rule 2, then IDLE.
            emitted = self._flush()
            self._output_status = WatermarkStatus.IDLE
            emitted.append(WatermarkStatus.IDLE)
            return emitted
        # Rule 4: otherwise re-derive the min.
        return self._rederive_min()

    # ---------------------------------------------------------------- helpers

    def _channel(self, channel_id: Hashable) -> _Channel:
        try:
            return self._channels[channel_id]
        except KeyError:
            raise KeyError(f"unknown channel {channel_id!r}") from None

    def _mark_aligned(self, channel: _Channel) -> None:
        channel.aligned = True
        if not channel.in_heap:
            channel.in_heap = True
            self._insertions += 1
            heapq.heappush(self._aligned_heap, (channel.watermark, self._insertions, channel))

    def _min_aligned(self) -> int | None:
        """The minimum watermark over aligned ACTIVE channels (None if none).

        Pops entries of channels that left the aligned set, and refreshes an
        entry whose bound is below its channel's watermark, until the top is
        exact.
        """
        heap = self._aligned_heap
        while heap:
            bound, _, channel = heap[0]
            if not channel.aligned:
                heapq.heappop(heap)
                channel.in_heap = False
            elif bound < channel.watermark:
                self._insertions += 1
                heapq.heapreplace(heap, (channel.watermark, self._insertions, channel))
            else:
                return bound
        return None

    def _active_output_then_min(self) -> list[Emitted]:
        """Rule 3's emissions once a channel is ACTIVE: ACTIVE if the output was IDLE,
        then the re-derived min."""
        emitted: list[Emitted] = []
        if self._output_status is WatermarkStatus.IDLE:
            self._output_status = WatermarkStatus.ACTIVE
            emitted.append(WatermarkStatus.ACTIVE)
        return emitted + self._rederive_min()

    def _rederive_min(self) -> list[Emitted]:
        """semantics.md §5's "re-derive the min": the min over aligned ACTIVE channels, if greater.

        Keeps the invariant: whenever some channel is aligned and ACTIVE, the output
        watermark equals that minimum (aligned channels never sit below the output).
        """
        new_min = self._min_aligned()
        if new_min is not None and new_min > self._output_watermark:
            self._output_watermark = new_min
            return [Watermark(new_min)]
        return []

    def _flush(self) -> list[Emitted]:
        """Emits the max watermark over channels not FINISHED, if greater (rules 2, 4)."""
        if self._max_unfinished is None:
            self._max_unfinished = max(
                (
                    c.watermark
                    for c in self._channels.values()
                    if c.status is not WatermarkStatus.FINISHED
                ),
                default=MIN_WATERMARK,
            )
        if self._max_unfinished > self._output_watermark:
            self._output_watermark = self._max_unfinished
            return [Watermark(self._max_unfinished)]
        return []

    # ------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, Any]:
        """A JSON-serialisable copy of the whole state (channel ids must be JSON-able)."""
        return {
            "output_watermark": self._output_watermark,
            "output_status": self._output_status.value,
            "channels": [
                [c.id, c.watermark, c.status.value, c.aligned] for c in self._channels.values()
            ],
        }

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> StatusWatermarkValve:
        """Rebuilds a valve from ``snapshot()``; it then behaves as the original."""
        valve = cls([])
        valve._output_watermark = int(snapshot["output_watermark"])
        valve._output_status = WatermarkStatus(snapshot["output_status"])
        valve._max_unfinished = None
        for raw_id, watermark, status, aligned in snapshot["channels"]:
            channel_id = tuple(raw_id) if isinstance(raw_id, list) else raw_id
            channel = _Channel(channel_id)
            channel.watermark = int(watermark)
            channel.status = WatermarkStatus(status)
            valve._channels[channel_id] = channel
            if channel.status is WatermarkStatus.ACTIVE:
                valve._active_count += 1
            elif channel.status is WatermarkStatus.FINISHED:
                valve._finished_count += 1
            if aligned:
                valve._mark_aligned(channel)
        return valve
