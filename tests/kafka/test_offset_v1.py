"""Checkpoints written by earlier versions (issue 31, finding 9): every shape of version
1 offset main ever wrote decodes, restores its aligner and restarts the planner; any
other offset is one line that says where it is, its version and what to do.

tests/data holds one offset of each shape. Each offset_v1_<commit>_<what>.json was made
by that commit's own code: its ``MarkerAligner`` driven through the scenario
tests/data/offset_v1.json was made with (topic "orders-v1": p0 read 0-9 at event seconds
0-9, p1 0-4 at 0-4, then IDLE@5 for p1 applied; some add a FINISHED@20 for p0 still
pending, a batch p0 [10, 13), the consumer-side idle clock, a held marker), and its
``_offset`` (spark_consumer/source.py at the commit) writing the offset, through JSON
(the commit's tree from ``git archive``, run with it alone on PYTHONPATH):

    file                              commits that wrote the shape   what it added
    offset_v1_e3eeae9_rows_by_name    e3eeae9, fca3f6e               aligner rows by name
    offset_v1_8404e02_progress_wait   8404e02                        progress_wait_ms
    offset_v1_2dd89a8_rows_by_place   2dd89a8 to 2df1fe6             plan_id, rows by place
    offset_v1_969c088_held            969c088 to ea00748 (and the    held
                                      first offset to 3fcee2d)
    offset_v1_544f4e9_previous_batch  544f4e9 to aadf4ed             previous_threshold/_batch_id
    offset_v1_0d924d2_planned_at      0d924d2                        query, planned_at_ms,
                                                                     partitions_after_finished
    offset_v1                         ac65805 to e5d9066 (26a3770)   latest_event_ms

The expected values below are the scenario's, written out; they are not the decoder's
own output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.source.driver.plan import PlanMemory
from spark_consumer.source.shared.options import SourceError
from spark_consumer.source.wire.offset import OFFSET_VERSION, SourceOffset
from spark_consumer.source.wire.offset_error import OffsetFormatError
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_driver import Driven, options, real

DATA = Path(__file__).parents[1] / "data"
MIN = -(2**63)
TOPIC = "orders-v1"
P0, P1 = f"{TOPIC}:0", f"{TOPIC}:1"
CLOCK_MS = 1_763_999_996_000  # the wall clock the idle clocks were written with
FINISHED_AT_20 = {
    "v": 1,
    "topic": TOPIC,
    "partition": 0,
    "status": "FINISHED",
    "offset": 20,
    "watermark_hint": None,
    "emitted_at": 1_763_999_995_001,
    "emitter_id": "emitter-7f3a",
    "epoch": 1,
    "seq": 1,
}
# A marker for a partition the broker did not list yet, which the planner held aside.
HELD_IDLE_P2 = {
    **FINISHED_AT_20,
    "partition": 2,
    "status": "IDLE",
    "offset": 0,
    "emitted_at": 1_763_999_995_002,
    "seq": 2,
}


@dataclass(frozen=True)
class Shape:
    """What one file holds, as its scenario made it."""

    name: str
    p0_end: int = 10  # the batch: p0 [10, p0_end), p1 [5, 5)
    control: int = 2  # markers on the control topic read
    pending: bool = True  # FINISHED@20 for p0 waits for the read position
    last_data_ms: int | None = None  # the idle clocks (consumerIdleTimeout on)
    has_plan_id: bool = True
    query: str = "5c0d2f6b1a9e4e3f8d7c6b5a49382716"
    progress_wait_ms: int = 9
    held: list[dict[str, Any]] = field(default_factory=list)
    previous: tuple[int | None, int | None] = (BASE_MS + 2_000, 3)
    late_threshold: int = BASE_MS + 3_000
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "records": 15,
            "records_late": 0,
            "records_unreadable": 0,
            "markers_read": 1,
        }
    )
    # partitions_after_finished, which 0d924d2 added to the aligner's counters.
    counts_after_finished: bool = False


NO_QUERY, NO_PREVIOUS = "", (None, None)  # not written before 0d924d2, 544f4e9
SHAPES = [
    Shape(
        "offset_v1_e3eeae9_rows_by_name",
        last_data_ms=CLOCK_MS,
        has_plan_id=False,
        query=NO_QUERY,
        progress_wait_ms=0,
        previous=NO_PREVIOUS,
    ),
    Shape(
        "offset_v1_8404e02_progress_wait",
        p0_end=13,
        control=1,
        pending=False,
        has_plan_id=False,
        query=NO_QUERY,
        previous=NO_PREVIOUS,
    ),
    Shape(
        "offset_v1_2dd89a8_rows_by_place",
        last_data_ms=CLOCK_MS,
        query=NO_QUERY,
        previous=NO_PREVIOUS,
    ),
    Shape(
        "offset_v1_969c088_held",
        p0_end=13,
        held=[HELD_IDLE_P2],
        query=NO_QUERY,
        previous=NO_PREVIOUS,
    ),
    Shape("offset_v1_544f4e9_previous_batch", query=NO_QUERY),
    Shape(
        "offset_v1_0d924d2_planned_at",
        p0_end=13,
        control=1,
        pending=False,
        counts_after_finished=True,
    ),
    # Made by driving 26a3770's reader on Kafka (tests/kafka/test_offset.py).
    Shape(
        "offset_v1",
        control=1,
        pending=False,
        query="997a5adae5d243e0b139f500be9a7097",
        previous=(MIN, None),
        late_threshold=MIN,
        counters={
            "records": 15,
            "records_late": 0,
            "records_unreadable": 0,
            "records_dropped": 0,
            "records_lost": 0,
            "markers_read": 1,
        },
        counts_after_finished=True,
    ),
]


def _raw(shape: Shape) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads((DATA / f"{shape.name}.json").read_text())
    return parsed


def _through_spark(offset: SourceOffset) -> SourceOffset:
    """What Spark does to an offset: logs its JSON and hands it back parsed."""
    return SourceOffset.decode(json.loads(json.dumps(offset.encode())))


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_shape_of_version_1_decodes_to_what_it_holds(shape: Shape) -> None:
    raw = _raw(shape)
    offset = SourceOffset.decode(raw)
    assert offset.version == 1
    assert offset.data == {TOPIC: {"0": shape.p0_end, "1": 5}}
    assert offset.data_from == {TOPIC: {"0": 10, "1": 5}}
    assert offset.ranges() == ([(TOPIC, 0, 10, shape.p0_end)] if shape.p0_end > 10 else [])
    assert (offset.control, offset.progress) == ({"0": shape.control}, {"0": 2})
    # p0's newest event is 9 s, p1's 4 s (IDLE, out of the minimum): 9 s - 1 s.
    assert (offset.watermark, offset.late_threshold) == (BASE_MS + 8_000, shape.late_threshold)
    assert (offset.previous_threshold, offset.previous_batch_id) == shape.previous
    assert offset.status == "ACTIVE"
    assert offset.plan_id == (raw["plan_id"] if shape.has_plan_id else "")
    assert len(offset.plan_id) == (32 if shape.has_plan_id else 0)
    assert offset.query == shape.query
    assert offset.counters == shape.counters
    assert offset.progress_wait_ms == shape.progress_wait_ms
    assert offset.held == shape.held
    assert offset.tasks is None  # version 1: one task per range
    assert offset.statuses() == {P0: "ACTIVE", P1: "IDLE"}
    assert offset.channel_watermarks() == {P0: BASE_MS + 8_000, P1: BASE_MS + 3_000}
    # [channel, status, read_position, max_record_offset, newest_event_ms, epoch,
    #  idle_offset, last_data_ms, pending markers]
    assert offset.aligner["partitions"] == [
        [
            P0,
            "ACTIVE",
            10,
            9,
            BASE_MS + 9_000,
            1 if shape.pending else -1,
            None,
            shape.last_data_ms,
            [FINISHED_AT_20] if shape.pending else [],
        ],
        [P1, "IDLE", 5, 4, BASE_MS + 4_000, 1, 5, shape.last_data_ms, []],
    ]
    valve = offset.aligner["valve"]
    assert (valve["output_watermark"], valve["output_status"]) == (BASE_MS + 8_000, "ACTIVE")
    assert valve["channels"] == [
        [P0, BASE_MS + 8_000, "ACTIVE", True],
        [P1, BASE_MS + 3_000, "IDLE", False],
    ]
    aligner_counters = offset.aligner["counters"]
    assert aligner_counters["markers_applied"] == 1
    assert ("partitions_after_finished" in aligner_counters) == shape.counts_after_finished
    assert offset.aligner["consumer_idle_timeout_ms"] == (60_000 if shape.last_data_ms else None)


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_shape_of_version_1_is_the_same_written_as_version_2(shape: Shape) -> None:
    old = SourceOffset.decode(_raw(shape))
    new = _through_spark(old)
    assert new.version == OFFSET_VERSION
    for part in (
        "data",
        "data_from",
        "control",
        "progress",
        "watermark",
        "late_threshold",
        "status",
        "plan_id",
        "query",
        "latest_event_ms",
        "previous_threshold",
        "previous_batch_id",
        "counters",
        "progress_wait_ms",
        "held",
        "tasks",
    ):
        assert getattr(new, part) == getattr(old, part), part
    assert new.aligner["partitions"] == old.aligner["partitions"]
    assert new.aligner["valve"] == old.aligner["valve"]
    assert new.aligner["counters"] == old.aligner["counters"]
    assert new.same_state(old)
    assert _through_spark(new).encode() == new.encode()


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_every_shape_of_version_1_restores_the_aligner_a_restart_plans_on(shape: Shape) -> None:
    """What the planner does with the offset a restart hands it (PlanMemory)."""
    memory = PlanMemory()
    offset = memory.decoded(_raw(shape))
    aligner = memory.aligner(offset, lambda marker: f"{marker.topic}:{marker.partition}")
    assert aligner.status_of(P0) is MarkerStatus.ACTIVE
    assert aligner.status_of(P1) is MarkerStatus.IDLE
    assert aligner.pending_count == (1 if shape.pending else 0)
    assert aligner.valve.watermark == BASE_MS + 8_000
    assert aligner.counters.markers_applied == 1
    assert aligner.counters.partitions_after_finished == 0  # also where it was not written
    assert aligner.snapshot()["partitions"] == offset.aligner["partitions"]


def test_the_planning_clock_0d924d2_logged_bounds_event_times_by_the_option() -> None:
    """0d924d2's readers judged event times by the logged clock plus maxEventTimeAhead
    as the query ran; a replay of that batch judges them the same."""
    raw = _raw(SHAPES[5])
    planned_at = raw["planned_at_ms"]
    assert planned_at > BASE_MS
    hour = 3_600_000
    assert PlanMemory(hour).decoded(raw).latest_event_ms == planned_at + hour
    assert SourceOffset.decode(raw, max_event_time_ahead_ms=60_000).latest_event_ms == (
        planned_at + 60_000
    )
    assert PlanMemory(None).decoded(raw).latest_event_ms is None  # maxEventTimeAhead off
    # An offset that logged the bound itself keeps it, whatever the option is now.
    logged = _raw(SHAPES[6])
    assert PlanMemory(60_000).decoded(logged).latest_event_ms == logged["latest_event_ms"]


# ------------------------------------------------------------ offsets it cannot read


def _version_1(**changes: Any) -> dict[str, Any]:
    raw = _raw(SHAPES[6])
    raw.update(changes)
    return raw


def _aligner(**changes: Any) -> dict[str, Any]:
    raw = _version_1()
    raw["aligner"] = {**raw["aligner"], **changes}
    return raw


ROW = [P0, "ACTIVE", 10, 9, BASE_MS + 9_000, -1, None, None, []]
UNREADABLE: list[tuple[str, Any, str, str]] = [
    # (case, offset, its version as the line names it, what the line says is wrong)
    (
        "a later version",
        {"v": 3, "topics": {}},
        "unknown offset version 3",
        "reads versions 1 and 2",
    ),
    (
        "a version as text",
        {**_version_1(), "v": "1"},
        "unknown offset version '1'",
        "reads versions",
    ),
    ("a version as a bool", {**_version_1(), "v": True}, "unknown offset version True", "reads"),
    ("no version", {"watermark": 1}, "unknown offset version None", "reads versions 1 and 2"),
    ("not an object", ["v", 1], "unknown offset version None", "not a JSON object"),
    ("fields missing", {"v": 1, "data": {}}, "offset version 1", "(KeyError: 'from')"),
    ("positions as text", _version_1(data={TOPIC: {"0": "ten"}}), "offset version 1", "ValueError"),
    # Rows of 8 values (no last_data_ms): a shape main never wrote.
    ("rows of 8 values", _aligner(partitions=[ROW[:8]]), "offset version 1", "has 8 values, not 9"),
    ("a row of 10", _aligner(partitions=[[*ROW, 0]]), "offset version 1", "has 10 values, not 9"),
    ("an empty row", _aligner(partitions=[[]]), "offset version 1", "has 0 values, not 9"),
    (
        "an unknown status",
        _aligner(partitions=[[P0, "PAUSED", *ROW[2:]]]),
        "offset version 1",
        "KeyError: 'PAUSED'",
    ),
    (
        "a row by name without a field",
        _aligner(partitions=[[P0, {"status": "ACTIVE"}]]),
        "offset version 1",
        "KeyError: 'read_position'",
    ),
    (
        "a channel without a partition",
        _aligner(partitions=[["orders", *ROW[1:]]]),
        "offset version 1",
        "ValueError",
    ),
    (
        "columns that do not fit",
        {
            **SourceOffset.decode(_version_1()).encode(),
            "topics": {TOPIC: {"end": [1], "status": "AA"}},
        },
        "offset version 2",
        "differ in length",
    ),
]


@pytest.mark.parametrize(
    ("raw", "version", "why"),
    [case[1:] for case in UNREADABLE],
    ids=[case[0] for case in UNREADABLE],
)
def test_an_offset_it_cannot_read_is_one_line_naming_where_its_version_and_what_to_do(
    raw: Any, version: str, why: str
) -> None:
    with pytest.raises(OffsetFormatError) as decoding:
        SourceOffset.decode(raw)
    # What Spark shows: the planner's SourceError, never Python's own ValueError.
    with pytest.raises(SourceError) as planning:
        PlanMemory().decoded(raw)
    line = str(planning.value)
    assert line == str(decoding.value)
    _assert_one_clear_line(line, version, why)
    newer = version == "unknown offset version 3"
    assert ("run the newer release that wrote it, or start" in line) == newer


def test_an_offset_whose_aligner_does_not_restore_is_one_line_too() -> None:
    """Decoding checks the offset's form; a pending marker is checked when the aligner
    is restored from it, and fails the same way."""
    raw = _aligner(partitions=[[*ROW[:8], [{"offset": 20}]]])
    memory = PlanMemory()
    offset = memory.decoded(raw)
    with pytest.raises(SourceError) as restoring:
        memory.aligner(offset, lambda marker: None)
    _assert_one_clear_line(str(restoring.value), "offset version 1", "ValidationError")


def _assert_one_clear_line(line: str, version: str, why: str) -> None:
    assert "\n" not in line and len(line) < 800, line
    assert line.startswith(f"{version} in the checkpoint's offset log"), line
    assert "(the newest file in offsets/ under the query's checkpointLocation)" in line
    assert why in line, line
    assert "to go on, " in line
    assert (
        "start the query on a new checkpointLocation with startingOffsets earliest (reads "
        "the topics again) or latest (from their ends)" in line
    )


# ------------------------------------------------------------ a restart on Kafka


def test_a_query_restarts_on_the_oldest_shape_and_applies_its_pending_marker(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The offset e3eeae9 wrote (rows by name, no plan id, no query): before issue 31 the
    planner's first plan on it raised "not enough values to unpack" into Spark."""
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    progress = new_topic(partitions=1, prefix="progress")
    write = Writer(broker.bootstrap_servers, topic, control)
    # The records, markers and progress records (the old readers', position 2) the offset
    # was written after, under this test's names.
    write.data(0, *range(10))
    write.data(1, *range(5))
    write.marker(1, MarkerStatus.IDLE)
    write.marker(0, MarkerStatus.FINISHED, offset=20)
    for partition, end in ((0, 10), (1, 5)):
        key = f"{topic}:{partition}:0-{end}:{MIN}:timestamp"
        write.producer.produce(progress, key=key.encode(), value=b"{}")
    assert write.producer.flush(10) == 0
    logged = json.loads((DATA / f"{SHAPES[0].name}.json").read_text().replace(TOPIC, topic))
    assert logged["v"] == 1 and "plan_id" not in logged and logged["progress"] == {"0": 2}
    given = options(broker.bootstrap_servers, topic, control, progressTopic=progress)
    restarted = Driven.restart(given, logged)
    try:
        write.data(0, *range(10, 20))
        rows = restarted.step()
        # Nothing read again: the batch starts where the old offset left each partition.
        assert [(r["partition"], r["offset"]) for r in real(rows)] == [
            (0, o) for o in range(10, 20)
        ]
        assert restarted.offset["v"] == OFFSET_VERSION
        restarted.step()  # the batch's progress applied: p0 read up to 20
        # FINISHED@20, pending in the old offset, applies at the read position 20; p0's
        # newest event time (19 s) counted first.
        assert restarted.statuses() == {f"{topic}:0": "FINISHED", f"{topic}:1": "IDLE"}
        assert restarted.offset["watermark"] == BASE_MS + 18_000
        assert restarted.offset["aligner"]["counters"]["markers_applied"] == 2
    finally:
        restarted.stop()


def test_every_file_in_tests_data_is_one_of_the_shapes() -> None:
    """A new shape of offset gets its file and its row in SHAPES."""
    files = {p.stem for p in DATA.glob("offset_v1*.json")}
    assert files == {s.name for s in SHAPES}
