"""The planner's pure steps (source/driver/plan.py, progress_collector.py), without a broker."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from slackwater.markers import MarkerStatus
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.source.driver.batch_ends import rate_limit
from spark_consumer.source.driver.plan import (
    PlanMemory,
    idle_clock_inputs,
    nothing_new_since,
    records_between,
    same_batch,
)
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.progress_collector import partition_batches
from spark_consumer.source.wire.offset import SourceOffset, ranges
from spark_consumer.source.wire.progress import Progress


def _start(data: dict[str, dict[str, int]], control: dict[str, int] | None = None) -> SourceOffset:
    """An offset with no range left to account for (the batch read ``data`` whole)."""
    aligner = MarkerAligner(None, 0, [f"{t}:{p}" for t in data for p in data[t]])
    return SourceOffset(
        data=data,
        data_from=data,
        control=control or {},
        progress={},
        watermark=7,
        late_threshold=0,
        status="ACTIVE",
        aligner=aligner.snapshot(),
    )


def _now(latest: dict[tuple[str, int], int], control: dict[str, int] | None = None) -> PlanAnswers:
    counts: dict[str, int] = {}
    for topic, partition in latest:
        counts[topic] = max(counts.get(topic, 0), partition + 1)
    return PlanAnswers(counts, frozenset(counts), latest, control or {})


def test_ranges_are_the_non_empty_ones_in_topic_and_partition_order() -> None:
    begin = {"b": {"0": 5}, "a": {"10": 0, "2": 3}}
    end = {"b": {"0": 5}, "a": {"10": 4, "2": 7}, "c": {"0": 9}}
    # c has no begin: it starts where it ends (a partition just seen reads nothing yet).
    assert ranges(begin, end) == [("a", 2, 3, 7), ("a", 10, 0, 4)]


def test_rate_limit_shares_in_proportion_and_never_takes_nothing() -> None:
    begin = {"t": {"0": 0, "1": 0, "2": 0}}
    end = {"t": {"0": 90, "1": 9, "2": 1}}
    assert rate_limit(begin, end, 100) == end  # everything fits
    assert rate_limit(begin, end, 10) == {"t": {"0": 9, "1": 1, "2": 1}}


@given(
    st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 50), st.integers(0, 50))),
    st.integers(1, 200),
)
def test_rate_limit_stays_inside_every_range(
    spans: dict[int, tuple[int, int]], max_records: int
) -> None:
    begin = {"t": {str(p): min(a, b) for p, (a, b) in spans.items()}}
    end = {"t": {str(p): max(a, b) for p, (a, b) in spans.items()}}
    limited = rate_limit(begin, end, max_records)
    for partition, finish in end["t"].items():
        start = begin["t"][partition]
        assert start <= limited["t"][partition] <= finish
        if finish > start:
            assert limited["t"][partition] > start  # every partition with data moves


def test_nothing_new_since_only_when_the_broker_shows_nothing_to_plan() -> None:
    start = _start({"t": {"0": 5, "1": 3}}, {"0": 2})
    assert nothing_new_since(start, _now({("t", 0): 5, ("t", 1): 3}, {"0": 2}))
    # A record on the data or the control topic.
    assert not nothing_new_since(start, _now({("t", 0): 6, ("t", 1): 3}, {"0": 2}))
    assert not nothing_new_since(start, _now({("t", 0): 5, ("t", 1): 3}, {"0": 3}))
    # Offsets that went back (a re-created topic) are news too.
    assert not nothing_new_since(start, _now({("t", 0): 1, ("t", 1): 3}, {"0": 2}))
    # A partition appeared, or a topic left the metadata.
    assert not nothing_new_since(start, _now({("t", 0): 5, ("t", 1): 3, ("t", 2): 0}))
    assert not nothing_new_since(start, _now({}, {"0": 2}))
    # A partition whose log end is not known now stands still.
    assert nothing_new_since(
        start, PlanAnswers({"t": 2}, frozenset({"t"}), {("t", 0): 5}, {"0": 2})
    )
    # A range of the last batch still to account for.
    assert not nothing_new_since(
        dataclasses.replace(start, data_from={"t": {"0": 4, "1": 3}}),
        _now({("t", 0): 5, ("t", 1): 3}, {"0": 2}),
    )
    # The log ends asked hold the control topic's too (one ListOffsets round for both).
    asked = {("t", 0): 5, ("t", 1): 3, ("ctl", 0): 2}
    assert nothing_new_since(start, PlanAnswers({"t": 2}, frozenset({"t", "ctl"}), asked, {"0": 2}))
    asked = {**asked, ("t", 1): 4}
    assert not nothing_new_since(
        start, PlanAnswers({"t": 2}, frozenset({"t", "ctl"}), asked, {"0": 2})
    )


def test_an_offset_spark_hands_back_again_is_decoded_once() -> None:
    """Spark plans from an offset this planner did not return last for as long as no
    batch runs (after a restart; the first of the two initial offsets it asks for): every
    idle trigger hands it back, and it is read once."""
    memory = PlanMemory()
    logged = json.loads(json.dumps(_start({"t": {"0": 5}}).encode()))
    read = memory.decoded(logged)
    assert memory.decoded(json.loads(json.dumps(logged))) is read
    restored = memory.aligner(read, lambda _: None).snapshot()  # from the offset
    assert restored["partitions"] == read.aligner["partitions"]
    returned = _start({"t": {"0": 6}})
    aligner = MarkerAligner.restore(returned.aligner)
    memory.returned(returned, aligner)  # a plan's: kept with its aligner, as before
    assert memory.decoded(json.loads(json.dumps(returned.encode()))) is returned
    assert memory.aligner(returned, lambda _: None) is aligner
    assert memory.decoded(logged) is not read  # another one read since: read again


def test_progress_gone_reads_as_unknown_the_conservative_way() -> None:
    data = {"t": {"0": 10, "1": 10}}
    ranges = [("t", 0, 4, 10), ("t", 1, 6, 10)]
    seen = Progress(records=6, max_event_time_ms=77, max_offset=9, late=0, unreadable=0)
    batches = partition_batches(data, ranges, {("t", 0): seen})
    assert batches["t:0"] == PartitionBatch(6, 77, 9, 10)
    # No event time (the watermark stays), data up to the range's last offset (an IDLE
    # inside it is contradicted: the partition stays ACTIVE).
    assert batches["t:1"] == PartitionBatch(4, None, 9, 10)


def test_same_batch_only_when_the_plan_changes_nothing() -> None:
    start = _start({"t": {"0": 5}}, {"0": 2})
    same = dataclasses.replace(start, plan_id="another")
    assert same_batch(start, same)
    idle = MarkerAligner.restore(start.aligner)
    idle.partitions["t:0"].status = MarkerStatus.IDLE
    changes: list[dict[str, Any]] = [
        {"data": {"t": {"0": 6}}},
        {"control": {"0": 3}},
        {"watermark": 8},
        {"aligner": idle.snapshot()},
        {"held": [{"topic": "t"}]},
    ]
    for change in changes:
        assert not same_batch(start, dataclasses.replace(same, **change)), change
    # A range of the last batch still to account for is never "the same".
    assert not same_batch(dataclasses.replace(start, data_from={"t": {"0": 4}}), same)


@given(
    st.dictionaries(st.integers(0, 20), st.tuples(st.integers(0, 50), st.integers(0, 50))),
)
def test_records_between_is_what_the_ranges_hold(spans: dict[int, tuple[int, int]]) -> None:
    begin = {"t": {str(p): a for p, (a, _) in spans.items()}}
    end = {"t": {str(p): b for p, (_, b) in spans.items()}, "u": {"0": 3}}
    assert records_between(begin, end) == sum(b - a for _, _, a, b in ranges(begin, end))


def test_idle_clocks_skip_partitions_unseen_or_with_records_past_the_read_position() -> None:
    data = {"a": {"0": 5, "1": 5, "2": 5}, "b": {"0": 0}}
    # a:0 read up; a:1 has records waiting (held back, or not read yet); a:2 went back
    # (a log end below the position is not news of records); b:0 not given this plan.
    now = _now({("a", 0): 5, ("a", 1): 9, ("a", 2): 3})
    assert idle_clock_inputs(data, now) == ({"b:0"}, {"a:1"})
