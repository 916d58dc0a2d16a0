"""Where a run ends (run_ends.py), without a broker: one test per rule of its docstring
and of docs/source.md, "Scheduled and bounded runs"."""

from __future__ import annotations

import pytest

from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.broker import BrokerView
from spark_consumer.source.offset import SourceOffset
from spark_consumer.source.options import SourceError, SourceOptions
from spark_consumer.source.plan import Plan
from spark_consumer.source.run_ends import Ends, RunEnds
from spark_consumer.valve import MAX_WATERMARK, WatermarkStatus

Key = tuple[str, int]


def _view(
    latest: dict[Key, int],
    counts: dict[str, int] | None = None,
    control: dict[str, int] | None = None,
) -> BrokerView:
    if counts is None:
        counts = {}
        for topic, partition in latest:
            counts[topic] = max(counts.get(topic, 0), partition + 1)
    return BrokerView(counts, frozenset(counts), dict(latest), dict(control or {}))


def _options(**more: str) -> SourceOptions:
    return SourceOptions.parse({"kafka.bootstrap.servers": "localhost:1", "subscribe": "t", **more})


def _start(**planned: object) -> SourceOffset:
    aligner = MarkerAligner(None, 0, channel_of=lambda m: None)
    return SourceOffset(
        data={},
        data_from={},
        control={},
        progress={},
        watermark=0,
        late_threshold=0,
        status="ACTIVE",
        aligner=aligner.snapshot(),
        planned_with=dict(planned),
    )


def test_a_run_sees_no_log_end_past_the_one_its_first_plan_saw() -> None:
    ends = Ends(counts={"t": 2})
    first = ends.bound(_view({("t", 0): 5, ("t", 1): 3}), {}, set())
    assert first.latest == {("t", 0): 5, ("t", 1): 3}
    later = ends.bound(_view({("t", 0): 9, ("t", 1): 7}), {}, set())
    assert later.latest == {("t", 0): 5, ("t", 1): 3}


def test_a_lower_log_end_is_seen_as_it_is() -> None:
    """Kafka's evidence judges it (gone_back.py): the ceiling never raises an answer."""
    ends = Ends(counts={"t": 1})
    ends.bound(_view({("t", 0): 5}), {}, set())
    assert ends.bound(_view({("t", 0): 2}), {}, set()).latest == {("t", 0): 2}


def test_a_partition_without_a_log_end_at_the_start_gets_its_end_when_first_seen() -> None:
    ends = Ends(counts={"t": 2})
    first = ends.bound(_view({("t", 0): 5}, counts={"t": 2}), {}, set())
    assert first.latest == {("t", 0): 5}
    assert first.counts == {"t": 2}
    second = ends.bound(_view({("t", 0): 6, ("t", 1): 4}), {}, set())
    assert second.latest == {("t", 0): 5, ("t", 1): 4}
    assert ends.bound(_view({("t", 0): 6, ("t", 1): 8}), {}, set()).latest[("t", 1)] == 4


def test_partitions_and_topics_that_appear_after_the_start_wait_for_the_next_run() -> None:
    ends = Ends(counts={"t": 1})
    seen = ends.bound(_view({("t", 0): 5, ("t", 1): 2, ("u", 0): 7}), {}, set())
    assert seen.counts == {"t": 1}
    assert seen.latest == {("t", 0): 5}


def test_a_topic_the_query_reads_is_taken_when_first_listed_never_vanished() -> None:
    ends = Ends(counts={"t": 1})
    seen = ends.bound(_view({("t", 0): 5, ("r", 0): 3}), {}, {"r"})
    assert seen.counts == {"t": 1, "r": 1}
    assert seen.latest == {("t", 0): 5, ("r", 0): 3}


def test_markers_written_after_the_start_wait_for_the_next_run() -> None:
    ends = Ends(counts={})
    assert ends.bound(_view({}, control={"0": 4}), {}, set()).control_ends == {"0": 4}
    assert ends.bound(_view({}, control={"0": 9, "1": 2}), {}, set()).control_ends == {
        "0": 4,
        "1": 2,
    }


def test_an_offset_given_ends_there_minus_one_and_past_the_log_end_end_at_the_log_end() -> None:
    ends = Ends(counts={"t": 4})
    given = {("t", 0): 3, ("t", 1): -1, ("t", 2): 50}
    seen = ends.bound(_view({("t", 0): 10, ("t", 1): 10, ("t", 2): 10, ("t", 3): 10}), given, set())
    assert seen.latest == {("t", 0): 3, ("t", 1): 10, ("t", 2): 10, ("t", 3): 10}


def test_the_ends_kept_in_the_offset_read_back_the_same() -> None:
    ends = Ends(counts={"t": 2}, data={("t", 0): 5, ("t", 1): 3}, control={"0": 4})
    assert Ends.decode(ends.encode()) == ends
    with pytest.raises(SourceError, match="bounded run ends \\(endingOffsets\\) are unreadable"):
        Ends.decode({"counts": {"t": "x"}})


def test_without_available_now_a_run_sees_everything_and_a_bounded_one_is_refused() -> None:
    view = _view({("t", 0): 5})
    assert RunEnds(_options()).bound(view, _start()) is view
    with pytest.raises(SourceError, match=r"trigger\(availableNow=True\)"):
        RunEnds(_options(endingOffsets="latest")).bound(view, _start())


def test_each_run_takes_its_own_ends_but_a_bounded_one_the_kept_ones() -> None:
    run = RunEnds(_options())
    run.prepare()
    assert run.bound(_view({("t", 0): 5}), _start()).latest == {("t", 0): 5}
    run.prepare()  # the next run
    assert run.bound(_view({("t", 0): 9}), _start()).latest == {("t", 0): 9}
    assert run.kept() == {}  # an unbounded run keeps nothing
    bounded = RunEnds(_options(endingOffsets="latest"))
    bounded.prepare()
    kept = {"ends": {"counts": {"t": 1}, "data": {"t": {"0": 5}}, "control": {}}}
    assert bounded.bound(_view({("t", 0): 9}), _start(**kept)).latest == {("t", 0): 5}
    assert bounded.kept() == kept


def test_a_bounded_run_finishes_each_partition_read_to_its_end() -> None:
    run = RunEnds(_options(endingOffsets="latest"))
    run.prepare()
    run.bound(_view({("t", 0): 5, ("t", 1): 3}), _start())
    aligner = MarkerAligner(None, 0, ["t:0", "t:1"], channel_of=lambda m: None)
    plan = Plan(data={"t": {"0": 5, "1": 2}}, control={}, progress={}, aligner=aligner)
    run.finish_ended(plan)
    assert aligner.valve.status is WatermarkStatus.ACTIVE  # t:1 is not read to 3 yet
    assert plan.counters == {"partitions_ended": 1}
    plan.data["t"]["1"] = 3
    run.finish_ended(plan)
    run.finish_ended(plan)  # once each
    assert (aligner.valve.status, aligner.valve.watermark) == (
        WatermarkStatus.FINISHED,
        MAX_WATERMARK,
    )
    assert plan.counters == {"partitions_ended": 2}
