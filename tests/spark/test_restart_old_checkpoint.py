"""A checkpoint written by an earlier version, restarted on today's source with each
option that matters unchanged or changed (issue 41, finding 3 and item 5; docs/source.md,
"Options on restart"; docs/decisions.md, "Issue 41, item 5").

The checkpoint is real: the code of commit 1aaa609 wrote it, before offsets kept the
options their batch was planned with (``planned_with``), on a query reading
``sw1aaa609-orders`` with ``eventTimeField=ts``, ``maxOutOfOrderness=1s`` and
``controlTopic=sw1aaa609-control`` (tests/data/checkpoint_1aaa609/README.md). Its last
batch read both partitions in two tasks, and no batch followed it: a restart's first
plan waits for that batch's progress, which the old readers wrote to
``sw1aaa609-control.progress`` under keys that spell the field they read by ("ts").

The broker is the session's, a fresh one: the module's fixture makes the checkpoint's
topics again under their names and writes their records (``topics.json``) in their
order, so that every record has the offset the checkpoint names (its data, control and
progress positions). Topic ids differ from those of the broker that ran the old query,
but that checkpoint records none (offsets kept topic ids and leader epochs only from
issue 31 on: its offsets have no ``kafka`` key, checked below), so there is nothing to
tell a re-created topic by, and ``failOnDataLoss`` keeps its default (true): a topic
shorter than the checkpoint's positions would still be refused as gone. The progress
topic is made with no time retention, as the broker's data topics are
(``TEST_BROKER_SETTINGS``), and its records with today's timestamps.

Each case copies the checkpoint into its own directory and restarts it; the topics are
shared (made once), so a case reads what the cases before it wrote as well. The planner
runs in Spark's Python process for the source, whose stderr the JVM copies to its
``System.err``: a case points that at a file while its query starts, and finds the
planner's warning there.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from slackwater import kafka_clients
from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus, encode
from spark_consumer.source import read_stream
from spark_consumer.source.wire.offset import SourceOffset
from tests.harness.factories import ROOT, marker, wait_until
from tests.harness.kafka_writer import BASE_MS

OLD = ROOT / "tests" / "data" / "checkpoint_1aaa609"
DATA, CONTROL = "sw1aaa609-orders", "sw1aaa609-control"
PROGRESS = f"{CONTROL}.progress"
# Topics the cases change to: another control topic (and its progress topic), another
# progress topic, a second data topic.
MOVED_CONTROL, OTHER_PROGRESS, MORE = (
    "sw1aaa609-moved",
    "sw1aaa609-other.progress",
    "sw1aaa609-more",
)
# The old query's options (README.md); the progress timeout is the 15 s.
GIVEN = {
    "subscribe": DATA,
    "controlTopic": CONTROL,
    "eventTimeField": "ts",
    "maxOutOfOrderness": "1s",
    "startingOffsets": "earliest",
    "progressTimeoutMs": "15000",
}


def _topics() -> dict[str, list[dict[str, Any]]]:
    dumped: dict[str, list[dict[str, Any]]] = json.loads((OLD / "topics.json").read_text())
    return dumped


@pytest.fixture(scope="module")
def old_topics(broker: KafkaBroker, admin: AdminClient) -> str:
    """The checkpoint's topics with their records at their offsets, and the topics the
    cases change to; the broker's address."""
    dumped = _topics()
    compact = {"cleanup.policy": "compact"}
    kept = {"cleanup.policy": "delete", "retention.ms": "-1"}
    made = [
        NewTopic(DATA, 2, 1),
        NewTopic(CONTROL, 1, 1, config=compact),
        NewTopic(PROGRESS, 1, 1, config=kept),
        NewTopic(MOVED_CONTROL, 1, 1, config=compact),
        NewTopic(MORE, 1, 1),
    ]
    for future in admin.create_topics(made).values():
        future.result(30)
    for new in made:
        led = functools.partial(
            kafka_clients.all_partitions_led, admin, new.topic, new.num_partitions
        )
        wait_until(led, 30, f"{new.topic}'s leaders")
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for topic, records in dumped.items():
        for record in records:
            stamp = {"timestamp": record["timestamp"]} if topic == DATA else {}
            key = None if record["key"] is None else record["key"].encode()
            producer.produce(
                topic,
                key=key,
                value=record["value"].encode(),
                partition=record["partition"],
                **stamp,
            )
            assert producer.flush(10) == 0  # one at a time: the offsets as they were
    value = json.dumps({"n": 1, "ts": BASE_MS, "at": BASE_MS}).encode()
    producer.produce(MORE, value=value, partition=0, timestamp=BASE_MS)
    for seq in range(2):  # the moved control topic's markers (ACTIVE: they change nothing)
        producer.produce(MOVED_CONTROL, key=f"{DATA}:0", value=_active(seq), partition=0)
    assert producer.flush(10) == 0
    return broker.bootstrap_servers


def _active(seq: int) -> bytes:
    return encode(marker(0, MarkerStatus.ACTIVE, 0, topic=DATA, seq=seq, emitter_id="moved"))[1]


def test_the_checkpoint_records_no_options_and_no_topic_ids() -> None:
    """What this file restarts: offsets of version 2 without ``planned_with`` or
    ``kafka``, the last one's batch reading both partitions in two tasks."""
    last = (OLD / "checkpoint" / "offsets" / "5").read_text().splitlines()[-1]
    offset = json.loads(last)
    assert offset["v"] == 2 and offset["tasks"] == 2
    assert "planned_with" not in offset and "kafka" not in offset
    decoded = SourceOffset.decode(offset)
    assert len(decoded.ranges()) == 2
    assert (OLD / "checkpoint" / "commits" / "5").exists()


def _restart(
    spark: SparkSession, bootstrap: str, tmp_path: Path, changed: dict[str, str]
) -> StreamingQuery:
    """The old query on a copy of the checkpoint, with ``changed`` options (under
    ``endingOffsets``, a run under availableNow, as the option asks)."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(OLD / "checkpoint", checkpoint)
    frame = read_stream(spark, bootstrap_servers=bootstrap, options={**GIVEN, **changed})
    rows = frame.select("topic", "partition", "offset", "event_time", "late")
    writer = rows.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
    if "endingOffsets" in changed:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="200 milliseconds").start()


def _write_new(bootstrap: str) -> dict[str, int]:
    """One record more on each data partition; the data topic's log ends after it."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    value = json.dumps({"n": 99, "ts": BASE_MS + 9_000, "at": BASE_MS + 39_000}).encode()
    for partition in (0, 1):
        producer.produce(DATA, value=value, partition=partition, timestamp=BASE_MS + 9_000)
    assert producer.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sw1aaa609-ends"})
    try:
        return {
            str(p): consumer.get_watermark_offsets(TopicPartition(DATA, p), 10)[1] for p in (0, 1)
        }
    finally:
        consumer.close()


def _source_error(failure: object) -> str:
    """The one line of the SourceError a query stopped with (its whole text if none)."""
    text = str(failure)
    lines = [line for line in text.splitlines() if "SourceError: " in line]
    return lines[-1].split("SourceError: ", 1)[1] if lines else text[-3000:]


def _offset(query: StreamingQuery) -> SourceOffset | None:
    """The source's offset of the query's last batch (None before its first)."""
    failure = query.exception()
    assert failure is None, _source_error(failure)
    progress = query.lastProgress
    if not progress:
        return None
    end = progress["sources"][0]["endOffset"]
    return SourceOffset.decode(json.loads(end) if isinstance(end, str) else end)


def _read_to(query: StreamingQuery, topic: str, ends: dict[str, int]) -> SourceOffset:
    """The offset of the query's batch that has read ``topic`` to ``ends`` (it goes on)."""

    def reached() -> SourceOffset | None:
        offset = _offset(query)
        return offset if offset is not None and offset.data.get(topic) == ends else None

    found: SourceOffset = wait_until(reached, 60, f"the query to read {topic} to {ends}")
    return found


def _refusal(query: StreamingQuery) -> str:
    """The one line of the SourceError the query stopped with."""
    with pytest.raises(StreamingQueryException) as stopped:
        query.awaitTermination(60)  # raises what the query stopped with
    return _source_error(stopped.value)


def _option_lines(path: Path) -> list[str]:
    """The planner's lines about options (docs/source.md, "Options on restart")."""
    return [line for line in path.read_text().splitlines() if line.startswith("option '")]


# ---------------------------------------------------------------------- the cases

FROM_CONTROL = (
    f"option 'progressTopic' is '{MOVED_CONTROL}.progress' (from controlTopic), the "
    f"checkpoint's '{PROGRESS}': a restart cannot move it, as the last batch's progress is "
    f"there; set progressTopic to '{PROGRESS}' to keep it, or start the query on a new "
    "checkpointLocation"
)
OTHER = FROM_CONTROL.replace(
    f"'{MOVED_CONTROL}.progress' (from controlTopic)", f"'{OTHER_PROGRESS}'"
)
FIELD = (
    "option 'eventTimeField' is 'at', the checkpoint's 'ts': the batch planned before the "
    "restart is read by 'ts' (should Spark run it again), every batch planned from now on by "
    "'at'; a watermark never goes back, so records whose event time by 'at' is below it are "
    "late"
)
BOUND = (
    "option 'maxOutOfOrderness' is 5000 ms, the checkpoint's 1000 ms: applied from this "
    "restart on to every event time read; a watermark never goes back, so a partition's "
    "stays where it is until its newest event time less 5000 ms passes it"
)
CONTROL_MOVED = (
    f"option 'controlTopic' is '{MOVED_CONTROL}', the checkpoint's '{CONTROL}': applied from "
    f"this restart on: '{MOVED_CONTROL}' is read from its start, its emitter's epochs taken "
    "as they come"
)
SUBSCRIBE_WHAT = (
    "applied from this restart on: the partitions of topics it adds join from their earliest "
    "offsets; a topic it drops is no longer read and counts as FINISHED with "
    "failOnDataLoss=false, and stops the query otherwise"
)
ADDED = f"option 'subscribe' is '{DATA},{MORE}', the checkpoint's '{DATA}': {SUBSCRIBE_WHAT}"
DROPPED = f"option 'subscribe' is '{MORE}', the checkpoint's '{DATA}': {SUBSCRIBE_WHAT}"
NO_LONGER = (
    f"option 'subscribe' no longer takes topic(s) {DATA}, which this checkpoint reads: their "
    "records not read yet would be missed; subscribe to them again, or set "
    "failOnDataLoss=false to drop them (not read any more, their partitions FINISHED)"
)
ENDS = (
    "option 'endingOffsets' is 'latest', the checkpoint's none: applied: this run reads to "
    "those ends, every partition FINISHED there"
)

# (options changed, the lines logged, the refusal or None: the query goes on).
CASES = {
    "unchanged": ({}, [], None),
    "eventTimeField": ({"eventTimeField": "at"}, [FIELD], None),
    "maxOutOfOrderness": ({"maxOutOfOrderness": "5s"}, [BOUND], None),
    "controlTopic": ({"controlTopic": MOVED_CONTROL}, [], FROM_CONTROL),
    "controlTopic, progressTopic kept": (
        {"controlTopic": MOVED_CONTROL, "progressTopic": PROGRESS},
        [CONTROL_MOVED],
        None,
    ),
    "progressTopic": ({"progressTopic": OTHER_PROGRESS}, [], OTHER),
    "subscribe, a topic added": ({"subscribe": f"{DATA},{MORE}"}, [ADDED], None),
    "subscribe, a topic dropped": ({"subscribe": MORE}, [DROPPED], NO_LONGER),
    "endingOffsets": ({"endingOffsets": "latest"}, [ENDS], None),
}


@pytest.mark.parametrize("case", CASES)
def test_a_restart_applies_or_refuses_each_option_in_one_line(
    case: str, spark: SparkSession, old_topics: str, tmp_path: Path, jvm_stderr: Path
) -> None:
    """Before issue 41's item 5 the eventTimeField case failed at every restart with
    ``no progress after 15s from 2 reader task(s)`` (the wait was for keys spelling
    'at', which no reader wrote); the controlTopic and progressTopic cases went on,
    looking for the last batch's progress on a topic its readers never wrote to; the
    moved control topic was read from the old one's position (one marker of two); the
    added topic and endingOffsets said nothing."""
    changed, lines, refused = CASES[case]
    ends = _write_new(old_topics)
    query = _restart(spark, old_topics, tmp_path, changed)
    try:
        if refused is not None:
            assert _refusal(query) == refused
        elif "endingOffsets" in changed:
            assert query.awaitTermination(60), "the bounded run did not end"
            assert _offset(query) is not None
            assert _offset(query).data[DATA] == ends  # type: ignore[union-attr]
        else:
            offset = _read_to(query, DATA, ends)
            if MORE in changed.get("subscribe", ""):
                _read_to(query, MORE, {"0": 1})
            if "controlTopic" in changed:  # read from its start: both markers
                assert offset.counters["markers_read"] == 1 + 2
    finally:
        query.stop()
    assert _option_lines(jvm_stderr) == lines
