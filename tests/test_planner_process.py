"""The planner's process (planner_process.py): its objects leave the collector's
generations once, after the first plan, and only in Spark's planner process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from spark_consumer.source import planner_process


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
    assert gc.get_freeze_count() == frozen  # once: later plans' objects stay collectable
    assert later


def test_no_other_process_freezes_its_objects(unsettled: None) -> None:
    planner_process.settled()  # pytest's process: not Spark's planner process
    assert gc.get_freeze_count() == 0
