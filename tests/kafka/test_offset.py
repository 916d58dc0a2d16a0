"""The source's offset format (spark_consumer/source/wire/offset.py): version 2 holds exactly
what version 1 held, in a fraction of the bytes, and version 1 is still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.source.wire.offset import (
    OFFSET_VERSION,
    SourceOffset,
)
from spark_consumer.source.wire.offset_error import OffsetFormatError
from spark_consumer.source.wire.splits import TaskPartition
from spark_consumer.valve import MIN_WATERMARK
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_driver import Driven, options, real

STATUSES = ("ACTIVE", "IDLE", "FINISHED")
big = st.integers(-(2**62), 2**62)
offsets = st.integers(0, 10**12)


@st.composite
def partition_states(draw: st.DrawFn, topic: str, partition: int) -> dict[str, Any]:
    """One partition as an offset may hold it: read or not, with an aligner row or not,
    a valve channel or not, and any values in them."""
    state: dict[str, Any] = {"topic": topic, "partition": partition}
    if draw(st.booleans()):
        end = draw(offsets)
        state["range"] = (draw(st.integers(0, end)), end)
    if draw(st.booleans()):
        state["aligner"] = [
            f"{topic}:{partition}",
            draw(st.sampled_from(STATUSES)),
            draw(offsets),
            draw(st.integers(-1, 10**12)),
            draw(st.none() | big),
            draw(st.integers(-1, 5)),
            draw(st.none() | offsets),
            draw(st.none() | big),
            draw(st.lists(st.fixed_dictionaries({"offset": offsets}), max_size=2)),
        ]
    if draw(st.booleans()):
        state["valve"] = [
            f"{topic}:{partition}",
            draw(st.just(MIN_WATERMARK) | big),
            draw(st.sampled_from(STATUSES)),
            draw(st.booleans()),
        ]
    return state


@st.composite
def version_1_offsets(draw: st.DrawFn) -> dict[str, Any]:
    """An offset as version 1 wrote it, through JSON, rows in any order."""
    topics = draw(
        st.lists(st.from_regex(r"[a-z][a-z0-9._-]{0,8}", fullmatch=True), max_size=3, unique=True)
    )
    states = [
        draw(partition_states(topic, partition))
        for topic in topics
        for partition in draw(st.lists(st.integers(0, 30), max_size=8, unique=True))
    ]
    states = draw(st.permutations(states))
    data: dict[str, dict[str, int]] = {}
    begin: dict[str, dict[str, int]] = {}
    for s in states:
        if "range" in s:
            begin.setdefault(s["topic"], {})[str(s["partition"])] = s["range"][0]
            data.setdefault(s["topic"], {})[str(s["partition"])] = s["range"][1]
    offset = {
        "v": 1,
        "plan_id": "p",
        "query": draw(st.sampled_from(["", "q"])),
        "latest_event_ms": draw(st.none() | big),
        "data": data,
        "from": begin,
        "control": {"0": draw(offsets)},
        "progress": {"0": draw(offsets)},
        "watermark": draw(big),
        "late_threshold": draw(big),
        "previous_threshold": draw(big),
        "previous_batch_id": draw(st.none() | st.integers(0, 10**6)),
        "status": draw(st.sampled_from(STATUSES)),
        "counters": {"records": draw(offsets)},
        "progress_wait_ms": draw(st.integers(0, 10**5)),
        "held": [{"topic": "x"}] if draw(st.booleans()) else [],
        "aligner": {
            "topic": None,
            "max_out_of_orderness_ms": draw(st.integers(0, 10**7)),
            "valve": {
                "output_watermark": draw(big),
                "output_status": draw(st.sampled_from(STATUSES)),
                "channels": [s["valve"] for s in states if "valve" in s],
            },
            "counters": {"markers_applied": draw(offsets), "markers_rejected": {}},
            "consumer_idle_timeout_ms": draw(st.none() | st.integers(1, 10**7)),
            "partitions": [s["aligner"] for s in states if "aligner" in s],
        },
    }
    parsed: dict[str, Any] = json.loads(json.dumps(offset))
    return parsed


def _by_channel(rows: list[list[Any]]) -> list[list[Any]]:
    def key(row: list[Any]) -> tuple[str, int]:
        topic, _, partition = str(row[0]).rpartition(":")
        return topic, int(partition)

    return sorted(rows, key=key)


def _through_spark(offset: SourceOffset) -> SourceOffset:
    """What Spark does to an offset: logs its JSON and hands it back parsed."""
    return SourceOffset.decode(json.loads(json.dumps(offset.encode())))


@settings(max_examples=300)
@given(version_1_offsets())
def test_version_2_holds_everything_version_1_held(raw: dict[str, Any]) -> None:
    old = SourceOffset.decode(raw)
    new = _through_spark(old)
    assert new.version == OFFSET_VERSION
    assert (new.data, new.data_from) == (raw["data"], raw["from"])
    assert new.aligner["partitions"] == _by_channel(raw["aligner"]["partitions"])
    assert new.aligner["valve"]["channels"] == _by_channel(raw["aligner"]["valve"]["channels"])
    for part in ("topic", "max_out_of_orderness_ms", "counters", "consumer_idle_timeout_ms"):
        assert new.aligner[part] == raw["aligner"][part], part
    for part in ("output_watermark", "output_status"):
        assert new.aligner["valve"][part] == raw["aligner"]["valve"][part], part
    for part in ("control", "progress", "watermark", "late_threshold", "previous_threshold"):
        assert new.encode()[part] == raw[part], part
    for part in ("query", "latest_event_ms", "previous_batch_id", "status", "counters", "held"):
        assert new.encode()[part] == raw[part], part
    # Written again, it is the same: the format is canonical (same_state relies on it).
    assert _through_spark(new).encode() == new.encode()
    assert new.same_state(old)


def _steady_offset(partitions: int) -> SourceOffset:
    """A batch as a running query plans it: every partition read up to 1,000,000 or so,
    its newest event time within a second of the others, no marker pending."""
    aligner = MarkerAligner(None, 2_000, channel_of=lambda _: None)
    channels = [f"orders:{p}" for p in range(partitions)]
    aligner.ensure_partitions(channels)
    for step in range(2):
        aligner.advance(
            {
                c: PartitionBatch(
                    10, 1_700_000_000_000 + p * 7 % 1000 + step, 999_990 + p, 10**6 + p
                )
                for p, c in enumerate(channels)
            }
        )
    ends = {"orders": {str(p): 10**6 + p + 10 for p in range(partitions)}}
    begin = {"orders": {str(p): 10**6 + p for p in range(partitions)}}
    return SourceOffset(
        data=ends,
        data_from=begin,
        control={"0": 12},
        progress={"0": 3_456},
        watermark=aligner.valve.watermark,
        late_threshold=aligner.valve.watermark - 1_000,
        status=aligner.valve.status.value,
        aligner=aligner.snapshot(),
        previous_threshold=MIN_WATERMARK,
    )


def test_a_running_query_writes_at_most_twice_what_sparks_kafka_source_writes() -> None:
    """Spark's own Kafka source logs {"topic": {"partition": offset}}: the end offsets
    alone. Ours also carries the batch's start and the valve and aligner state."""
    partitions = 1_000
    offset = _steady_offset(partitions)
    ours = len(json.dumps(offset.encode(), separators=(",", ":")))
    sparks = len(json.dumps(offset.data, separators=(",", ":")))
    assert ours <= 2 * sparks, (ours / partitions, sparks / partitions)
    # Version 1 wrote the same state in over ten times the bytes.
    version_1 = {k: v for k, v in offset.encode().items() if k != "topics"} | {
        "v": 1,
        "data": offset.data,
        "from": offset.data_from,
        "aligner": offset.aligner,
    }
    assert len(json.dumps(version_1, separators=(",", ":"))) > 10 * sparks


def test_an_unknown_version_is_one_clear_error() -> None:
    with pytest.raises(OffsetFormatError, match="unknown offset version 7 in the checkpoint"):
        SourceOffset.decode({"v": 7})
    with pytest.raises(OffsetFormatError, match="unknown offset version None"):
        SourceOffset.decode({"watermark": 1})


def test_columns_of_different_lengths_are_not_an_offset() -> None:
    raw = _steady_offset(3).encode()
    raw["topics"]["orders"]["status"] = "AA"
    with pytest.raises(OffsetFormatError, match="differ in length"):
        SourceOffset.decode(raw)


# ------------------------------------------------------------ a checkpoint of version 1

# The offset the source at commit 26a3770 (offset version 1) returned, as Spark logged it:
# topic "orders-v1" (2 partitions), p0 read up to 10 (event seconds 0-9), p1 up to 5
# (0-4) and then IDLE@5 applied; control position 1. Made by driving that commit's
# reader (tests/harness/source_driver.py) on Apache Kafka: write p0 0-9 and p1 0-4, step, write
# IDLE for p1, step, step; the offset after the last step.
VERSION_1_OFFSET = Path(__file__).parents[1] / "data" / "offset_v1.json"


# The first two offsets the source at commit 26a3770 returned, for the topic
# "orders-v1": the initial one, and batch 1 planned over p0 [0, 10) and p1 [0, 5) (made
# as above: write the records, start, plan once). A query stopped after logging batch 1
# and before committing it replays the batch on the new release.
VERSION_1_BATCH = Path(__file__).parents[1] / "data" / "offsets_v1_batch.json"


def test_a_batch_version_1_planned_is_replayed_and_its_progress_found(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The replay reads the batch one range per task and writes each range's progress as
    version 1's readers did: the next plan, from that version 1 offset, finds it all."""
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    write.data(0, *range(10))
    write.data(1, *range(5))
    logged = json.loads(VERSION_1_BATCH.read_text().replace("orders-v1", topic))
    given = options(broker.bootstrap_servers, topic, control)
    replay = Driven.restart(given, logged["start"])
    try:
        tasks = replay.reader.partitions(replay.offset, logged["end"])
        assert [t.ranges for t in tasks if isinstance(t, TaskPartition)] == [
            ((topic, 0, 0, 10),),
            ((topic, 1, 0, 5),),
        ]
        assert len(tasks) == 2  # no synthetic row: the valve had no watermark yet
        rows = replay.run(logged["end"])
        assert sorted((r["partition"], r["offset"]) for r in real(rows)) == [
            (p, o) for p, n in ((0, 10), (1, 5)) for o in range(n)
        ]
        replay.step()  # the plan after the replayed batch, from its version 1 offset
        assert replay.counter("progress_lost") == 0
        assert replay.counter("records") == 15
        # p1's newest is 4 s: its watermark (4 s - 1 s) is the minimum.
        assert replay.offset["watermark"] == BASE_MS + 3_000
        assert replay.offset["v"] == OFFSET_VERSION
    finally:
        replay.stop()


def test_a_query_restarts_on_an_offset_version_1_wrote(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    # The same records as when the offset was written, under this test's topic names.
    write.data(0, *range(10))
    write.data(1, *range(5))
    write.marker(1, MarkerStatus.IDLE)
    logged = json.loads(VERSION_1_OFFSET.read_text().replace("orders-v1", topic))
    assert logged["v"] == 1
    restarted = Driven.restart(options(broker.bootstrap_servers, topic, control), logged)
    try:
        write.data(0, *range(10, 20))
        rows = restarted.step()
        # Nothing read again: the batch starts where version 1's offset left each partition.
        assert [(r["partition"], r["offset"]) for r in real(rows)] == [
            (0, o) for o in range(10, 20)
        ]
        assert restarted.offset["v"] == OFFSET_VERSION
        assert restarted.statuses() == {f"{topic}:0": "ACTIVE", f"{topic}:1": "IDLE"}
        restarted.step()  # the batch's progress applied: p1 is IDLE, out of the minimum
        assert restarted.offset["watermark"] == BASE_MS + 18_000
        # IDLE@5's offset came through: data at 5 makes p1 ACTIVE again (below the
        # output, it is not aligned: the watermark never goes back).
        write.data(1, 12)
        restarted.step()
        restarted.step()
        assert restarted.statuses()[f"{topic}:1"] == "ACTIVE"
        assert restarted.offset["watermark"] == BASE_MS + 18_000
        counters = restarted.offset["aligner"]["counters"]
        assert (counters["markers_applied"], counters["data_reactivations"]) == (1, 1)
    finally:
        restarted.stop()
