"""Which of several emitters on one control topic publishes: Kafka's group protocol decides.

Every emitter joins one consumer group of its own (``election_group``, by default
``slackwater-emitters.<control topic>``) subscribed to the election topic
``<control topic>.emitters`` (one partition, never written); the member that the group
assigns its partition 0 is the active one, every other member stands by. This is how
Kafka Connect elects its leader: the broker's group coordinator, not a timer of ours,
says who is in and who is out. The topic is not the control topic itself: a control
topic deleted under the active emitter must not take its role away, since that emitter
alone holds the state to write again (control_topic_repair.py).

    emitter A   joins ── owns p0 (active) ─────── SIGKILL
    emitter B   joins ── stands by ───────────────────────── session timeout ── owns p0
                                                                 (active: claims epoch n+1)

- The assignment is cooperative-sticky: p0 stays with its owner when a standby joins or
  leaves, so scaling the replicas does not move the active role.
- An active emitter that is cut off (its process stopped past the session timeout, its
  network gone) loses p0 when the coordinator evicts it; librdkafka reports the
  assignment lost at its next poll and the emitter stands by. Until then it may still
  publish at its old epoch; the new active's higher epoch fences those markers
  (semantics.md: a marker of an older epoch than one held is ignored).
- The election topic holds no record: the consumer only holds a membership.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater import kafka_clients, kafka_evidence, kafka_logging

log = logging.getLogger("emitter.service")  # one logger for the service's lines
log_problems = kafka_logging.once_per_interval("emitter.service.election")

# The election topic's partition whose owner is the active emitter.
ACTIVE_PARTITION = 0
ELECTION_TOPIC_SUFFIX = ".emitters"


def election_topic(control_topic: str) -> str:
    return control_topic + ELECTION_TOPIC_SUFFIX


def ensure_election_topic(admin: AdminClient, name: str, timeout_s: float) -> bool:
    """Creates the election topic if the broker says it is not there (kafka_evidence rule
    1: a refusal or no answer creates nothing); True if this call made it."""
    described = admin.list_topics(topic=name, timeout=timeout_s).topics.get(name)
    if not kafka_evidence.topic_missing(described):
        return False
    topic = NewTopic(
        name, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"}
    )
    return kafka_clients.create_topic(admin, topic, timeout_s)


def election_settings(
    group: str, session_timeout_ms: int, metadata_interval_ms: int
) -> dict[str, Any]:
    """The election consumer's settings (its client's others come from the user's)."""
    return {
        "group.id": group,
        # A control topic created (or created again) is seen within this: the group then
        # assigns its partitions (librdkafka's default is 5 minutes).
        "topic.metadata.refresh.interval.ms": metadata_interval_ms,
        # The classic protocol: its session timeout is the client's setting (the KIP-848
        # protocol's is the broker's group.consumer.session.timeout.ms, 45 s by default).
        "group.protocol": "classic",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(1, session_timeout_ms // 3),
        # librdkafka refuses a poll interval under the session; the thread polls every
        # 0.2 s, so this bound is never what ends a membership.
        "max.poll.interval.ms": max(300_000, session_timeout_ms),
        # p0 stays with its owner while members come and go (no eager revoke-all).
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": False,
        "auto.offset.reset": "latest",
        # Nothing worth fetching: little at a time, if any.
        "max.partition.fetch.bytes": 1024,
    }


class Election:
    """A membership in the emitters' group, polled in its own thread; ``active`` while
    this member owns the election topic's partition 0."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        group: str,
        kafka_config: dict[str, str],
        *,
        session_timeout_ms: int,
        metadata_interval_ms: int,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.topic = topic
        self.group = group
        self._wall_ms = wall_ms
        self._consumer = kafka_clients.consumer(
            # Its lines are the admin client's kind: a broker away is said once for both.
            "admin#election",
            bootstrap_servers,
            kafka_config,
            election_settings(group, session_timeout_ms, metadata_interval_ms),
        )
        self._active = threading.Event()
        # Set at every change of role: the service's loop waits on it.
        self.changed = threading.Event()
        self.since_ms = wall_ms()
        self.joined = False  # the group assigned this member at least once
        # The last error the group's consumer met (redacted), for /status.
        self.problem: str | None = None
        # An epoch the service asked to keep, committed by the election thread.
        self._epoch_to_commit: int | None = None
        # The service's asks for the kept epoch, answered by the election thread.
        self._floor_asks: queue.SimpleQueue[tuple[queue.Queue[int], float]] = queue.SimpleQueue()
        # Incremented at every assignment of the election topic's partition 0 to this member.
        self.term = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emitter-election", daemon=True)

    @property
    def active(self) -> bool:
        return self._active.is_set()

    def start(self) -> Election:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )
        self._thread.start()
        return self

    def alive(self) -> bool:
        """The membership is being kept (its thread polls): liveness, not readiness."""
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # Serves the group's callbacks and the client's errors; records dropped.
                message = self._consumer.poll(0.2)
            except KafkaException as error:  # the membership must outlive one bad poll
                error_text: str | None = str(error)
            except RuntimeError:  # closed under us at shutdown
                return
            else:
                failed = None if message is None else message.error()
                error_text = None if failed is None else failed.str()
            self._commit_pending_epoch()
            self._answer_floor_asks()
            if error_text is not None:
                # A refused group or topic (an ACL), said in one line every 30 s.
                self.problem = kafka_logging.redact(error_text)
                log_problems.warning("emitters' group %s: %s", self.group, self.problem)
                self._stop.wait(0.2)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.joined, self.problem = True, None
        if any(self._is_active_partition(tp) for tp in partitions):
            self._set(True)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(self._is_active_partition(tp) for tp in partitions):
            self._set(False)

    def _is_active_partition(self, tp: TopicPartition) -> bool:
        return tp.topic == self.topic and tp.partition == ACTIVE_PARTITION

    def _set(self, active: bool) -> None:
        if active == self._active.is_set():
            return
        if active:
            self.term += 1
        (self._active.set if active else self._active.clear)()
        self.since_ms = self._wall_ms()
        log.info(
            "emitters' group %s: this emitter is now %s",
            self.group,
            f"active (owns {self.topic} partition 0)" if active else "a standby",
        )
        self.changed.set()

    def commit_epoch(self, epoch: int) -> None:
        """Keeps ``epoch`` as the group's committed offset of the election partition (the
        topic holds no record: the offset is only a number kept by the coordinator): the
        floor of every later claim, wherever the control topic's own records went
        (deleted, re-created, expired), as consumers still hold the epochs they saw.
        Committed by the election thread (a consumer is not called from two threads)."""
        self._epoch_to_commit = epoch

    def _commit_pending_epoch(self) -> None:
        epoch, self._epoch_to_commit = self._epoch_to_commit, None
        if epoch is None:
            return
        offsets = [TopicPartition(self.topic, ACTIVE_PARTITION, epoch)]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as error:  # the control topic still holds it; said, not fatal
            log_problems.warning(
                "emitters' group %s: epoch %d not kept as its offset (%s)",
                self.group,
                epoch,
                kafka_logging.redact(str(error)),
            )

    def committed_epoch(self, timeout_s: float) -> int:
        """The highest epoch an active emitter of the group kept (0: none, or no answer).
        Asked by the election thread, as every call on its consumer is (not the admin
        client's OffsetFetch: librdkafka 2.16 can crash on its NOT_COORDINATOR answer,
        confluentinc/librdkafka#5040)."""
        asked: queue.Queue[int] = queue.Queue(maxsize=1)
        self._floor_asks.put((asked, timeout_s))
        try:
            return asked.get(timeout=kafka_clients.answer_wait_s(timeout_s) + 1.0)
        except queue.Empty:
            return 0

    def _answer_floor_asks(self) -> None:
        while not self._floor_asks.empty():
            answer_to, timeout_s = self._floor_asks.get_nowait()
            asked = [TopicPartition(self.topic, ACTIVE_PARTITION)]
            try:
                (answer,) = self._consumer.committed(asked, timeout=timeout_s)
                offset = int(answer.offset)
                known = answer.error is None and kafka_evidence.known_offset(offset)
                answer_to.put(offset if known else 0)
            except KafkaException:
                answer_to.put(0)

    def close(self) -> None:
        """Leaves the group at once (a standby takes over without waiting for the session
        timeout)."""
        self._stop.set()
        self._thread.join(10)
        self._set(False)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as error:
            log.info("leaving the emitters' group %s: %s", self.group, error)


class RoleClock:
    """The emitter's role and since when, as ``/status`` and ``/metrics`` say them."""

    def __init__(self, since: Any, fenced: Any) -> None:
        self._since, self._fenced = since, fenced
        self.role: str | None = None
        self.since_ms: int | None = None

    def note(self, role: str, wall_ms: int) -> None:
        if role == self.role:
            return
        self.role, self.since_ms = role, wall_ms
        self._fenced.set(1 if role == "fenced" else 0)
        self._since.set(wall_ms / 1000)
