"""A restart on an offset written before offsets kept ``planned_with`` (issue 41, item 5;
docs/source.md, "Options on restart"), without a broker: ``restart_options.compare``
given what ``find_old_readers`` would find on Kafka, and how the old readers' records are
told. The offset is the last one commit 1aaa609 wrote (tests/data/checkpoint_1aaa609),
its readers' records those that commit's readers wrote (``topics.json`` there)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from spark_consumer.source.driver import restart_options
from spark_consumer.source.driver.restart_options import (
    Changes,
    OldReaders,
    _field_in,
    _OldKeys,
    _Seen,
    compare,
)
from spark_consumer.source.shared.options import SourceError, SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.source.wire.splits import batch_tasks

OLD = Path(__file__).parents[1] / "data" / "checkpoint_1aaa609"
DATA, CONTROL, PROGRESS = "sw1aaa609-orders", "sw1aaa609-control", "sw1aaa609-control.progress"
FOUND = OldReaders(PROGRESS, "ts", CONTROL)  # what its readers left, as they left it
GIVEN = {
    "kafka.bootstrap.servers": "localhost:1",
    "subscribe": DATA,
    "controlTopic": CONTROL,
    "eventTimeField": "ts",
    "maxOutOfOrderness": "1s",
}


def _offset() -> SourceOffset:
    last = (OLD / "checkpoint" / "offsets" / "5").read_text().splitlines()[-1]
    return SourceOffset.decode(json.loads(last))


def _progress_records() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads((OLD / "topics.json").read_text())[PROGRESS]
    return records


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The planner's lines about options (``logged.messages``)."""
    caplog.set_level(logging.INFO, logger=restart_options.log.name)
    return caplog


def _compare(found: OldReaders, **changed: str) -> tuple[SourceOffset, Changes]:
    offset = _offset()
    options = SourceOptions.parse({**GIVEN, **changed})
    return offset, compare(offset, options, find=lambda o, s: found)


def test_unchanged_nothing_is_said_and_the_offset_takes_what_its_readers_wrote(
    logged: pytest.LogCaptureFixture,
) -> None:
    offset, changes = _compare(FOUND)
    assert changes == Changes()
    assert logged.messages == []
    assert offset.planned_with["eventTimeField"] == "ts"
    assert offset.planned_with["progressTopic"] == PROGRESS
    assert offset.planned_with["controlTopic"] == CONTROL
    assert offset.planned_with["endingOffsets"] is None


def test_a_changed_field_waits_for_the_keys_the_old_readers_wrote(
    logged: pytest.LogCaptureFixture,
) -> None:
    """Before: the wait was for keys spelling 'at' (``no progress after ...``)."""
    offset, changes = _compare(FOUND, eventTimeField="at")
    assert changes == Changes()
    assert logged.messages == [
        "option 'eventTimeField' is 'at', the checkpoint's 'ts': the batch planned before the "
        "restart is read by 'ts' (should Spark run it again), every batch planned from now on "
        "by 'at'; a watermark never goes back, so records whose event time by 'at' is below "
        "it are late"
    ]
    options = SourceOptions.parse({**GIVEN, "eventTimeField": "at"})
    tasks, _ = batch_tasks(options, offset)  # as the progress collector waits for them
    written = {r["key"] for r in _progress_records()}
    assert {task.event_time for task in tasks} == {"ts"}
    assert {task.progress_key() for task in tasks} <= written


@pytest.mark.parametrize(
    ("spelt", "now", "planned", "said"),
    [
        ("timestamp", "", None, None),  # the Kafka timestamp, as now
        ("timestamp", "timestamp", "timestamp", None),  # a field of that name: the same keys
        ("timestamp", "ts", None, "is 'ts', the checkpoint's the Kafka timestamp"),
        ("ts", "", "ts", "is the Kafka timestamp, the checkpoint's 'ts'"),
    ],
)
def test_the_field_a_key_spells_is_the_option_it_stands_for(
    spelt: str, now: str, planned: str | None, said: str | None, logged: pytest.LogCaptureFixture
) -> None:
    offset, _ = _compare(OldReaders(PROGRESS, spelt, CONTROL), eventTimeField=now)
    assert offset.planned_with["eventTimeField"] == planned
    assert [line.split(":")[0] for line in logged.messages] == (
        [f"option 'eventTimeField' {said}"] if said else []
    )


def test_nothing_found_each_option_it_cannot_know_is_said_in_one_line(
    logged: pytest.LogCaptureFixture,
) -> None:
    """No record of its query anywhere (gone, or on a topic not named *.progress): the
    options as they are now, the control positions kept, each said."""
    offset, changes = _compare(OldReaders())
    assert changes == Changes()
    assert offset.planned_with["eventTimeField"] == "ts"
    assert offset.planned_with["controlTopic"] == CONTROL
    assert [line.split(":")[0] for line in logged.messages] == [
        f"option 'progressTopic' is '{PROGRESS}' (from controlTopic)",
        "option 'eventTimeField' is 'ts'",
        f"option 'controlTopic' is '{CONTROL}'",
    ]
    said = logged.messages
    assert all("this checkpoint, written before offsets recorded the options" in x for x in said)
    assert "set progressTopic to it" in said[0]
    assert "restart once with that one, then change it" in said[2]


def test_its_progress_on_another_topic_is_refused_in_one_line_naming_it(
    logged: pytest.LogCaptureFixture,
) -> None:
    """Before: the last batch's progress was read as gone on the new topic."""
    with pytest.raises(SourceError) as refused:
        _compare(FOUND, progressTopic="other.progress")
    assert str(refused.value) == (
        f"option 'progressTopic' is 'other.progress', the checkpoint's '{PROGRESS}': a restart "
        "cannot move it, as the last batch's progress is there; set progressTopic to "
        f"'{PROGRESS}' to keep it, or start the query on a new checkpointLocation"
    )
    with pytest.raises(SourceError, match=r"'moved.progress' \(from controlTopic\)"):
        _compare(FOUND, controlTopic="moved")


def test_another_control_topic_is_read_from_its_start_when_its_progress_names_the_old(
    logged: pytest.LogCaptureFixture,
) -> None:
    """Before: the old topic's positions were taken for the new one's."""
    _, changes = _compare(FOUND, controlTopic="moved", progressTopic=PROGRESS)
    assert changes == Changes(control_topic=True)
    assert logged.messages == [
        f"option 'controlTopic' is 'moved', the checkpoint's '{CONTROL}': applied from this "
        "restart on: 'moved' is read from its start, its emitter's epochs taken as they come"
    ]


def test_no_control_topic_any_more_is_applied_whatever_the_old_one_was(
    logged: pytest.LogCaptureFixture,
) -> None:
    _, changes = _compare(OldReaders(PROGRESS, "ts"), controlTopic="", progressTopic=PROGRESS)
    assert changes == Changes(control_topic=True)
    assert logged.messages == [
        "option 'controlTopic' is none, the checkpoint's a control topic it does not name: "
        "applied from this restart on: no markers are read (the valve works on data alone); "
        "markers of a control topic it does not name already read still apply"
    ]


@pytest.mark.parametrize(
    ("subscription", "said"),
    [
        (
            {"subscribe": f"{DATA},more"},
            f"option 'subscribe' is '{DATA},more', the checkpoint's '{DATA}'",
        ),
        ({"subscribe": "more"}, f"option 'subscribe' is 'more', the checkpoint's '{DATA}'"),
        ({"subscribe": "", "subscribePattern": "sw1aaa609-.*"}, None),
        (
            {"subscribe": "", "subscribePattern": "more.*"},
            f"option 'subscribePattern' is 'more.*', the checkpoint's subscribe '{DATA}'",
        ),
    ],
)
def test_the_subscription_is_compared_with_the_topics_its_positions_name(
    subscription: dict[str, str], said: str | None, logged: pytest.LogCaptureFixture
) -> None:
    """A pattern that takes every topic read is the same subscription (the topics it adds
    join as a pattern's do); a topic dropped is refused later, by failOnDataLoss
    (topic_partitions.drop_unsubscribed)."""
    _compare(FOUND, **subscription)
    assert [line.split(":")[0] for line in logged.messages] == ([said] if said else [])


def test_end_offsets_are_added_to_a_streaming_query(logged: pytest.LogCaptureFixture) -> None:
    """Bounded runs came after ``planned_with``: an old checkpoint is a streaming one."""
    _compare(FOUND, endingOffsets="latest")
    assert logged.messages == [
        "option 'endingOffsets' is 'latest', the checkpoint's none: applied: this run reads to "
        "those ends, every partition FINISHED there"
    ]


def test_the_bound_is_compared_with_the_one_in_its_aligner_state(
    logged: pytest.LogCaptureFixture,
) -> None:
    _, changes = _compare(FOUND, maxOutOfOrderness="5s")
    assert changes == Changes(bound=True)
    assert [line.split(":")[0] for line in logged.messages] == [
        "option 'maxOutOfOrderness' is 5000 ms, the checkpoint's 1000 ms"
    ]


def test_an_offset_that_keeps_what_it_was_planned_with_asks_kafka_nothing() -> None:
    offset = _offset()
    options = SourceOptions.parse(GIVEN)
    offset.planned_with.update(restart_options.planned_with(options))

    def never(o: SourceOffset, s: SourceOptions) -> OldReaders:
        raise AssertionError("asked")

    assert compare(offset, options, find=never) == Changes()


# ------------------------------------------------------------ the old readers' records


def _seen(records: list[dict[str, Any]], **given: str) -> _Seen:
    keys, seen = _OldKeys(_offset(), SourceOptions.parse({**GIVEN, **given})), _Seen()
    for record in records:
        keys.take(record["key"], record["timestamp"], seen)
    return seen


def test_the_last_batchs_keys_tell_the_field_whatever_the_option_is_now() -> None:
    seen = _seen(_progress_records(), eventTimeField="at")
    assert (seen.seen, seen.exact) == (True, "ts")


def test_without_the_last_batchs_keys_its_querys_newest_key_tells_it() -> None:
    """Spark runs the last batch again (its readers had not written): the records its
    planner read before it, below the offset's progress position (7)."""
    seen = _seen([r for r in _progress_records() if r["offset"] < 7], eventTimeField="at")
    assert (seen.seen, seen.exact, seen.newest[1]) == (True, None, "ts")


def test_another_querys_records_tell_nothing() -> None:
    query = _offset().query
    other = [{**r, "key": r["key"].replace(query, "another")} for r in _progress_records()]
    seen = _seen([r for r in other if "synthetic" not in r["key"]])
    assert not seen.seen


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("task:orders:0:5-7+0:1700000004000:ts:3caf0dec16866e28265c7cb5", "ts"),
        ("task:orders:0:0-3+1:-9223372036854775808:a:b:2ff842a5", "a:b"),
        ("orders:1:0-5:-9223372036854775808:timestamp", "timestamp"),  # version 1's
        ("orders:1:0-5", None),
    ],
)
def test_the_field_is_found_in_a_key_of_either_form(key: str, field: str | None) -> None:
    assert _field_in(key) == field
