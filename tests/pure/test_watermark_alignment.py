"""Watermark alignment (source/driver/watermark_alignment.py, batch_ends.py): one test per
rule of its docstring, named after the rule, each asserting the exact holds; then the
rules' properties over drawn states, checked against a model written from the rules'
text (docs/source.md, "Watermark alignment")."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from slackwater.markers import Marker, MarkerStatus
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.source.driver.batch_ends import batch_ends
from spark_consumer.source.driver.watermark_alignment import Alignment, align
from spark_consumer.source.metrics import source_registry
from spark_consumer.source.wire.offset import SourceOffset

MINUTE_MS = 60_000
DRIFT_MS = 10 * MINUTE_MS


def state(
    event_minutes: dict[int, int | None],
    statuses: dict[int, MarkerStatus] | None = None,
    out_of_orderness_ms: int = 0,
) -> MarkerAligner:
    """Partitions "t:p" read up to offset 10, the newest event at the given minute (None:
    no readable event time yet), in the given statuses (ACTIVE by default)."""
    aligner = MarkerAligner(
        None,
        out_of_orderness_ms,
        [f"t:{p}" for p in event_minutes],
        channel_of=lambda marker: f"{marker.topic}:{marker.partition}",
    )
    aligner.advance(
        {
            f"t:{p}": PartitionBatch(
                records=10,
                max_event_time_ms=None if minute is None else minute * MINUTE_MS,
                max_offset=9,
                read_position=10,
            )
            for p, minute in event_minutes.items()
        }
    )
    for p, status in (statuses or {}).items():
        if status is MarkerStatus.FINISHED:
            aligner.finish(f"t:{p}")
        elif status is MarkerStatus.IDLE:
            aligner.offer(
                Marker(
                    topic="t",
                    partition=p,
                    status=MarkerStatus.IDLE,
                    offset=10,
                    emitted_at=0,
                    emitter_id="e",
                    epoch=1,
                    seq=p,
                )
            )
            aligner.advance({})
    assert all(aligner.status_of(f"t:{p}") is s for p, s in (statuses or {}).items())
    return aligner


def positions(*partitions: int, at: int = 10) -> dict[str, dict[str, int]]:
    return {"t": {str(p): at for p in partitions}}


def backlog(**ends: int) -> dict[str, dict[str, int]]:
    """Ends past the read position 10: backlog(p0=20, p1=10) (p1 cannot move)."""
    return {"t": {name[1:]: end for name, end in ends.items()}}


def held(*partitions: int) -> frozenset[tuple[str, str]]:
    return frozenset(("t", str(p)) for p in partitions)


# ---------------------------------------------------------------- one test per rule


def test_a_partition_more_than_the_drift_ahead_of_the_slowest_active_one_is_held() -> None:
    aligner = state({0: 0, 1: 5, 2: 11, 3: 30})
    alignment = align(aligner, positions(0, 1, 2, 3), backlog(p0=20, p1=20, p2=20, p3=20), DRIFT_MS)
    assert alignment == Alignment(held(2, 3), furthest_ahead_ms=30 * MINUTE_MS)


def test_a_partition_exactly_the_drift_ahead_is_read() -> None:
    aligner = state({0: 0, 1: 10})
    assert align(aligner, positions(0, 1), backlog(p0=20, p1=20), DRIFT_MS).held == held()


def test_the_watermark_is_the_newest_event_time_less_the_max_out_of_orderness() -> None:
    # Equal leads either way: what counts is the gap between watermarks.
    aligner = state({0: 0, 1: 11}, out_of_orderness_ms=5 * MINUTE_MS)
    alignment = align(aligner, positions(0, 1), backlog(p0=20, p1=20), DRIFT_MS)
    assert alignment == Alignment(held(1), furthest_ahead_ms=11 * MINUTE_MS)


def test_a_partition_at_its_end_is_never_held_but_holds_others_back() -> None:
    # p0 cannot move (its end is its read position) yet is the slowest ACTIVE one.
    aligner = state({0: 0, 1: 30, 2: 1})
    alignment = align(aligner, positions(0, 1, 2), backlog(p0=10, p1=20, p2=20), DRIFT_MS)
    assert alignment == Alignment(held(1), furthest_ahead_ms=30 * MINUTE_MS)


def test_idle_and_finished_partitions_hold_no_one_back() -> None:
    statuses = {0: MarkerStatus.IDLE, 1: MarkerStatus.FINISHED}
    aligner = state({0: 0, 1: 0, 2: 20, 3: 25}, statuses)
    alignment = align(aligner, positions(0, 1, 2, 3), backlog(p2=20, p3=20), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=5 * MINUTE_MS)


def test_an_idle_or_finished_partition_with_records_is_never_held() -> None:
    # Held, an IDLE one would stay IDLE, and the valve would run past its records.
    aligner = state({0: 0, 1: 30, 2: 40}, {1: MarkerStatus.IDLE, 2: MarkerStatus.FINISHED})
    alignment = align(aligner, positions(0, 1, 2), backlog(p0=20, p1=20, p2=20), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=0)


def test_a_partition_active_again_behind_the_output_is_neither_held_nor_the_reference() -> None:
    # p0 went IDLE, the output passed it (30), and data made it ACTIVE again at 5: the
    # valve does not wait for it until it catches up, so neither does alignment.
    aligner = state({0: 0, 1: 30, 2: 60}, {0: MarkerStatus.IDLE})
    aligner.advance({"t:0": PartitionBatch(5, 5 * MINUTE_MS, 14, 15)})
    assert aligner.status_of("t:0") is MarkerStatus.ACTIVE
    assert not aligner.valve.waits_for("t:0") and aligner.valve.watermark == 30 * MINUTE_MS
    begin = {"t": {"0": 15, "1": 10, "2": 10}}
    alignment = align(aligner, begin, backlog(p0=20, p1=20, p2=20), DRIFT_MS)
    assert alignment == Alignment(held(2), furthest_ahead_ms=30 * MINUTE_MS)


def test_a_partition_of_unknown_event_time_is_read_and_holds_no_one_back() -> None:
    aligner = state({0: None, 1: 0, 2: 5})
    alignment = align(aligner, positions(0, 1, 2), backlog(p0=20, p1=20, p2=20), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=5 * MINUTE_MS)
    # Reading it cannot move the reference: the held one is read as the furthest
    # behind (a partition whose records never carry an event time would starve it).
    aligner = state({0: None, 1: 0, 2: 30})
    alignment = align(aligner, positions(0, 1, 2), backlog(p0=20, p1=10, p2=20), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=30 * MINUTE_MS)


def test_no_reference_no_holds() -> None:
    aligner = state({0: None, 1: 40}, {1: MarkerStatus.IDLE})
    alignment = align(aligner, positions(0, 1), backlog(p0=20, p1=20), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=None)
    # Nothing ACTIVE of known event time can move: nothing to hold, no lead to show.
    aligner = state({0: 0, 1: 40})
    alignment = align(aligner, positions(0, 1), backlog(p0=10, p1=10), DRIFT_MS)
    assert alignment == Alignment(held(), furthest_ahead_ms=None)


def test_never_a_stall_the_furthest_behind_that_can_move_is_read_with_those_near_it() -> None:
    # p0 (the reference) is at its end; p1..p3 all ahead by more than the drift.
    aligner = state({0: 0, 1: 40, 2: 45, 3: 60})
    alignment = align(aligner, positions(0, 1, 2, 3), backlog(p0=10, p1=20, p2=20, p3=20), DRIFT_MS)
    assert alignment == Alignment(held(3), furthest_ahead_ms=60 * MINUTE_MS)


def test_the_held_partitions_end_at_their_read_position_and_the_budget_goes_to_the_rest() -> None:
    aligner = state({0: 0, 1: 0, 2: 30})
    begin = positions(0, 1, 2)
    latest = {("t", 0): 110, ("t", 1): 110, ("t", 2): 110}
    ends, alignment = batch_ends(aligner, begin, latest, ReadMaxRows(100), DRIFT_MS)
    assert alignment is not None and alignment.held == held(2)
    assert ends == {"t": {"0": 60, "1": 60, "2": 10}}
    # Without alignment the limit is shared by all three.
    ends, alignment = batch_ends(aligner, begin, latest, ReadMaxRows(99), None)
    assert alignment is None
    assert ends == {"t": {"0": 43, "1": 43, "2": 43}}


def test_alignment_off_reads_to_the_log_ends() -> None:
    aligner = state({0: 0, 1: 300})
    ends, alignment = batch_ends(
        aligner, positions(0, 1), {("t", 0): 50, ("t", 1): 70}, ReadAllAvailable()
    )
    assert (ends, alignment) == ({"t": {"0": 50, "1": 70}}, None)


def test_the_summary_the_offset_keeps() -> None:
    assert Alignment(held(1, 2), 7).summary() == {"held": 2, "furthest_ahead_ms": 7}


# ---------------------------------------------------------------- the rules as properties

STATUSES = st.sampled_from([MarkerStatus.ACTIVE] * 3 + [MarkerStatus.IDLE, MarkerStatus.FINISHED])


@st.composite
def plans(draw: st.DrawFn) -> tuple[dict[int, int | None], dict[int, MarkerStatus], dict[int, int]]:
    count = draw(st.integers(1, 8))
    minutes = {p: draw(st.none() | st.integers(0, 120)) for p in range(count)}
    statuses = {p: draw(STATUSES) for p in range(count)}
    ends = {p: draw(st.sampled_from([10, 11, 50])) for p in range(count)}
    return minutes, statuses, ends


def model_holds(
    minutes: dict[int, int | None], statuses: dict[int, MarkerStatus], ends: dict[int, int]
) -> set[int]:
    """docs/source.md's rules, read one by one (drift in minutes: 10)."""
    known = {p: m for p, m in minutes.items() if m is not None}
    # Rule 2: the reference, over ACTIVE partitions of known watermark.
    active = {p: m for p, m in known.items() if statuses[p] is MarkerStatus.ACTIVE}
    if not active:
        return set()
    reference = min(active.values())
    # Rule 3: only ACTIVE partitions of known watermark that can move are ever held.
    candidates = {p: m for p, m in active.items() if ends[p] > 10}
    held = {p for p, m in candidates.items() if m > reference + 10}
    # Rule 5: every candidate held -> the furthest behind of them is the reference.
    if candidates and held == set(candidates):
        behind = min(candidates.values())
        held = {p for p, m in candidates.items() if m > behind + 10}
    return held


@given(plans())
def test_the_holds_are_the_rules_holds_and_the_batch_never_stalls(
    plan: tuple[dict[int, int | None], dict[int, MarkerStatus], dict[int, int]],
) -> None:
    minutes, statuses, ends = plan
    aligner = state(minutes, statuses)
    begin = positions(*minutes)
    latest = {("t", p): end for p, end in ends.items()}
    planned, alignment = batch_ends(aligner, begin, latest, ReadMaxRows(25), DRIFT_MS)
    assert alignment is not None
    assert {int(p) for _, p in alignment.held} == model_holds(minutes, statuses, ends)
    # Never a stall: a partition that can move is read in every batch that has one.
    if any(end > 10 for end in ends.values()):
        assert any(planned["t"][str(p)] > 10 for p in minutes)
    # A held partition plans nothing; none plans past its log end.
    for p, end in ends.items():
        assert 10 <= planned["t"][str(p)] <= end
        if ("t", str(p)) in alignment.held:
            assert planned["t"][str(p)] == 10


# ---------------------------------------------------------------- the offset and the metrics


def _offset(alignment: dict[str, object]) -> SourceOffset:
    aligner = state({0: 0, 1: 30})
    return SourceOffset(
        data=positions(0, 1),
        data_from=positions(0, 1),
        control={},
        progress={},
        watermark=0,
        late_threshold=0,
        status="ACTIVE",
        aligner=aligner.snapshot(),
        alignment=alignment,
    )


def test_the_offset_keeps_the_holds_and_leaves_them_out_with_the_option_off() -> None:
    summary = Alignment(held(1), 30 * MINUTE_MS).summary()
    encoded = _offset(summary).encode()
    assert encoded["alignment"] == {"held": 1, "furthest_ahead_ms": 30 * MINUTE_MS}
    assert SourceOffset.decode(json.loads(json.dumps(encoded))).alignment == summary
    off = _offset({}).encode()
    assert "alignment" not in off
    assert SourceOffset.decode(off).alignment == {}


def _scrape(offset: SourceOffset) -> dict[str, float]:
    """The source's series for one query whose last progress planned ``offset`` (the
    shape Spark's StreamingQuery.lastProgress has)."""
    end = json.dumps(offset.encode())
    query = SimpleNamespace(
        name="q",
        isActive=True,
        exception=lambda: None,
        lastProgress={"sources": [{"endOffset": end}]},
    )
    registry = source_registry(lambda: [query])  # type: ignore[list-item]
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("slackwater_source_alignment")
    }


def test_the_metrics_say_how_many_are_held_and_how_far_ahead_the_furthest_is() -> None:
    labels = str([("query", "q")])
    assert _scrape(_offset(Alignment(held(1), 30 * MINUTE_MS).summary())) == {
        "slackwater_source_alignment_partitions_held" + labels: 1.0,
        "slackwater_source_alignment_furthest_ahead_ms" + labels: 30.0 * MINUTE_MS,
    }
    assert _scrape(_offset({})) == {}  # the option off: no series


# ---------------------------------------------------------------- a backfill, batch by batch


@st.composite
def backfills(draw: st.DrawFn) -> dict[str, object]:
    """Partitions whose records are in event-time order, some IDLE at the end of a first
    backlog, then records for some that are ahead of everything read before (records
    that came after a quiet spell: none may be late)."""
    count = draw(st.integers(2, 4))
    first = {
        p: sorted(draw(st.lists(st.integers(0, 600), min_size=1, max_size=25)))
        for p in range(count)
    }
    after = max(max(times) for times in first.values())
    later = {
        p: sorted(draw(st.lists(st.integers(after, after + 600), max_size=25)))
        for p in range(count)
    }
    return {
        "first": first,
        "idle": draw(st.sets(st.sampled_from(range(count)))),
        "later": later,
        "drift_minutes": draw(st.integers(0, 30)),
        "limit": draw(st.integers(1, 20)),
        "idle_timeout_minutes": draw(st.none() | st.integers(1, 5)),
    }


def _run(
    aligner: MarkerAligner,
    records: dict[int, list[int]],
    position: dict[int, int],
    run: dict[str, object],
    clock: list[int],
) -> tuple[int, int]:
    """Plans and reads batches as the planner does until every record is read: each
    plan takes the last batch's progress, then plans (its watermark is the next batch's
    late threshold). Returns (records of partitions held before, read below their
    batch's threshold; batches)."""
    late = batches = 0
    held_before: set[str] = set()
    threshold = aligner.valve.watermark
    last: dict[str, PartitionBatch] = {}
    while True:
        clock[0] += MINUTE_MS
        begin = {"t": {str(p): position[p] for p in records}}
        latest = {("t", p): len(times) for p, times in records.items()}
        waiting = {f"t:{p}" for p in records if position[p] < len(records[p])}
        aligner.advance(last, clock[0], (), waiting)
        drift = int(run["drift_minutes"]) * MINUTE_MS  # type: ignore[call-overload]
        ends, alignment = batch_ends(aligner, begin, latest, ReadMaxRows(run["limit"]), drift)  # type: ignore[arg-type]
        planned = aligner.valve.watermark
        last = {}
        for p, times in records.items():
            end = ends["t"][str(p)]
            read = times[position[p] : end]
            if read and str(p) in held_before:
                late += sum(1 for minute in read if minute * MINUTE_MS < threshold)
            if read:
                last[f"t:{p}"] = PartitionBatch(len(read), max(read) * MINUTE_MS, end - 1, end)
            position[p] = end
        assert alignment is not None
        held_before |= {partition for _, partition in alignment.held}
        if not last:
            return late, batches
        batches += 1
        threshold = planned
        assert batches <= sum(len(t) for t in records.values()) + 1, "no progress"


@given(backfills())
def test_a_held_partitions_records_are_never_late_and_every_record_is_read_once(
    run: dict[str, object],
) -> None:
    first: dict[int, list[int]] = run["first"]  # type: ignore[assignment]
    later: dict[int, list[int]] = run["later"]  # type: ignore[assignment]
    timeout = run["idle_timeout_minutes"]
    aligner = MarkerAligner(
        None,
        0,
        [f"t:{p}" for p in first],
        consumer_idle_timeout_ms=None if timeout is None else int(timeout) * MINUTE_MS,  # type: ignore[call-overload]
        channel_of=lambda marker: f"{marker.topic}:{marker.partition}",
    )
    records = {p: list(times) for p, times in first.items()}
    position = dict.fromkeys(first, 0)
    clock = [0]
    late, _ = _run(aligner, records, position, run, clock)
    # Held, a partition is ACTIVE: the valve waits for it, and its records (in event-time
    # order) are never below the watermark when they are read.
    assert late == 0
    for seq, p in enumerate(sorted(run["idle"])):  # type: ignore[call-overload]
        marker = Marker(
            topic="t",
            partition=p,
            status=MarkerStatus.IDLE,
            offset=len(records[p]),
            emitted_at=0,
            emitter_id="e",
            epoch=1,
            seq=seq,
        )
        aligner.offer(marker)
    aligner.advance({})
    for p, times in later.items():
        records[p] += times
    late, _ = _run(aligner, records, position, run, clock)
    # Whichever partitions were IDLE meanwhile (never held: the valve would not wait for
    # their records), and however long a held one waited (not silence: idle timeout).
    assert late == 0
    assert position == {p: len(times) for p, times in records.items()}
