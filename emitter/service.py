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

from emitter.config import EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    ReadBack,
    last_marker_per_partition,
)
from emitter.detector import Detector, Observation, Proposal
from emitter.group_tracker import GroupTracker
from emitter.metrics import EmitterMetrics, PartitionRow, Snapshot
from emitter.observer import BrokerObserver
from emitter.publisher import MarkerPublisher
from emitter.startup import start_on_control_topic
from emitter.status_view import status_document
from slackwater import kafka_clients
from slackwater.http_server import MetricsServer
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
        self._wall_ms = wall_ms
        self.detector = Detector(
            idle_timeout_s=config.idle_timeout_ms / 1000,
            deleted_topic_polls=config.deleted_topic_polls,
        )
        self.epoch: int | None = None
        self.fenced = False
        self.broker_up = False
        self.metrics_port: int | None = None
        self._lock = threading.Lock()
        self._group = GroupTracker()  # read and updated under the lock
        self.metrics = EmitterMetrics(self.snapshot)
        self._timeout_s = config.request_timeout_ms / 1000
        self._admin = kafka_clients.admin_client(
            "admin", config.bootstrap_servers, config.kafka_config
        )
        self._observer = BrokerObserver(
            self._admin,
            self._timeout_s,
            metadata_interval_s=config.metadata_interval_ms / 1000,
            monotonic_s=monotonic_s,
            kafka_config=config.kafka_config,
        )
        self._reader: ControlTopicReader | None = None
        self._writer: ControlTopicWriter | None = None
        self._publisher: MarkerPublisher | None = None

    # --------------------------------------------------------------- start-up

    def connect(self, stop: threading.Event) -> bool:
        """Creates / reads back the control topic; retries while the broker is away.

        Returns False if ``stop`` was set before the broker could be reached.
        """
        config = self.config
        while not stop.is_set():
            try:
                started = start_on_control_topic(
                    self._admin, config, self._timeout_s, self._wall_ms
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
            self._publisher = MarkerPublisher(
                started.writer,
                self.detector,
                self._lock,
                self.metrics,
                emitter_id=config.emitter_id,
                epoch=started.epoch,
                wall_ms=self._wall_ms,
            )
            self._restore(started.read_back)
            return True
        return False

    def _restore(self, read_back: ReadBack) -> None:
        """Continues every partition from its last marker; honours pending finish requests."""
        # Partitions come from the broker and the watched topics, not from markers: a
        # marker for a topic this emitter does not watch is left to whoever watches it.
        watched = set(self.config.topics)
        latest = {
            key: marker
            for key, marker in last_marker_per_partition(read_back.records).items()
            if key[0] in watched
        }
        with self._lock:
            self.detector.restore(latest.values())
            for record in read_back.records:
                if isinstance(record, FinishRequest) and record.topic in watched:
                    self.detector.request_finish(record.topic, record.partition)
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
            len(latest),
            self.epoch,
        )

    # ------------------------------------------------------------------- poll

    def poll_once(self) -> list[Marker]:
        """One poll; returns the markers published by it."""
        started = time.perf_counter()
        assert self._reader is not None, "connect() first"
        self._follow_control_topic(self._reader.poll_new())
        answers = self._observer.observe(self.config.topics, self.config.group)
        self._set_broker_up(answers.reachable)
        for request in answers.errors:
            self.metrics.poll_errors.labels(request).inc()
        if answers.errors:
            log_poll_errors.warning("poll errors: %s", answers.errors)
        observation = Observation(
            monotonic_s=self._monotonic_s(),
            wall_ms=self._wall_ms(),
            log_end_offsets=answers.log_end_offsets,
            topics=answers.topics,
            unseen_topics=answers.unseen_topics,
            new_logs=answers.new_logs,
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
            elif (
                isinstance(record, Marker | EpochClaim)
                and self.epoch is not None
                and record.epoch > self.epoch
                and not self.fenced
            ):
                self.fenced = True
                self.metrics.fenced.set(1)
                log.error(
                    "emitter %s (epoch %d) wrote to %s: this emitter (epoch %d) is fenced "
                    "and stops publishing",
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
        each, unless ``rows`` is False)."""
        now_ms = self._wall_ms()
        with self._lock:
            partitions = self.detector.partitions
            rows_of = sorted(partitions.items()) if rows else []
            group = self._group
            rows_out = []
            for (topic, partition), state in rows_of:
                lag, lag_seconds = group.lags((topic, partition), state.log_end_offset, now_ms)
                rows_out.append(
                    PartitionRow(
                        topic=topic,
                        partition=partition,
                        status=state.status,
                        log_end_offset=state.log_end_offset,
                        still_seconds=state.still_s,
                        lag_offsets=lag,
                        lag_seconds=lag_seconds,
                    )
                )
            owners, assignment = group.ownership, group.assignment
            return Snapshot(
                group=self.config.group,
                partitions=rows_out,
                watched_partitions=len(partitions),
                missing_topics=sorted(self.detector.missing_topics),
                partitions_without_owner=(len(owners.partitions_without_owner) if owners else None),
                members_without_partitions=(
                    len(owners.members_without_partitions) if owners else None
                ),
                group_members=len(assignment) if assignment is not None else None,
                unlisted_partitions=len(self.detector.held),
                unlisted_partitions_dropped=self.detector.held_dropped,
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
            "fenced": self.fenced,
            "control_topic": self.config.control_topic,
            "group": self.config.group,
            "broker_up": self.broker_up,
        }
        return status_document(
            header, snap, markers=markers, requested=requested, owners=owners, assignment=assignment
        )

    # ------------------------------------------------------------------- run

    def run(self, stop: threading.Event, ready: threading.Event | None = None) -> int:
        """Serves metrics, connects, polls until ``stop``; flushes and returns 0."""
        server = MetricsServer(
            self.config.metrics_host,
            self.config.metrics_port,
            self.metrics.registry,
            {"/status": self.status_view},
            extra=(
                self.metrics.partition_text
                if self.config.metrics_per_partition
                else self.metrics.topic_text
            ),
        ).start()
        self.metrics_port = server.port
        log.info(
            "metrics on http://%s:%d/metrics, status on /status",
            self.config.metrics_host,
            server.port,
        )
        try:
            if not self.connect(stop):
                return 0
            if ready is not None:
                ready.set()
            interval_s = self.config.poll_interval_ms / 1000
            while not stop.is_set():
                began = time.monotonic()
                try:
                    self.poll_once()
                    self._admin.poll(0)  # serves the admin client's log lines
                except Exception:  # a poll must never end the service
                    log.exception("poll failed")
                stop.wait(max(0.0, interval_s - (time.monotonic() - began)))
            return 0
        finally:
            self.close()
            server.stop()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
