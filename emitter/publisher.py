"""Publishing the detector's proposals as markers on the control topic.

A marker counts only once the broker acknowledged it: each is written and
delivered before the detector takes it as published, one at a time, and the
first that fails leaves the rest of the poll's proposals to the next poll (the
detector proposes them again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from emitter.control_topic import ControlTopicError, ControlTopicWriter
from emitter.detector import Detector, Proposal
from emitter.metrics import EmitterMetrics
from slackwater.markers import Marker, TopicPartitionKey

log = logging.getLogger("emitter.service")  # one logger for the poll loop's lines


class MarkerPublisher:
    """Writes one epoch's markers for one emitter; the detector is read and told under
    the service's lock."""

    def __init__(
        self,
        writer: ControlTopicWriter,
        detector: Detector,
        lock: threading.Lock,
        metrics: EmitterMetrics,
        *,
        emitter_id: str,
        epoch: int,
        wall_ms: Callable[[], int],
        may_publish: Callable[[], bool] = lambda: True,
    ) -> None:
        self._writer = writer
        self._detector = detector
        self._lock = lock
        self._metrics = metrics
        self._emitter_id = emitter_id
        self.epoch = epoch
        self._wall_ms = wall_ms
        # Asked before every write: an emitter that stood down mid-poll writes no more.
        self._may_publish = may_publish

    def publish(self, proposals: list[Proposal]) -> list[Marker]:
        """The markers published, in order; one per partition at most."""
        published: list[Marker] = []
        seen: set[TopicPartitionKey] = set()
        for proposal in proposals:
            key = (proposal.topic, proposal.partition)
            if key in seen:
                continue
            seen.add(key)
            if not self._may_publish():
                break  # no longer the active emitter (election.py)
            marker = self._marker(proposal)
            try:
                self._writer.write(marker)
            except ControlTopicError as error:
                self._metrics.marker_publish_failures.inc()
                log.warning(
                    "marker %s@%d for %s:%d not published (%s); retrying next poll",
                    marker.status,
                    marker.offset,
                    marker.topic,
                    marker.partition,
                    error,
                )
                break  # the broker is likely away: the rest wait for the next poll
            with self._lock:
                self._detector.published(marker)
            self._metrics.markers_published.labels(marker.status.value).inc()
            log.info(
                "published %s@%d for %s:%d (%s)",
                marker.status,
                marker.offset,
                marker.topic,
                marker.partition,
                proposal.reason,
            )
            published.append(marker)
        return published

    def _marker(self, proposal: Proposal) -> Marker:
        with self._lock:
            seq = self._detector.partitions[(proposal.topic, proposal.partition)].seq
        return Marker(
            topic=proposal.topic,
            partition=proposal.partition,
            status=proposal.status,
            offset=proposal.offset,
            emitted_at=self._wall_ms(),
            emitter_id=self._emitter_id,
            epoch=self.epoch,
            seq=seq,
        )
