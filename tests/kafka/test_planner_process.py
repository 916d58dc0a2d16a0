"""The planner's process (planner_process.py): its objects leave the collector's
generations once, after the first whole plan, and only in Spark's planner process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source.driver import planner_process
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import Writer
from tests.harness.source_driver import Driven, options


@pytest.fixture
def unsettled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(planner_process._Asked, "settled", False)
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's objects back in the generations


def test_the_planner_process_freezes_its_objects_once_after_its_first_plan(
    unsettled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(planner_process, "in_planner_process", lambda: True)
    planner_process.settled()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    later = [{"made": i} for i in range(1_000)]  # a later plan's objects
    planner_process.settled()
    # Once: later plans' objects stay collectable. Frozen objects freed since (by other
    # threads too) leave the count; only a second freeze would raise it.
    assert gc.get_freeze_count() <= frozen
    assert later


def test_no_other_process_freezes_its_objects(unsettled: None) -> None:
    planner_process.settled()  # pytest's process: not Spark's planner process
    assert gc.get_freeze_count() == 0


def test_a_planner_freezes_after_its_first_whole_plan_not_after_an_idle_one(
    unsettled: None, monkeypatch: pytest.MonkeyPatch, broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """An idle plan (nothing new: the start returned) has built neither the progress
    consumer nor the aligner it keeps: the freeze waits for the first plan that has."""
    monkeypatch.setattr(planner_process, "in_planner_process", lambda: True)
    monkeypatch.setattr(planner_process, "stop_on_sigterm", lambda: None)  # pytest's own
    topic = new_topic(partitions=1)
    driven = Driven.start(options(broker.bootstrap_servers, topic, None))
    try:
        assert driven.plan() == driven.offset  # nothing new
        assert gc.get_freeze_count() == 0
        Writer(broker.bootstrap_servers, topic, "unused").data(0, *range(5))
        assert SourceOffset.decode(driven.plan()).data == {topic: {"0": 5}}
        assert gc.get_freeze_count() > 0
    finally:
        driven.stop()
