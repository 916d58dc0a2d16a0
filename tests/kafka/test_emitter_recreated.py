"""The emitter on Apache Kafka when a watched topic is deleted and made again under its
name with more records than the old one had (issue 41, finding 1): the new log is
another log, whatever its length, and the old log's IDLE marker is withdrawn. Topic ids
are asked only of the topics whose log ends changed: a quiet poll asks none."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from slackwater import kafka_clients
from slackwater.markers import Marker, MarkerStatus
from tests.conftest import EmitterFactory, TopicFactory
from tests.harness.emitter import (
    DEADLINE_S,
    RunningEmitter,
    after_polls,
    control_markers,
    produce_one,
)
from tests.harness.factories import wait_until
from tests.harness.production import created, delete_topic

ACTIVE, IDLE = MarkerStatus.ACTIVE, MarkerStatus.IDLE


class PollGate:
    """Holds a running emitter between two polls: ``hold`` returns once it waits before
    its next poll, ``release`` lets it go on. The test's one needed moment: the emitter's
    first look at the re-created topic comes after its records, so the new log is past
    the old end when first seen (seen empty, it would be below the old end: a lower
    answer, which the emitter looked into before issue 41 too)."""

    def __init__(self, running: RunningEmitter) -> None:
        self._poll_once = running.emitter.poll_once
        self._open = threading.Event()
        self._open.set()
        self._waiting = threading.Event()
        running.emitter.poll_once = self._gated  # type: ignore[method-assign]

    def _gated(self) -> list[Marker]:
        if not self._open.is_set():
            self._waiting.set()
            self._open.wait()
        return self._poll_once()

    def hold(self) -> None:
        self._waiting.clear()
        self._open.clear()
        assert self._waiting.wait(DEADLINE_S), "the emitter did not come to its next poll"

    def release(self) -> None:
        self._open.set()


@pytest.fixture
def gates() -> Iterator[list[PollGate]]:
    """Every gate released at the end, also when a test fails (its emitter then stops)."""
    made: list[PollGate] = []
    yield made
    for gate in made:
        gate.release()


def test_a_topic_recreated_with_more_records_is_a_new_log_for_the_emitter(
    admin: AdminClient,
    new_topic: TopicFactory,
    emitters: EmitterFactory,
    gates: list[PollGate],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic, control = new_topic(partitions=1), f"ctl-{uuid.uuid4().hex[:12]}"
    running = emitters(topics=[topic], control_topic=control)
    bootstrap = running.emitter.config.bootstrap_servers
    produce_one(bootstrap, topic, 0, count=3)

    def markers() -> list[tuple[MarkerStatus, int]]:
        return [(m.status, m.offset) for m in control_markers(bootstrap, control)]

    wait_until(lambda: markers() == [(IDLE, 3)], DEADLINE_S, "IDLE@3 on the old log")
    gate = PollGate(running)
    gates.append(gate)
    caplog.set_level(logging.INFO, logger="emitter")
    gate.hold()
    delete_topic(admin, topic)
    wait_until(lambda: created(admin, topic), DEADLINE_S, f"{topic} made again")
    produce_one(bootstrap, topic, 0, count=5)  # more than the old log's 3
    gate.release()

    wait_until(lambda: len(markers()) >= 3, DEADLINE_S, "the new log's markers")
    # Before issue 41: ACTIVE@3 (the new log taken for the old one, grown from 3), and
    # no word of the re-creation.
    assert markers() == [(IDLE, 3), (ACTIVE, 0), (IDLE, 5)]
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith(f"topic {topic} was re-created") for line in said), said
    assert f"published ACTIVE@0 for {topic}:0 (topic_recreated)" in said
    assert running.status()["partitions"][0]["log_end_offset"] == 5


def test_an_emitter_asks_topic_ids_only_of_the_topics_whose_log_ends_changed(
    new_topic: TopicFactory, emitters: EmitterFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DescribeTopics costs 12-15 ms of CPU per 1,000 partitions: asked at every poll, it
    was most of a quiet emitter's CPU. A quiet poll asks no id; a poll where one topic's
    log end moved asks that topic's only."""
    asked: list[list[str]] = []
    real = kafka_clients.TopicIds

    def recording(admin: AdminClient, names: list[str], timeout_s: float) -> object:
        asked.append(sorted(names))
        return real(admin, names, timeout_s)

    monkeypatch.setattr(kafka_clients, "TopicIds", recording)
    quiet, moving = new_topic(partitions=2), new_topic(partitions=1)
    running = emitters(topics=[quiet, moving], control_topic=f"ctl-{uuid.uuid4().hex[:12]}")

    def seen() -> bool:
        ends = [row["log_end_offset"] for row in running.status()["partitions"]]
        return len(ends) == 3 and None not in ends

    wait_until(seen, DEADLINE_S, "every partition's log end")
    assert sorted([quiet, moving]) in asked  # the first look: every id, none known yet
    after_polls(running, 2)
    asked.clear()
    after_polls(running, 5)
    assert asked == []
    produce_one(running.emitter.config.bootstrap_servers, moving, 0)
    wait_until(
        lambda: any(r["log_end_offset"] == 1 for r in running.status()["partitions"]),
        DEADLINE_S,
        f"{moving}'s new log end",
    )
    after_polls(running, 2)
    assert asked == [[moving]]
