"""``slackwater emit``: the poll loop around the pure :class:`Detector`.

Each poll: read what is new on the control topic (finish requests, a newer
emitter), read the broker's answers (one request per kind), let the detector
decide, publish its proposals one by one (each acknowledged before it
counts: publisher.py), and keep what metrics and ``/status`` show
(group_tracker.py, status_view.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from emitter.config import EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    ReadBack,
)
from emitter.detector import Detector, Observation, Proposal
from emitter.group_tracker import GroupTracker
from emitter.metrics import EmitterMetrics, Snapshot
from emitter.observer import BrokerObserver
from emitter.publisher import MarkerPublisher
from emitter.snapshot import snapshot_of
from emitter.startup import restore, start_on_control_topic
from emitter.status_view import status_document
from emitter.terms import Terms
from slackwater import kafka_clients
from slackwater.kafka_logging import once_per_interval
from slackwater.markers import EpochClaim, FinishRequest, Marker

log = logging.getLogger(__name__)
# Repeats while the broker is away: one line per kind per 30 s.
log_unreachable = once_per_interval(f"{__name__}.connection")
# The same failed request at every poll (a refused topic, a broker away) is one line
# every 30 s, not one a second.
log_poll_errors = once_per_interval(f"{__name__}.poll")


class Emitter:
    """One emitter process: state, Kafka clients, metrics."""

    def __init__(
        self,
        config: EmitterConfig,
        monotonic_s: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.config = config
        self._monotonic_s = monotonic_s
        self.wall_ms = wall_ms
        self.detector = self._new_detector()
        self.epoch: int | None = None
        self.fenced = False
        # The highest epoch this process saw on the control topic: a claim goes above it
        # even where the topic no longer holds it (deleted and created again).
        self.highest_epoch = 0
        self.broker_up = False
        self.metrics_port: int | None = None
        self._lock = threading.Lock()
        self._group = GroupTracker()  # read and updated under the lock
        self.metrics = EmitterMetrics(self.snapshot)
        # Its terms as the active emitter of the control topic, elected by Kafka.
        self.terms = Terms(self)
        self._timeout_s = config.request_timeout_ms / 1000
        self._admin = kafka_clients.admin_client(
            "admin", config.bootstrap_servers, config.kafka_config
        )
        self._observer = self._new_observer()
        self._reader: ControlTopicReader | None = None
        self._writer: ControlTopicWriter | None = None
        self._publisher: MarkerPublisher | None = None

    def _new_detector(self) -> Detector:
        return Detector(
            idle_timeout_s=self.config.idle_timeout_ms / 1000,
            deleted_topic_polls=self.config.deleted_topic_polls,
        )

    def _new_observer(self) -> BrokerObserver:
        return BrokerObserver(
            self._admin,
            self._timeout_s,
            metadata_interval_s=self.config.metadata_interval_ms / 1000,
            monotonic_s=self._monotonic_s,
            kafka_config=self.config.kafka_config,
        )

    # --------------------------------------------------------------- start-up

    def connect(self, stop: threading.Event) -> bool:
        """Creates / reads back the control topic; retries while the broker is away.

        Returns False if ``stop`` was set, or this emitter stood down, before the broker
        could be reached.
        """
        config = self.config
        while not stop.is_set() and self.terms.may_publish():
            try:
                started = start_on_control_topic(
                    self._admin,
                    config,
                    self._timeout_s,
                    self.wall_ms,
                    epoch_floor=max(self.highest_epoch, self.terms.epoch_floor()),
                    may_claim=self.terms.may_publish,
                )
            except (KafkaException, ControlTopicError, KeyError) as error:
                self._set_broker_up(False)
                log_unreachable.warning(
                    "cannot start on the control topic yet (%s); retrying", error
                )
                stop.wait(config.poll_interval_ms / 1000)
                continue
            self._reader, self._writer = started.reader, started.writer
            self.epoch = started.epoch
            self.highest_epoch = max(self.highest_epoch, started.epoch)
            self.terms.keep_epoch(started.epoch)
            self._publisher = MarkerPublisher(
                started.writer,
                self.detector,
                self._lock,
                self.metrics,
                emitter_id=config.emitter_id,
                epoch=started.epoch,
                may_publish=self.terms.may_publish,
                wall_ms=self.wall_ms,
            )
            self._restore(started.read_back)
            return True
        return False

    def _restore(self, read_back: ReadBack) -> None:
        """Continues every partition from its last marker; honours pending finish requests."""
        with self._lock:
            restored = restore(self.detector, read_back, self.config.topics)
        self.metrics.control_records_malformed.inc(read_back.malformed)
        self.metrics.control_records_tombstones.inc(read_back.tombstones)
        self.metrics.epoch.set(self.epoch or 0)
        self.metrics.info.info(
            {
                "emitter_id": self.config.emitter_id,
                "epoch": str(self.epoch),
                "control_topic": self.config.control_topic,
            }
        )
        log.info(
            "read back %d control records (%d partitions with markers); epoch %d",
            len(read_back.records),
            restored,
            self.epoch,
        )

    # ------------------------------------------------------------------- poll

    def poll_once(self) -> list[Marker]:
        """One poll; returns the markers published by it."""
        started = time.perf_counter()
        assert self._reader is not None, "connect() first"
        self._keep_control_topic()
        self._follow_control_topic(self._reader.poll_new())
        answers = self._observer.observe(self.config.topics, self.config.group)
        self._set_broker_up(answers.reachable)
        for request in answers.errors:
            self.metrics.poll_errors.labels(request).inc()
        if answers.errors:
            log_poll_errors.warning("poll errors: %s", answers.errors)
        observation = Observation(
            monotonic_s=answers.answered_s,  # a log end is seen when it came (detector.py)
            wall_ms=self.wall_ms(),
            log_end_offsets=answers.log_end_offsets,
            topics=answers.topics,
            unseen_topics=answers.unseen_topics,
            new_logs=answers.new_logs,
            requested_s=answers.requested_s,
        )
        with self._lock:
            missing_before = set(self.detector.missing_topics)
            proposals = self.detector.observe(observation, self.config.topics)
            missing_now = set(self.detector.missing_topics)
            if self.config.group is not None:
                self._group.record(answers, self.detector.partitions.keys(), observation.wall_ms)
        if observation.topics is not None and missing_now != missing_before:
            for topic in sorted(missing_now - missing_before):
                log.warning(
                    "watched topic %s is not listed by the broker (not created yet, or "
                    "refused to this principal: see poll errors); retrying every poll",
                    topic,
                )
            for topic in sorted(missing_before - missing_now):
                log.info("watched topic %s appeared; tracking its partitions", topic)
        published = self._publish(proposals)
        self.metrics.poll_duration.observe(time.perf_counter() - started)
        return published

    def _set_broker_up(self, up: bool) -> None:
        self.broker_up = up
        self.metrics.broker_up.set(1 if up else 0)

    def _follow_control_topic(self, read: ReadBack) -> None:
        self.metrics.control_records_malformed.inc(read.malformed)
        self.metrics.control_records_tombstones.inc(read.tombstones)
        for record in read.records:
            if isinstance(record, FinishRequest):
                self.metrics.finish_requests.inc()
                log.info(
                    "finish requested for %s:%d by %s",
                    record.topic,
                    record.partition,
                    record.requested_by,
                )
                with self._lock:
                    self.detector.request_finish(record.topic, record.partition)
            if isinstance(record, Marker | EpochClaim):
                self.highest_epoch = max(self.highest_epoch, record.epoch)
            if (
                isinstance(record, Marker | EpochClaim)
                and self.epoch is not None
                and record.epoch > self.epoch
                # Its own claim (a repair's whose read-back failed) fences no one.
                and record.emitter_id != self.config.emitter_id
                and not self.fenced
            ):
                self.fenced = True
                self.terms.fenced()
                log.error(
                    "emitter %s (epoch %d) wrote to %s: this emitter (epoch %d) is fenced "
                    "and stands by until the emitters' group elects it again",
                    record.emitter_id,
                    record.epoch,
                    self.config.control_topic,
                    self.epoch,
                )

    def _publish(self, proposals: list[Proposal]) -> list[Marker]:
        if self.fenced or not proposals:
            return []
        assert self._publisher is not None
        return self._publisher.publish(proposals)

    # ------------------------------------------------------------------ views

    def snapshot(self, rows: bool = True) -> Snapshot:
        """The emitter's state for metrics, ``/status`` and the demo (one partition row
        each, unless ``rows`` is False). A standby or fenced emitter reports no partition:
        it publishes none of their markers."""
        reporting = self.role == "active" or self.terms.election is None
        with self._lock:
            return snapshot_of(
                self.detector if reporting else None,
                self._group,
                self.config.group,
                self.wall_ms(),
                rows=rows,
            )

    def status_view(self) -> dict[str, Any]:
        """The JSON of ``GET /status`` (status_view.py)."""
        snap = self.snapshot()
        with self._lock:
            markers = {k: s.last_marker for k, s in self.detector.partitions.items()}
            requested = {k for k, s in self.detector.partitions.items() if s.finish_requested}
            owners, assignment = self._group.ownership, self._group.assignment
        header = {
            "emitter_id": self.config.emitter_id,
            "epoch": self.epoch,
            "fenced": self.fenced or self.role == "fenced",
            **self.terms.status_fields(),
            "control_topic": self.config.control_topic,
            "group": self.config.group,
            "broker_up": self.broker_up,
        }
        watch = self.metrics.control_topic
        return status_document(
            header,
            snap,
            markers=markers,
            requested=requested,
            owners=owners,
            assignment=assignment,
            control_topic=None if watch is None else watch.findings,
        )

    # ------------------------------------------------------------------- run

    def run(self, stop: threading.Event, ready: threading.Event | None = None) -> int:
        """Serves metrics, and publishes while the emitters' group makes this one the
        active emitter (terms.py); returns 0 at ``stop``. ``ready`` is set at the first
        start as the active one."""
        return self.terms.run(stop, ready)

    def serve_client_callbacks(self) -> None:
        self._admin.poll(0)  # serves the admin client's log lines

    @property
    def admin(self) -> AdminClient:
        return self._admin

    def stand_down(self) -> None:
        """Back to standby: the term's clients closed and its state dropped, so that a
        standby reports nothing it did not publish, and a next term starts from what the
        control topic holds, as a restart does."""
        self.close()
        with self._lock:
            self.detector = self._new_detector()
            self._group = GroupTracker()
        self._observer = self._new_observer()
        self._publisher = None
        self.epoch = None
        self.fenced = False
        self.metrics.epoch.set(0)
        self.terms.note_role()

    @property
    def role(self) -> str:
        """``active``, ``standby`` or ``fenced`` (terms.py)."""
        return self.terms.role

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _keep_control_topic(self) -> None:
        """The control topic checked (at most once per metadata interval) and, found gone
        or made again, written again whole at a new epoch (control_topic_repair.py)."""
        from emitter.control_topic_repair import keep_control_topic

        keep_control_topic(self)
