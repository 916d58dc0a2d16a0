"""Running an emitter in-process against the session's Apache Kafka, for integration tests."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from emitter.config import EmitterConfig
from emitter.control_topic import ControlTopicReader
from emitter.service import Emitter
from slackwater.markers import Marker
from tests.harness.factories import parsed_samples, wait_until

FAST = {
    "idle_timeout_ms": 1_000,
    "poll_interval_ms": 200,
    "request_timeout_ms": 1_000,
    "metadata_interval_ms": 200,
    "metrics_port": 0,
}


# Generous: a deadline only bounds a test that would otherwise hang (these machines are
# shared and noisy); no test asserts how fast anything happened.
DEADLINE_S = 30.0
# Polls that span idle_timeout with room to spare: after them, a marker that was due
# has been published (FAST: 1 s idle timeout, 200 ms polls).
POLLS_PAST_IDLE_TIMEOUT = 2 * FAST["idle_timeout_ms"] // FAST["poll_interval_ms"]


def produce_one(bootstrap: str, topic: str, partition: int, count: int = 1) -> None:
    """``count`` records, each acknowledged before the next (the log end moves by one)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for _ in range(count):
        producer.produce(topic, value=b"{}", partition=partition)
        assert producer.flush(10) == 0


_COORDINATOR_MOVING = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE)


def commit(consumer: Consumer, offsets: list[TopicPartition]) -> None:
    """A group's offsets committed, as a consumer application does: retried while the
    broker answers with a retriable error (the first commit on a new broker meets
    COORDINATOR_LOAD_IN_PROGRESS, or NOT_COORDINATOR, while __consumer_offsets is being
    created; librdkafka flags only the first as retriable)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return
        except KafkaException as error:
            again = error.args[0].retriable() or error.args[0].code() in _COORDINATOR_MOVING
            if not again or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def control_markers(bootstrap: str, control_topic: str) -> list[Marker]:
    reader = ControlTopicReader(bootstrap, control_topic, {}, 5.0)
    try:
        return [r for r in reader.read_to_end().records if isinstance(r, Marker)]
    finally:
        reader.close()


@dataclass
class RunningEmitter:
    emitter: Emitter
    stop_event: threading.Event
    thread: threading.Thread
    exit_codes: list[int] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.emitter.metrics_port}"

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base_url + "/status", timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=5) as response:
            text: str = response.read().decode()
            return text

    def probe(self, path: str) -> int:
        """The HTTP status of a probe (``/ready``, ``/live``), as Kubernetes reads it."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one series from a real scrape of /metrics."""
        for sample_name, sample_labels, value in parsed_samples(self.metrics_text()):
            if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
                return float(value)
        return None

    def stop(self) -> int:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "emitter did not stop"
        return self.exit_codes[0]


def polls_done(running: RunningEmitter) -> float:
    """Polls the emitter has finished, from its own /metrics."""
    return running.metric("slackwater_emitter_poll_duration_seconds_count") or 0.0


def after_polls(running: RunningEmitter, count: int) -> None:
    """Returns once the emitter has polled ``count`` more times: proof that time passed."""
    target = polls_done(running) + count
    wait_until(lambda: polls_done(running) >= target, DEADLINE_S + count, f"{count} more polls")


def start_emitter(**settings: Any) -> RunningEmitter:
    config = EmitterConfig.model_validate({**FAST, **settings})
    emitter = Emitter(config)
    stop, ready = threading.Event(), threading.Event()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(emitter.run(stop, ready)), daemon=True)
    thread.start()
    running = RunningEmitter(emitter, stop, thread, codes)
    if not ready.wait(30):
        running.stop()
        raise AssertionError("emitter did not connect")
    return running
