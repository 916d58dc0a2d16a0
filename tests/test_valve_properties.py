"""The valve against a reference model written with plain scans (same rules),
over random sequences of watermarks and statuses on 1-8 channels."""

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
    """DESIGN §5 read literally: every aggregate is a scan over all channels."""

    channels: dict[int, _RefChannel]
    watermark: int = MIN_WATERMARK
    status: WatermarkStatus = ACTIVE
    out: list[Emitted] = field(default_factory=list)

    def _emit_min(self) -> None:
        aligned = [c.watermark for c in self.channels.values() if c.aligned and c.status is ACTIVE]
        if aligned and min(aligned) > self.watermark:
            self.watermark = min(aligned)
            self.out.append(Watermark(self.watermark))

    def _flush(self) -> None:
        unfinished = [c.watermark for c in self.channels.values() if c.status is not FINISHED]
        if unfinished and max(unfinished) > self.watermark:
            self.watermark = max(unfinished)
            self.out.append(Watermark(self.watermark))

    def _any_active(self) -> bool:
        return any(c.status is ACTIVE for c in self.channels.values())

    def input_watermark(self, cid: int, ts: int) -> list[Emitted]:
        self.out = []
        c = self.channels[cid]
        if c.status is ACTIVE and self.status is ACTIVE and ts > c.watermark:
            c.watermark = ts
            if not c.aligned and ts >= self.watermark:
                c.aligned = True
            self._emit_min()
        return self.out

    def input_status(self, cid: int, status: WatermarkStatus) -> list[Emitted]:
        self.out = []
        c = self.channels[cid]
        if status is c.status or c.status is FINISHED:
            return self.out
        if status is IDLE:
            c.status, c.aligned = IDLE, False
            if not self._any_active():
                if c.watermark == self.watermark:
                    self._flush()
                self.status = IDLE
                self.out.append(IDLE)
            elif c.watermark == self.watermark:
                self._emit_min()
        elif status is ACTIVE:
            c.status = ACTIVE
            c.aligned = c.watermark >= self.watermark
            if self.status is IDLE:
                self.status = ACTIVE
                self.out.append(ACTIVE)
        else:
            c.status, c.aligned = FINISHED, False
            if all(ch.status is FINISHED for ch in self.channels.values()):
                if self.watermark < MAX_WATERMARK:
                    self.watermark = MAX_WATERMARK
                    self.out.append(Watermark(MAX_WATERMARK))
                self.status = FINISHED
                self.out.append(FINISHED)
            elif not self._any_active() and self.status is ACTIVE:
                if c.watermark == self.watermark:
                    self._flush()
                self.status = IDLE
                self.out.append(IDLE)
            elif c.watermark == self.watermark:
                self._emit_min()
        return self.out


# An input: ("w", channel, timestamp) or ("s", channel, status). Timestamps come
# from a small range so that equal watermarks (the rules' "equals the output")
# happen often; MAX_WATERMARK is in the mix too.
def _inputs(channel_count: int) -> st.SearchStrategy[list[tuple[str, int, object]]]:
    channel = st.integers(0, channel_count - 1)
    watermark = st.tuples(
        st.just("w"), channel, st.one_of(st.integers(0, 40), st.just(MAX_WATERMARK))
    )
    status = st.tuples(st.just("s"), channel, st.sampled_from([ACTIVE, IDLE, FINISHED]))
    return st.lists(st.one_of(watermark, watermark, status), max_size=120)


scenarios = st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), _inputs(n)))


def _feed(
    valve: StatusWatermarkValve | ReferenceValve, kind: str, cid: int, value: object
) -> list[Emitted]:
    if kind == "w":
        assert isinstance(value, int)
        return valve.input_watermark(cid, value)
    assert isinstance(value, WatermarkStatus)
    return valve.input_status(cid, value)


@settings(max_examples=400, deadline=None)
@given(scenarios)
def test_valve_matches_reference_model_element_by_element(
    scenario: tuple[int, list[tuple[str, int, object]]],
) -> None:
    channel_count, inputs = scenario
    valve = StatusWatermarkValve(range(channel_count))
    reference = ReferenceValve({c: _RefChannel() for c in range(channel_count)})
    for step, (kind, cid, value) in enumerate(inputs):
        expected = list(_feed(reference, kind, cid, value))
        assert _feed(valve, kind, cid, value) == expected, f"step {step}: {kind} {cid} {value}"
        assert (valve.watermark, valve.status) == (reference.watermark, reference.status)


@settings(max_examples=300, deadline=None)
@given(scenarios)
def test_invariants_hold_after_every_input(
    scenario: tuple[int, list[tuple[str, int, object]]],
) -> None:
    channel_count, inputs = scenario
    valve = StatusWatermarkValve(range(channel_count))
    finished: set[int] = set()
    for kind, cid, value in inputs:
        before = valve.watermark
        finished_state = {
            c: (valve.channel_watermark(c), valve.channel_status(c)) for c in finished
        }
        emitted = _feed(valve, kind, cid, value)
        # The output watermark never decreases, and every emitted watermark rises.
        assert valve.watermark >= before
        marks = [e.timestamp for e in emitted if isinstance(e, Watermark)]
        assert marks == sorted(set(marks)) and all(m > before for m in marks)
        # IDLE is emitted only when no channel is ACTIVE.
        if IDLE in emitted:
            assert all(valve.channel_status(c) is not ACTIVE for c in range(channel_count))
        # Nothing changes on a channel after its FINISHED.
        for c, state in finished_state.items():
            assert (valve.channel_watermark(c), valve.channel_status(c)) == state
        # MAX_WATERMARK only once every channel is FINISHED, or once a channel
        # carried it while ACTIVE (FLINK-38477: FINISHED alone never gives it).
        if valve.status is FINISHED:
            assert valve.watermark == MAX_WATERMARK
        elif valve.watermark == MAX_WATERMARK:
            assert any(valve.channel_watermark(c) == MAX_WATERMARK for c in range(channel_count))
        if kind == "s" and value is FINISHED:
            finished.add(cid)


@settings(max_examples=200, deadline=None)
@given(scenarios, st.data())
def test_snapshot_restore_at_any_point_continues_identically(
    scenario: tuple[int, list[tuple[str, int, object]]], data: st.DataObject
) -> None:
    channel_count, inputs = scenario
    cut = data.draw(st.integers(0, len(inputs)))
    valve = StatusWatermarkValve(range(channel_count))
    for kind, cid, value in inputs[:cut]:
        _feed(valve, kind, cid, value)
    restored = StatusWatermarkValve.restore(valve.snapshot())
    for kind, cid, value in inputs[cut:]:
        assert _feed(restored, kind, cid, value) == _feed(valve, kind, cid, value)
