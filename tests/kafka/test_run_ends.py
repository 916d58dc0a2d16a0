"""Where a bounded run ends (spark_consumer/source/driver/run_ends.py) on Apache Kafka:
``endingOffsets`` judged against the partitions Kafka lists, and the same ends spelt
otherwise at a restart (issue 41, finding 4). The rules without a broker are in
tests/pure/test_run_ends.py.

The stream reader is driven as Spark drives a run under ``trigger(availableNow=True)``,
in this process: ``prepareForTriggerAvailableNow``, then its plans.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SourceError
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.shared.options import SourceOptions
from tests.conftest import TopicFactory
from tests.harness.production import setup
from tests.harness.source_driver import Driven, options


def _run(given: dict[str, str], offset: dict[str, Any] | None = None) -> Driven:
    """A run under availableNow, a new query's or one restarted from ``offset``."""
    reader = SlackwaterStreamReader(SourceOptions.parse(given))
    reader.prepareForTriggerAvailableNow()
    start = offset if offset is not None else json.loads(json.dumps(reader.initialOffset()))
    return Driven(reader, start)


def _to_its_end(driven: Driven) -> dict[str, Any]:
    """Plans and reads until the run has nothing more: its last offset."""
    for _ in range(10):
        if not driven.step():
            return driven.offset
    raise AssertionError("the run did not end in 10 batches")


def test_ending_offsets_naming_a_partition_the_topic_lacks_is_refused_naming_it(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, _ = setup(broker, new_topic, 2)
    ending = json.dumps({topic: {"0": 5, "7": 5}})
    driven = _run(options(broker.bootstrap_servers, topic, control, endingOffsets=ending))
    try:
        with pytest.raises(SourceError, match=rf"do not exist: {topic}\[7\] \({topic} has 2\)"):
            driven.plan()
    finally:
        driven.stop()


def test_a_bounded_run_restarted_with_its_ends_spelt_otherwise_goes_on_and_reads_nothing_more(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    topic, control, write = setup(broker, new_topic, 2)
    for partition in (0, 1):
        write.data(partition, *range(6))
    spelt = options(
        broker.bootstrap_servers,
        topic,
        control,
        endingOffsets=json.dumps({topic: {"0": 3, "1": -1}}),
    )
    first = _run(spelt)
    try:
        end = _to_its_end(first)
        assert sorted((r["partition"], r["offset"]) for r in first.rows if r["topic"]) == [
            *((0, o) for o in range(3)),
            *((1, o) for o in range(6)),
        ]
    finally:
        first.stop()
    # The same ends: t[1] at -1 is t[1] left out (its log end at the run's start).
    again = _run({**spelt, "endingOffsets": json.dumps({topic: {"0": 3}})}, end)
    try:
        assert again.plan() == end  # nothing more, and no refusal
    finally:
        again.stop()
    other = _run({**spelt, "endingOffsets": json.dumps({topic: {"0": 4}})}, end)
    try:
        with pytest.raises(SourceError, match="option 'endingOffsets' is"):
            other.plan()
    finally:
        other.stop()


def test_a_bounded_run_ends_under_the_idle_timeout_with_records_past_its_ends(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    # Records past the run's ends wait on the broker: not silence for the idle clock,
    # which stops there rather than change the state at every plan (a run whose plans
    # never return their start never ends).
    topic, control, write = setup(broker, new_topic, 1)
    write.data(0, *range(6))
    given = options(
        broker.bootstrap_servers,
        topic,
        control,
        endingOffsets=json.dumps({topic: {"0": 3}}),
        consumerIdleTimeout="1ms",
    )
    driven = _run(given)
    try:
        _to_its_end(driven)
        assert [r["offset"] for r in driven.rows if r["topic"]] == [0, 1, 2]
        assert driven.statuses() == {f"{topic}:0": "FINISHED"}
    finally:
        driven.stop()
