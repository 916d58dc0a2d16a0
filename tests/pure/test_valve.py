"""The valve, rule by rule (semantics.md §5), as Flink's StatusWatermarkValveTest does it:
every test asserts exactly what each input emits, and that nothing else is emitted.
"""

from __future__ import annotations

import pytest

from spark_consumer.valve import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    StatusWatermarkValve,
    Watermark,
    WatermarkStatus,
)

ACTIVE, IDLE, FINISHED = WatermarkStatus.ACTIVE, WatermarkStatus.IDLE, WatermarkStatus.FINISHED


def W(ts: int) -> Watermark:  # noqa: N802 - reads like the emitted element
    return Watermark(ts)


# --------------------------------------------------------------------- start


def test_starts_active_at_min_watermark() -> None:
    valve = StatusWatermarkValve([0, 1])
    assert valve.watermark == MIN_WATERMARK
    assert valve.status is ACTIVE
    assert valve.channel_status(0) is ACTIVE
    assert valve.channel_watermark(1) == MIN_WATERMARK


def test_duplicate_channel_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate channel 1"):
        StatusWatermarkValve([1, 1])


def test_unknown_channel_is_a_key_error_naming_it() -> None:
    valve = StatusWatermarkValve([0])
    with pytest.raises(KeyError, match="unknown channel 7"):
        valve.input_watermark(7, 1)


def test_channel_ids_may_be_any_hashable() -> None:
    valve = StatusWatermarkValve([("t", 0), ("t", 1)])
    assert valve.input_watermark(("t", 0), 5) == []
    assert valve.input_watermark(("t", 1), 3) == [W(3)]


# -------------------------------------------------------------------- rule 1


def test_rule1_output_is_min_over_aligned_active_channels() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    assert valve.input_watermark(0, 10) == []
    assert valve.input_watermark(1, 20) == []
    assert valve.input_watermark(2, 15) == [W(10)]
    assert valve.input_watermark(0, 30) == [W(15)]
    assert valve.input_watermark(2, 40) == [W(20)]
    assert valve.watermark == 20


def test_rule1_watermark_not_above_channel_watermark_is_ignored() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    assert valve.input_watermark(1, 10) == [W(10)]
    assert valve.input_watermark(0, 5) == []
    assert valve.input_watermark(0, 10) == []
    assert valve.channel_watermark(0) == 10


def test_rule1_output_emitted_only_when_greater() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    assert valve.input_watermark(1, 10) == [W(10)]
    # channel 0 moves but channel 1 still holds the min at 10: nothing to emit
    assert valve.input_watermark(0, 12) == []
    assert valve.watermark == 10


def test_rule1_watermark_on_idle_channel_is_ignored() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_status(0, IDLE)
    assert valve.input_watermark(0, 100) == []
    assert valve.channel_watermark(0) == MIN_WATERMARK


def test_rule1_watermark_ignored_while_output_idle() -> None:
    valve = StatusWatermarkValve([0])
    assert valve.input_status(0, IDLE) == [IDLE]
    assert valve.input_watermark(0, 100) == []
    assert valve.watermark == MIN_WATERMARK


def test_rule1_finished_channel_accepts_only_max_watermark_and_emits_nothing() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(1, 5)
    assert valve.input_status(0, FINISHED) == [W(5)]
    assert valve.input_watermark(0, 1_000) == []
    assert valve.input_watermark(0, MAX_WATERMARK) == []
    assert valve.watermark == 5
    assert valve.input_watermark(1, 7) == [W(7)]


def test_rule1_unaligned_channel_aligns_when_it_reaches_output() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 3)
    valve.input_watermark(1, 10)
    assert valve.watermark == 3
    assert valve.input_status(0, IDLE) == [W(10)]
    assert valve.input_status(0, ACTIVE) == []  # 3 < 10: unaligned
    # below the output: still unaligned, so channel 1 alone drives the output
    assert valve.input_watermark(0, 8) == []
    assert valve.input_watermark(1, 20) == [W(20)]
    # channel 0 reaches the output (20): aligned, and now it holds the min
    assert valve.input_watermark(0, 25) == []
    assert valve.input_watermark(1, 30) == [W(25)]


def test_rule1_rederives_min_even_when_the_channel_stays_unaligned() -> None:
    # The smallest disagreement with Flink found by random testing (issue 11); the
    # valve kept it in this state only before rule 3 re-derived the min. A snapshot
    # from then (an old checkpoint) can still hold it: channel 2 aligned at 59 while
    # the output is 57, channel 0 unaligned at MIN.
    valve = StatusWatermarkValve.restore(
        {"output_watermark": 57, "output_status": "ACTIVE",
         "channels": [[0, MIN_WATERMARK, "ACTIVE", False], [1, MIN_WATERMARK, "IDLE", False],
                      [2, 59, "ACTIVE", True], [3, 57, "IDLE", False],
                      [4, MIN_WATERMARK, "IDLE", False]]}
    )  # fmt: skip
    assert valve.input_watermark(0, 44) == [W(59)]  # 44 < 57: channel 0 stays unaligned
    assert not valve.channel_aligned(0)


def test_issue_11_sequence_reaches_59_once() -> None:
    valve = StatusWatermarkValve(range(5))
    steps: list[tuple[str, int, object, list[object]]] = [
        ("w", 3, 33, []),
        ("s", 1, IDLE, []),
        ("s", 0, IDLE, []),
        ("w", 2, 59, []),
        ("s", 4, IDLE, [W(33)]),
        ("s", 0, ACTIVE, []),
        ("s", 2, IDLE, []),
        ("w", 3, 57, [W(57)]),
        ("s", 3, IDLE, []),
        # Flink 2.3.0 emits W59 only at the last input (rule 1); master's rule 3
        # re-derives at once, when channel 2 comes back aligned (59 >= 57).
        ("s", 2, ACTIVE, [W(59)]),
        ("w", 0, 44, []),
    ]
    for kind, channel, value, expected in steps:
        if kind == "w":
            assert isinstance(value, int)
            assert valve.input_watermark(channel, value) == expected
        else:
            assert isinstance(value, WatermarkStatus)
            assert valve.input_status(channel, value) == expected
    assert valve.watermark == 59


# -------------------------------------------------------------------- rule 2


def test_rule2_idle_channel_leaves_min_and_min_advances() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    assert valve.input_watermark(2, 30) == [W(10)]
    assert valve.input_status(0, IDLE) == [W(20)]
    assert valve.status is ACTIVE


def test_rule2_idle_channel_not_holding_output_emits_nothing() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    valve.input_watermark(2, 30)
    assert valve.input_status(2, IDLE) == []
    assert valve.watermark == 10


def test_rule2_last_active_channel_idle_flushes_max_then_emits_idle() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 25)
    valve.input_watermark(2, 15)
    assert valve.watermark == 10
    assert valve.input_status(1, IDLE) == []
    assert valve.input_status(2, IDLE) == []
    # channel 0 holds the output (10): flush to the max over all channels (25)
    assert valve.input_status(0, IDLE) == [W(25), IDLE]
    assert (valve.watermark, valve.status) == (25, IDLE)


def _three_channels_at_5_10_30_then_channel_0_idle_and_back() -> StatusWatermarkValve:
    """Channels 0/1/2 at 5/10/30; then IDLE 0 · ACTIVE 0: output 10, channel 0 unaligned at 5."""
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 5)
    valve.input_watermark(1, 10)
    assert valve.input_watermark(2, 30) == [W(5)]
    assert valve.input_status(0, IDLE) == [W(10)]
    assert valve.input_status(0, ACTIVE) == []  # 5 < 10: unaligned
    assert not valve.channel_aligned(0)
    return valve


def test_rule2_flush_is_unconditional_whichever_channel_goes_idle_last() -> None:
    # FLINK-40475: Flink 2.3.0 flushed only if the last channel to go idle held the
    # output; the output then ended at 10 in this order and at 30 in the other.
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    assert valve.input_status(2, IDLE) == []
    assert valve.input_status(1, IDLE) == []  # channel 0 is still ACTIVE (unaligned)
    assert valve.input_status(0, IDLE) == [W(30), IDLE]  # 0 holds nothing: flush anyway
    assert (valve.watermark, valve.status) == (30, IDLE)


def test_rule2_flush_result_does_not_depend_on_the_order_channels_go_idle() -> None:
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    assert valve.input_status(2, IDLE) == []
    assert valve.input_status(0, IDLE) == []  # the last two steps swapped
    assert valve.input_status(1, IDLE) == [W(30), IDLE]
    assert (valve.watermark, valve.status) == (30, IDLE)


def test_rule2_flush_emits_nothing_when_the_max_is_not_greater() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 40)
    valve.input_watermark(1, 50)
    assert valve.input_status(0, IDLE) == [W(50)]
    assert valve.input_status(0, ACTIVE) == []  # 40 < 50: unaligned
    assert valve.input_status(1, IDLE) == []  # channel 0 is still ACTIVE
    assert valve.input_status(0, IDLE) == [IDLE]  # max 50 == output: no watermark
    assert valve.watermark == 50


def test_rule2_idle_rederives_min_even_when_channel_did_not_hold_output() -> None:
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    # channel 0 (unaligned, 5) goes idle: re-derive gives 10 again, nothing to emit
    assert valve.input_status(0, IDLE) == []
    assert valve.input_status(1, IDLE) == [W(30)]
    assert valve.status is ACTIVE


def test_rule2_flush_ignores_finished_channels() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    valve.input_watermark(2, 90)
    assert valve.input_status(2, FINISHED) == []
    assert valve.input_status(1, IDLE) == []
    # flush: max over channels not FINISHED is 20, not 90
    assert valve.input_status(0, IDLE) == [W(20), IDLE]


# -------------------------------------------------------------------- rule 3


def test_rule3_idle_to_active_while_output_idle_emits_active_without_watermark() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 10)
    valve.input_status(0, IDLE)
    assert valve.input_status(1, IDLE) == [IDLE]
    assert valve.input_status(1, ACTIVE) == [ACTIVE]
    assert (valve.watermark, valve.status) == (10, ACTIVE)


def test_rule3_idle_to_active_while_output_active_emits_nothing() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 10)
    valve.input_status(0, IDLE)
    assert valve.input_status(0, ACTIVE) == []


def test_rule3_reactivated_channel_aligned_when_at_or_above_output() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 30)
    valve.input_watermark(1, 10)
    valve.input_status(0, IDLE)
    assert valve.input_status(0, ACTIVE) == []  # 30 >= 10: aligned at once
    assert valve.input_watermark(1, 50) == [W(30)]


def test_rule3_reactivated_channel_below_output_is_unaligned() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 5)
    valve.input_watermark(1, 10)
    assert valve.input_status(0, IDLE) == [W(10)]
    assert valve.input_status(0, ACTIVE) == []  # 5 < 10: unaligned
    # channel 0 does not hold the output back while unaligned
    assert valve.input_watermark(1, 20) == [W(20)]


def test_rule3_realigned_channel_that_is_the_only_aligned_one_moves_output_at_once() -> None:
    # FLINK-40475: Flink 2.3.0 did not re-derive on ACTIVE, so the output sat at 10
    # (even after W 0 8) until channel 2 advanced again.
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    assert valve.input_status(2, IDLE) == []
    assert valve.input_status(1, IDLE) == []  # 0 still ACTIVE: no flush
    assert valve.input_status(2, ACTIVE) == [W(30)]  # 30 >= 10: aligned, the only one
    assert valve.input_watermark(0, 8) == []  # 8 < 30: channel 0 stays unaligned
    assert valve.watermark == 30


def test_rule3_active_is_emitted_before_the_rederived_watermark() -> None:
    valve = StatusWatermarkValve.restore(
        # All IDLE at output 10, channel 1 at 40: as a valve before FLINK-40475 could
        # leave it (no unconditional flush). ACTIVE 1 then re-derives to 40.
        {"output_watermark": 10, "output_status": "IDLE",
         "channels": [[0, 10, "IDLE", False], [1, 40, "IDLE", False]]}
    )  # fmt: skip
    assert valve.input_status(1, ACTIVE) == [ACTIVE, W(40)]
    assert (valve.watermark, valve.status) == (40, ACTIVE)


# -------------------------------------------------------------------- rule 4


def test_rule4_finished_channel_leaves_min() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    assert valve.input_watermark(2, 30) == [W(10)]
    assert valve.input_status(0, FINISHED) == [W(20)]
    assert valve.status is ACTIVE


def test_rule4_finished_channel_not_holding_output_emits_nothing() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    assert valve.input_status(1, FINISHED) == []
    assert valve.input_watermark(0, 15) == [W(15)]


def test_rule4_all_finished_emits_max_watermark_then_finished() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    assert valve.input_status(0, FINISHED) == [W(20)]
    assert valve.input_status(1, FINISHED) == [W(MAX_WATERMARK), FINISHED]
    assert (valve.watermark, valve.status) == (MAX_WATERMARK, FINISHED)


def test_rule4_all_finished_from_idle_output_emits_max_then_finished() -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_status(0, IDLE)
    assert valve.input_status(1, IDLE) == [IDLE]
    assert valve.input_status(0, FINISHED) == []
    assert valve.input_status(1, FINISHED) == [W(MAX_WATERMARK), FINISHED]


def test_rule4_max_watermark_not_emitted_twice_when_already_there() -> None:
    valve = StatusWatermarkValve([0])
    assert valve.input_watermark(0, MAX_WATERMARK) == [W(MAX_WATERMARK)]
    assert valve.input_status(0, FINISHED) == [FINISHED]


def test_rule4_last_active_channel_finishing_flushes_idle_channels_then_idle() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 40)
    valve.input_watermark(2, 30)
    assert valve.input_status(1, IDLE) == []
    assert valve.input_status(2, IDLE) == []
    # 0 holds the output (10); the flush takes the max over the IDLE ones (40)
    assert valve.input_status(0, FINISHED) == [W(40), IDLE]
    assert valve.status is IDLE


def test_rule4_last_active_channel_finishing_flushes_unconditionally() -> None:
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    assert valve.input_status(2, IDLE) == []
    assert valve.input_status(1, IDLE) == []
    # channel 0 (unaligned at 5) holds nothing; the flush still takes the max (30)
    assert valve.input_status(0, FINISHED) == [W(30), IDLE]
    assert (valve.watermark, valve.status) == (30, IDLE)


def test_rule4_finish_rederives_min_even_when_channel_did_not_hold_output() -> None:
    valve = _three_channels_at_5_10_30_then_channel_0_idle_and_back()
    assert valve.input_status(0, FINISHED) == []  # min over 1 and 2 is still 10
    assert valve.input_status(1, FINISHED) == [W(30)]
    assert valve.status is ACTIVE


def test_rule4_finish_while_output_idle_emits_nothing_until_all_finished() -> None:
    valve = StatusWatermarkValve([0, 1, 2])
    for channel in (0, 1):
        valve.input_status(channel, IDLE)
    assert valve.input_status(2, IDLE) == [IDLE]
    assert valve.input_status(0, FINISHED) == []
    assert valve.input_status(1, FINISHED) == []
    assert valve.input_status(2, FINISHED) == [W(MAX_WATERMARK), FINISHED]


def test_rule4_add_channel_to_finished_valve_raises() -> None:
    valve = StatusWatermarkValve([0])
    valve.input_status(0, FINISHED)
    with pytest.raises(ValueError, match="FINISHED"):
        valve.add_channel(1)


# -------------------------------------------------------------------- rule 5


@pytest.mark.parametrize("status", [ACTIVE, IDLE])
def test_rule5_same_status_again_changes_nothing(status: WatermarkStatus) -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(0, 10)
    valve.input_watermark(1, 20)
    valve.input_status(0, status)
    before = (valve.watermark, valve.status, valve.channel_status(0))
    assert valve.input_status(0, status) == []
    assert (valve.watermark, valve.status, valve.channel_status(0)) == before


@pytest.mark.parametrize("status", [ACTIVE, IDLE, FINISHED])
def test_rule5_nothing_after_finished(status: WatermarkStatus) -> None:
    valve = StatusWatermarkValve([0, 1])
    valve.input_watermark(1, 20)
    valve.input_status(0, FINISHED)
    assert valve.input_status(0, status) == []
    assert valve.channel_status(0) is FINISHED
    assert valve.input_watermark(0, 5) == []
    assert valve.input_watermark(1, 30) == [W(30)]


# ------------------------------------------------------------- add_channel


def test_add_channel_joins_min_when_output_is_min() -> None:
    valve = StatusWatermarkValve([0])
    assert valve.add_channel(1) == []
    assert valve.input_watermark(0, 10) == []  # channel 1 (MIN) holds the output
    assert valve.input_watermark(1, 5) == [W(5)]


def test_add_channel_below_output_is_unaligned() -> None:
    valve = StatusWatermarkValve([0])
    valve.input_watermark(0, 10)
    assert valve.add_channel(1) == []
    assert valve.input_watermark(0, 20) == [W(20)]  # channel 1 does not hold it back
    assert valve.input_watermark(1, 25) == []  # aligns at 25 >= 20
    assert valve.input_watermark(0, 30) == [W(25)]


def test_add_channel_to_idle_valve_makes_output_active() -> None:
    valve = StatusWatermarkValve([0])
    valve.input_status(0, IDLE)
    assert valve.add_channel(1) == [ACTIVE]
    assert valve.status is ACTIVE


def test_add_existing_channel_raises() -> None:
    valve = StatusWatermarkValve([0])
    with pytest.raises(ValueError, match="already exists"):
        valve.add_channel(0)


# ------------------------------------------------------------ FLINK-38477


def test_flink_38477_finished_and_idle_give_max_over_idle_never_max_watermark() -> None:
    """Some channels FINISHED, the rest IDLE: the output is the max over the IDLE ones."""
    valve = StatusWatermarkValve([0, 1, 2, 3])
    for channel, ts in [(0, 100), (1, 200), (2, 150), (3, 120)]:
        valve.input_watermark(channel, ts)
    assert valve.watermark == 100
    assert valve.input_status(1, FINISHED) == []  # 200 was not the output
    assert valve.input_status(0, FINISHED) == [W(120)]
    assert valve.input_status(3, IDLE) == [W(150)]
    assert valve.input_status(2, IDLE) == [IDLE]  # 150 = max over IDLE {150, 120}
    assert (valve.watermark, valve.status) == (150, IDLE)
    # an IDLE channel resumes: ACTIVE again, still no MAX_WATERMARK
    assert valve.input_status(3, ACTIVE) == [ACTIVE]
    assert valve.input_watermark(3, 140) == []  # below 150: unaligned
    assert valve.input_watermark(3, 160) == [W(160)]
    assert valve.input_status(3, FINISHED) == [IDLE]  # 2 is IDLE at 150 < 160
    assert valve.watermark == 160
    assert valve.input_status(2, FINISHED) == [W(MAX_WATERMARK), FINISHED]


# --------------------------------------------------------------- snapshot


def test_snapshot_restore_continues_identically() -> None:
    inputs: list[tuple[str, int, object]] = [
        ("w", 0, 10),
        ("w", 1, 30),
        ("w", 2, 20),
        ("s", 0, IDLE),
        ("s", 2, FINISHED),
    ]
    tail: list[tuple[str, int, object]] = [
        ("w", 1, 40),
        ("s", 0, ACTIVE),
        ("w", 0, 35),
        ("s", 1, IDLE),
        ("w", 0, 50),
        ("s", 0, IDLE),
        ("s", 0, FINISHED),
        ("s", 1, FINISHED),
    ]
    original = StatusWatermarkValve([0, 1, 2])
    for kind, channel, value in inputs:
        _apply(original, kind, channel, value)
    restored = StatusWatermarkValve.restore(original.snapshot())
    assert restored.snapshot() == original.snapshot()
    for kind, channel, value in tail:
        assert _apply(restored, kind, channel, value) == _apply(original, kind, channel, value)


def _apply(valve: StatusWatermarkValve, kind: str, channel: int, value: object) -> object:
    if kind == "w":
        assert isinstance(value, int)
        return valve.input_watermark(channel, value)
    assert isinstance(value, WatermarkStatus)
    return valve.input_status(channel, value)
