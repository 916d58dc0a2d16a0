"""The valve against a reference model written from semantics.md §5's text as plain scans,
over random sequences of watermarks, status flips, finishes and new channels."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_consumer.valve import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    StatusWatermarkValve,
    Watermark,
    WatermarkStatus,
)

ACTIVE, IDLE, FINISHED = WatermarkStatus.ACTIVE, WatermarkStatus.IDLE, WatermarkStatus.FINISHED
Emitted = Watermark | WatermarkStatus


@dataclass
class _RefChannel:
    watermark: int = MIN_WATERMARK
    status: WatermarkStatus = ACTIVE
    aligned: bool = True


@dataclass
class ReferenceValve:
    """semantics.md §5 read sentence by sentence, every aggregate a plain scan of all channels.

    Written from the rules' text, not from valve.py: each method quotes the rule it
    implements, in the rule's own order.
    """

    channels: dict[int, _RefChannel]
    watermark: int = MIN_WATERMARK
    status: WatermarkStatus = ACTIVE
    out: list[Emitted] = field(default_factory=list)

    def _rederive_min(self) -> None:
        # "take the minimum watermark over the aligned ACTIVE channels; if there is one
        # and it is greater than the output watermark, emit it"
        aligned = [c.watermark for c in self.channels.values() if c.aligned and c.status is ACTIVE]
        if aligned and min(aligned) > self.watermark:
            self.watermark = min(aligned)
            self.out.append(Watermark(self.watermark))

    def _flush(self) -> None:
        # "emit the maximum watermark over all channels that are not FINISHED if it is
        # greater than the output"
        unfinished = [c.watermark for c in self.channels.values() if c.status is not FINISHED]
        if unfinished and max(unfinished) > self.watermark:
            self.watermark = max(unfinished)
            self.out.append(Watermark(self.watermark))

    def _no_channel_active(self) -> bool:
        return not any(c.status is ACTIVE for c in self.channels.values())

    def input_watermark(self, cid: int, ts: int) -> list[Emitted]:
        self.out = []
        c = self.channels[cid]
        # Rule 1: "ignored unless channel c is ACTIVE and the output status is ACTIVE"
        if c.status is not ACTIVE or self.status is not ACTIVE:
            return self.out
        # "If ts is above the channel's watermark it becomes the channel's watermark"
        c.watermark = max(c.watermark, ts)
        # "an unaligned channel becomes aligned when its watermark reaches the output"
        if not c.aligned and c.watermark >= self.watermark:
            c.aligned = True
        # "then re-derive the min, whether or not c is aligned now"
        self._rederive_min()
        return self.out

    def add_channel(self, cid: int) -> list[Emitted]:
        self.out = []
        # "a new partition: ACTIVE, aligned only if its watermark >= output watermark";
        # it becomes ACTIVE as in rule 3, so the same emissions follow.
        self.channels[cid] = _RefChannel(aligned=self.watermark <= MIN_WATERMARK)
        if self.status is IDLE:
            self.status = ACTIVE
            self.out.append(ACTIVE)
        self._rederive_min()
        return self.out

    def input_status(self, cid: int, status: WatermarkStatus) -> list[Emitted]:
        self.out = []
        c = self.channels[cid]
        # Rule 5: "A status equal to the channel's current one, and anything after
        # FINISHED on that channel, changes nothing and emits nothing."
        if status is c.status or c.status is FINISHED:
            return self.out
        if status is IDLE:
            # Rule 2: "the channel becomes IDLE and unaligned"
            c.status, c.aligned = IDLE, False
            if self._no_channel_active():
                # "emit the maximum ... ("flush", unconditional ...), then emit IDLE"
                self._flush()
                self.status = IDLE
                self.out.append(IDLE)
            else:
                # "Otherwise re-derive the min."
                self._rederive_min()
        elif status is ACTIVE:
            # Rule 3: "ACTIVE, aligned only if its watermark >= the output watermark"
            c.status = ACTIVE
            c.aligned = c.watermark >= self.watermark
            # "if the output status was IDLE, emit ACTIVE; then re-derive the min"
            if self.status is IDLE:
                self.status = ACTIVE
                self.out.append(ACTIVE)
            self._rederive_min()
        else:
            # Rule 4: "terminal, the channel leaves every min and max"
            c.status, c.aligned = FINISHED, False
            if all(ch.status is FINISHED for ch in self.channels.values()):
                # "emit MAX_WATERMARK (if greater) then FINISHED"
                if self.watermark < MAX_WATERMARK:
                    self.watermark = MAX_WATERMARK
                    self.out.append(Watermark(MAX_WATERMARK))
                self.status = FINISHED
                self.out.append(FINISHED)
            elif self._no_channel_active() and self.status is ACTIVE:
                # "the flush of rule 2, then IDLE"
                self._flush()
                self.status = IDLE
                self.out.append(IDLE)
            else:
                # "Else re-derive the min."
                self._rederive_min()
        return self.out

    def invariant_holds(self) -> bool:
        """ "when some channel is aligned and ACTIVE, the output watermark equals that minimum"."""
        aligned = [c.watermark for c in self.channels.values() if c.aligned and c.status is ACTIVE]
        return not aligned or min(aligned) == self.watermark


Input = tuple[str, int, object]
MAX_CHANNELS = 6


# An input: ("w", channel, timestamp), ("w+", channel, step) (the channel's own
# watermark plus step, so that it always counts), ("s", channel, status) or
# ("a", 0, None) (a new channel). Few channels, many status flips and watermarks from a
# small range, so that ties with the output, realignment after idleness and every flush
# order are common: the stall of FLINK-40475 needs an unaligned ACTIVE channel beside
# idle ones, and a strategy with uniform channels and wide timestamps missed it.
def _inputs(channel_count: int) -> st.SearchStrategy[list[Input]]:
    channel = st.integers(0, channel_count - 1) | st.integers(0, MAX_CHANNELS - 1)
    absolute = st.tuples(st.just("w"), channel, st.integers(0, 30) | st.just(MAX_WATERMARK))
    step = st.tuples(st.just("w+"), channel, st.integers(1, 8))
    flip = st.tuples(st.just("s"), channel, st.sampled_from([IDLE, ACTIVE]))
    finish = st.tuples(st.just("s"), channel, st.just(FINISHED))
    add = st.tuples(st.just("a"), st.just(0), st.none())
    one = st.one_of(step, flip, step, flip, absolute, flip, finish, add)
    return st.lists(one, min_size=8, max_size=60)


scenarios = st.integers(2, 5).flatmap(lambda n: st.tuples(st.just(n), _inputs(n)))


def _feed(
    valve: StatusWatermarkValve | ReferenceValve, kind: str, cid: int, value: object
) -> list[Emitted] | None:
    """Feeds one input; None when it does not apply (no such channel, or no room to add)."""
    channel_count = len(valve.channels)
    if kind == "a":
        if channel_count >= MAX_CHANNELS or valve.status is FINISHED:
            return None
        return valve.add_channel(channel_count)
    if cid >= channel_count:
        return None
    if kind == "w+":
        assert isinstance(value, int)
        current = (
            valve.channel_watermark(cid)
            if isinstance(valve, StatusWatermarkValve)
            else valve.channels[cid].watermark
        )
        return valve.input_watermark(cid, min(MAX_WATERMARK, max(current, 0) + value))
    if kind == "w":
        assert isinstance(value, int)
        return valve.input_watermark(cid, value)
    assert isinstance(value, WatermarkStatus)
    return valve.input_status(cid, value)


def _aligned_minimum(valve: StatusWatermarkValve) -> int | None:
    aligned = [
        valve.channel_watermark(c)
        for c in valve.channels
        if valve.channel_aligned(c) and valve.channel_status(c) is ACTIVE
    ]
    return min(aligned) if aligned else None


@settings(max_examples=2_500, deadline=None)
@given(scenarios)
def test_valve_matches_reference_model_element_by_element(
    scenario: tuple[int, list[Input]],
) -> None:
    channel_count, inputs = scenario
    valve = StatusWatermarkValve(range(channel_count))
    reference = ReferenceValve({c: _RefChannel() for c in range(channel_count)})
    for step, (kind, cid, value) in enumerate(inputs):
        expected = _feed(reference, kind, cid, value)
        assert _feed(valve, kind, cid, value) == expected, f"step {step}: {kind} {cid} {value}"
        assert (valve.watermark, valve.status) == (reference.watermark, reference.status)
        assert [
            (valve.channel_watermark(c), valve.channel_status(c), valve.channel_aligned(c))
            for c in valve.channels
        ] == [(c.watermark, c.status, c.aligned) for c in reference.channels.values()]
        # semantics.md §5's invariant, on both: the output is the min over aligned ACTIVE channels.
        assert reference.invariant_holds(), f"step {step}"
        minimum = _aligned_minimum(valve)
        assert minimum is None or minimum == valve.watermark, f"step {step}"


@settings(max_examples=500, deadline=None)
@given(scenarios)
def test_invariants_hold_after_every_input(
    scenario: tuple[int, list[Input]],
) -> None:
    channel_count, inputs = scenario
    valve = StatusWatermarkValve(range(channel_count))
    finished: set[int] = set()
    for kind, cid, value in inputs:
        before = valve.watermark
        finished_state = {
            c: (valve.channel_watermark(c), valve.channel_status(c)) for c in finished
        }
        emitted = _feed(valve, kind, cid, value) or []
        # The output watermark never decreases, and every emitted watermark rises.
        assert valve.watermark >= before
        marks = [e.timestamp for e in emitted if isinstance(e, Watermark)]
        assert marks == sorted(set(marks)) and all(m > before for m in marks)
        # ACTIVE goes before any watermark in the same call (rule 3).
        if ACTIVE in emitted:
            assert emitted.index(ACTIVE) == 0
        # IDLE is emitted only when no channel is ACTIVE.
        if IDLE in emitted:
            assert all(valve.channel_status(c) is not ACTIVE for c in valve.channels)
        # Nothing changes on a channel after its FINISHED.
        for c, state in finished_state.items():
            assert (valve.channel_watermark(c), valve.channel_status(c)) == state
        # MAX_WATERMARK only once every channel is FINISHED, or once a channel
        # carried it while ACTIVE (FLINK-38477: FINISHED alone never gives it).
        if valve.status is FINISHED:
            assert valve.watermark == MAX_WATERMARK
        elif valve.watermark == MAX_WATERMARK:
            assert any(valve.channel_watermark(c) == MAX_WATERMARK for c in valve.channels)
        if kind == "s" and value is FINISHED and cid < len(valve.channels):
            finished.add(cid)


@settings(max_examples=300, deadline=None)
@given(scenarios, st.data())
def test_snapshot_restore_at_any_point_continues_identically(
    scenario: tuple[int, list[Input]], data: st.DataObject
) -> None:
    channel_count, inputs = scenario
    cut = data.draw(st.integers(0, len(inputs)))
    valve = StatusWatermarkValve(range(channel_count))
    for kind, cid, value in inputs[:cut]:
        _feed(valve, kind, cid, value)
    restored = StatusWatermarkValve.restore(valve.snapshot())
    for kind, cid, value in inputs[cut:]:
        assert _feed(restored, kind, cid, value) == _feed(valve, kind, cid, value)
    assert restored.snapshot() == valve.snapshot()
