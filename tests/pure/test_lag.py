"""Lag in offsets and seconds (kafka-lag-exporter's interpolation), and ownership."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.lag import LogEndTimeline, LogEndTimelines, lag_offsets, ownership


def timeline(*points: tuple[int, int]) -> LogEndTimeline:
    line = LogEndTimeline()
    for wall_ms, offset in points:
        line.record(wall_ms, offset)
    return line


def test_lag_offsets() -> None:
    assert lag_offsets(130, 100) == 30
    assert lag_offsets(130, 130) == 0
    assert lag_offsets(130, 140) == 0
    assert lag_offsets(130, None) is None


@pytest.mark.parametrize("sentinel", [-1, -2, -1001])
def test_a_committed_offset_kafka_did_not_give_has_no_lag(sentinel: int) -> None:
    """kafka_evidence rule 5 (known_offset): -1 (nothing committed), -1001 (librdkafka's
    "invalid") are no offsets: no lag, rather than the whole log end."""
    assert lag_offsets(130, sentinel) is None
    assert lag_offsets(130, 0) == 130


def test_lag_judges_a_committed_offset_by_rule_5_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from slackwater import kafka_evidence

    monkeypatch.setattr(kafka_evidence, "known_offset", lambda offset: offset != 100)
    assert lag_offsets(130, 100) is None
    assert lag_offsets(130, -5) == 135


def test_caught_up_group_has_zero_seconds() -> None:
    assert timeline((0, 100), (1_000, 130)).lag_seconds(130, 5_000) == 0.0


def test_interpolates_between_the_points_around_the_committed_offset() -> None:
    line = timeline((0, 70), (10_000, 100), (20_000, 100), (30_000, 130))
    # 115 lies halfway from 100 (last seen at 20 s) to 130 (30 s): passed at 25 s.
    assert line.lag_seconds(115, 40_000) == pytest.approx(15.0)
    # 85 lies halfway from 70 (0 s) to 100 (10 s): passed at 5 s.
    assert line.lag_seconds(85, 40_000) == pytest.approx(35.0)


def test_flat_runs_keep_only_first_and_last_point() -> None:
    line = timeline((0, 100), (1_000, 100), (2_000, 100), (3_000, 100), (4_000, 110))
    assert line.wall_ms == [0, 3_000, 4_000]
    assert line.offsets == [100, 100, 110]


def test_offset_older_than_the_timeline_gives_a_lower_bound() -> None:
    assert timeline((5_000, 100), (6_000, 200)).lag_seconds(10, 16_000) == pytest.approx(11.0)


def test_empty_timeline_has_no_estimate() -> None:
    assert LogEndTimeline().lag_seconds(0, 1_000) is None


def test_log_going_backwards_starts_a_new_timeline() -> None:
    line = timeline((0, 500), (1_000, 600), (2_000, 3))
    assert line.offsets == [3]


def test_timeline_is_bounded() -> None:
    line = LogEndTimeline(max_points=4)
    for i in range(10):
        line.record(i * 1_000, i)
    assert line.offsets == [6, 7, 8, 9]


def test_ownership_finds_unowned_partitions_and_members_without_partitions() -> None:
    watched = [("t", 0), ("t", 1), ("t", 2)]
    result = ownership(watched, {"m1": [("t", 0)], "m2": [("other", 0)], "m3": []})
    assert result.partitions_without_owner == {("t", 1), ("t", 2)}
    assert result.members_without_partitions == {"m2", "m3"}
    assert result.owners == {("t", 0): "m1"}


def test_ownership_of_a_group_without_members() -> None:
    result = ownership([("t", 0)], {})
    assert result.partitions_without_owner == {("t", 0)}
    assert result.members_without_partitions == set()


# Polls of three partitions: per poll, each partition read with some growth, or not read.
polls = st.lists(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=3, max_size=3))


@settings(max_examples=300, deadline=None)
@given(polls, st.integers(0, 40))
def test_timelines_written_on_change_answer_as_if_written_every_poll(
    walk: list[list[int | None]], committed: int
) -> None:
    """The module docstring's rule: every read point is recorded (flat runs keeping their
    first and last point). Recording only moved log ends must give the same lag."""
    lazy, every_poll = LogEndTimelines(), {p: LogEndTimeline() for p in range(3)}
    log_end = [0, 0, 0]
    for poll, growths in enumerate(walk):
        wall_ms = 1_000 * (poll + 1)
        read = {}
        for p, growth in enumerate(growths):
            if growth is not None:
                log_end[p] += growth
                read[("t", p)] = log_end[p]
                every_poll[p].record(wall_ms, log_end[p])
        lazy.record_poll(read, wall_ms)
        now_ms = wall_ms + 500
        for p in range(3):
            expected = every_poll[p].lag_seconds(committed, now_ms)
            assert lazy.lag_seconds(("t", p), committed, now_ms) == expected
