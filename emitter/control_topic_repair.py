"""When the control topic changes under a running emitter: noticed, said, written again.

The control topic is the emitter's memory and the consumers' only source of markers.
Deleted, it holds nothing; made again under its name (by an operator, by a client
with auto-creation on), it holds nothing of ours either, and maybe the broker's default
``cleanup.policy=delete``. The watch (control_topic_watch.py) checks it at most once per
metadata interval; on GONE or RECREATED the emitter says so in one line and, as at
start, creates it compacted if it is gone, then writes its whole current state again:
a new epoch claim (above its own, so consumers that held the old epochs still accept
the new markers) and every partition's current marker re-stamped with that epoch.

The state is the detector's, in memory: what was on the lost topic is what the
emitter had published, and the emitter is the only writer of markers. Bounded in time:
the loss is known within one metadata interval and one poll (kafka_evidence rule 2's
second word), then the writes take one CreateTopics, one read back, one claim and one
acknowledged write per partition with a marker (docs/emitter.md).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from emitter.config import EmitterConfig
from emitter.control_topic import (
    ControlTopicError,
    ControlTopicReader,
    ControlTopicWriter,
    claim_epoch,
    ensure_control_topic,
)
from emitter.control_topic_watch import ControlTopicWatch, Verdict
from emitter.detector import Detector, PartitionState
from emitter.metrics import ControlTopicMetrics, EmitterMetrics
from emitter.publisher import MarkerPublisher
from slackwater.kafka_logging import once_per_interval
from slackwater.markers import ControlRecord, EpochClaim, FinishRequest, Marker

if TYPE_CHECKING:
    from emitter.terms import Terms

log = logging.getLogger("emitter.service")  # one logger for the poll loop's lines
# A repair that fails is tried again at every check while the broker is away: one line
# per 30 s.
log_retry = once_per_interval("emitter.service.control_topic")


class KeptEmitter(Protocol):
    """What of the emitter (service.py) the control topic's keeping reads and sets."""

    config: EmitterConfig
    detector: Detector
    metrics: EmitterMetrics
    epoch: int | None
    highest_epoch: int
    fenced: bool
    _admin: AdminClient
    _reader: ControlTopicReader | None
    _writer: ControlTopicWriter | None
    _publisher: MarkerPublisher | None
    _lock: threading.Lock
    _monotonic_s: Callable[[], float]
    wall_ms: Callable[[], int]
    terms: Terms


# Each emitter's keeper, made at its first poll and kept for its life.
_keepers: weakref.WeakKeyDictionary[KeptEmitter, ControlTopicKeeper] = weakref.WeakKeyDictionary()


def keep_control_topic(emitter: KeptEmitter) -> None:
    """``Emitter._keep_control_topic``, at the start of every poll: the control topic
    checked (at most once per metadata interval) and, found gone or made again, written
    again whole at a new epoch, at which the emitter publishes from then on."""
    reader, writer, epoch = emitter._reader, emitter._writer, emitter.epoch
    if reader is None or writer is None or epoch is None:
        return  # not started on the control topic (a standby)
    if not emitter.terms.may_publish():
        return  # no longer the elected emitter: the one that is repairs
    keeper = _keepers.get(emitter)
    if keeper is None:
        keeper = ControlTopicKeeper(
            emitter._admin, emitter.config, emitter.metrics, emitter._monotonic_s
        )
        _keepers[emitter] = keeper
    new_epoch = keeper.keep(
        reader,
        writer,
        emitter.detector,
        emitter._lock,
        epoch=epoch,
        fenced=emitter.fenced,
        wall_ms=emitter.wall_ms,
        epoch_floor=max(epoch, emitter.highest_epoch),
        may_claim=emitter.terms.may_publish,
    )
    if new_epoch is not None:
        emitter.epoch = new_epoch
        emitter.highest_epoch = max(emitter.highest_epoch, new_epoch)  # a next term's floor
        emitter.terms.keep_epoch(new_epoch)  # and the group's, whoever takes over
        if emitter._publisher is not None:
            emitter._publisher.epoch = new_epoch  # the markers it writes from now on


class RepairFailed(ControlTopicError):
    """The state was not all written; ``claimed_epoch`` is the epoch claimed on the new
    topic before it failed (the emitter's from now on), None if none was."""

    def __init__(self, message: str, claimed_epoch: int | None) -> None:
        super().__init__(message)
        self.claimed_epoch = claimed_epoch


def repair_control_topic(
    admin: AdminClient,
    config: EmitterConfig,
    *,
    writer: ControlTopicWriter,
    reader: ControlTopicReader,
    detector: Detector,
    lock: threading.Lock,
    metrics: EmitterMetrics,
    epoch: int,
    wall_ms: int,
    epoch_floor: int | None = None,
    may_claim: Callable[[], bool] = lambda: True,
) -> int | None:
    """Writes the emitter's whole state to the control topic again; returns the epoch
    claimed, or None if another emitter already writes there at a newer epoch (this
    one's next poll reads its records from the start and is fenced by them). Raises
    KafkaException or ControlTopicError when the broker would not, RepairFailed once
    an epoch was claimed."""
    timeout_s = config.request_timeout_ms / 1000
    topic = config.control_topic
    # Created as at start: compacted, one partition; an existing topic is left as it is.
    if ensure_control_topic(admin, topic, timeout_s):
        log.info("created control topic %s again (cleanup.policy=compact)", topic)
    reader.start_again()  # a new log: the old one's positions mean nothing in it
    history = reader.read_to_end()
    if _newer_epoch_there(topic, history.records, epoch):
        reader.start_again()  # the poll reads them again, and is fenced by them
        return None
    new_epoch, meanwhile = claim_epoch(
        reader,
        writer,
        config.emitter_id,
        history.records,
        wall_ms=wall_ms,
        timeout_s=max(timeout_s * 2, 10.0),
        # Above every epoch it saw: consumers still hold the old topic's epochs.
        epoch_floor=epoch if epoch_floor is None else epoch_floor,
        may_claim=may_claim,
    )
    _honour_finish_requests(config, detector, lock, metrics, history.records + meanwhile.records)
    metrics.control_records_malformed.inc(history.malformed + meanwhile.malformed)
    metrics.control_records_tombstones.inc(history.tombstones + meanwhile.tombstones)
    try:
        written = _write_markers(
            writer, detector, lock, config.emitter_id, new_epoch, may_write=may_claim
        )
    except ControlTopicError as error:
        raise RepairFailed(str(error), new_epoch) from error
    log.info(
        "control topic %s written again: epoch %d claimed, %d partitions' markers re-stamped",
        topic,
        new_epoch,
        written,
    )
    return new_epoch


def _newer_epoch_there(topic: str, records: list[ControlRecord], epoch: int) -> bool:
    newer = [r for r in records if isinstance(r, Marker | EpochClaim) and r.epoch > epoch]
    if newer:
        log.warning(
            "control topic %s already holds emitter %s's epoch %d, newer than this one's "
            "(%d): leaving it to that emitter",
            topic,
            newer[0].emitter_id,
            newer[0].epoch,
            epoch,
        )
    return bool(newer)


def _honour_finish_requests(
    config: EmitterConfig,
    detector: Detector,
    lock: threading.Lock,
    metrics: EmitterMetrics,
    records: Iterable[ControlRecord],
) -> None:
    """Finish requests written to the new topic before the claim: read here, not by the
    poll (its reader starts after them), and honoured as the poll honours them."""
    watched = set(config.topics)
    for record in records:
        if isinstance(record, FinishRequest) and record.topic in watched:
            metrics.finish_requests.inc()
            with lock:
                detector.request_finish(record.topic, record.partition)


def _write_markers(
    writer: ControlTopicWriter,
    detector: Detector,
    lock: threading.Lock,
    emitter_id: str,
    epoch: int,
    *,
    may_write: Callable[[], bool] = lambda: True,
) -> int:
    """Every partition's last marker again, at ``epoch``: same status and offset, the
    time its status began, the partition's next seq (strictly increasing per partition
    whatever the epoch). Each acknowledged before the next, and only then the
    partition's; returns how many were written."""
    with lock:
        # Held partitions (named by markers, not listed by the broker) had markers on the
        # lost topic too; a listed partition's state is the one that counts.
        states = sorted({**detector.held, **detector.partitions}.items())
        restamped = [
            (state, _restamped(state, emitter_id, epoch))
            for _, state in states
            if state.last_marker is not None
        ]
    for state, marker in restamped:
        if not may_write():  # no longer the elected emitter: the one that is writes them
            raise ControlTopicError("no longer the elected emitter: state not all written")
        writer.write(marker)
        with lock:
            # Only the marker's bookkeeping: status, offset and the idle clock are the
            # partition's already (detector.published would start an ACTIVE one's
            # still time again).
            state.seq = marker.seq + 1
            state.last_marker = marker
    return len(restamped)


def _restamped(state: PartitionState, emitter_id: str, epoch: int) -> Marker:
    assert state.last_marker is not None
    document = state.last_marker.model_dump()
    return Marker.model_validate(
        {**document, "emitter_id": emitter_id, "epoch": epoch, "seq": state.seq}
    )


class ControlTopicKeeper:
    """The control topic's watch and the repairs its verdicts call for, kept across the
    emitter's polls (``keep``)."""

    def __init__(
        self,
        admin: AdminClient,
        config: EmitterConfig,
        metrics: EmitterMetrics,
        monotonic_s: Callable[[], float],
    ) -> None:
        self._admin = admin
        self._config = config
        self._metrics = metrics
        self._monotonic_s = monotonic_s
        self.watch = ControlTopicWatch(
            admin,
            config.control_topic,
            config.request_timeout_ms / 1000,
            config.metadata_interval_ms / 1000,
        )
        if metrics.control_topic is None:
            metrics.control_topic = ControlTopicMetrics(metrics.registry)
        self._control_metrics = metrics.control_topic
        self._control_metrics.findings = self.watch.findings
        # A loss seen and not yet written again (retried at every check until it is).
        self.pending: Verdict | None = None
        # The epoch the emitter had at the last call: another one is a start or a
        # takeover, which read the topic as it is (its id is the emitter's from then on).
        self._epoch: int | None = None
        # The partition count and compaction last said: one partition, and the policy as
        # ensure_control_topic's start-up line said it (None: not said here).
        self._said: tuple[int | None, bool | None] = (1, None)

    def keep(
        self,
        reader: ControlTopicReader,
        writer: ControlTopicWriter,
        detector: Detector,
        lock: threading.Lock,
        *,
        epoch: int,
        fenced: bool,
        wall_ms: Callable[[], int],
        epoch_floor: int | None = None,
        may_claim: Callable[[], bool] = lambda: True,
    ) -> int | None:
        """One check if due, and the repair it calls for; the new epoch if one was
        claimed (the emitter publishes at it from now on), else None."""
        if epoch != self._epoch:
            self.watch.rebase()
            self.pending, self._epoch = None, epoch
        id_before = self.watch.findings.topic_id
        verdict = self.watch.check(self._monotonic_s())
        if verdict is None:
            return None
        findings = self.watch.findings
        if findings.partitions is not None:
            reader.follow(findings.partitions)  # partitions added: read, from their start
        self._say_changes()
        if verdict in (Verdict.GONE, Verdict.RECREATED) and self.pending is None:
            self.pending = verdict
            self._say_loss(verdict, id_before)
        if self.pending is None or fenced:
            return None  # a fenced emitter leaves the topic to the newer one
        return self._repair(
            reader,
            writer,
            detector,
            lock,
            epoch=epoch,
            wall_ms=wall_ms(),
            epoch_floor=epoch if epoch_floor is None else epoch_floor,
            may_claim=may_claim,
        )

    def _repair(
        self,
        reader: ControlTopicReader,
        writer: ControlTopicWriter,
        detector: Detector,
        lock: threading.Lock,
        *,
        epoch: int,
        wall_ms: int,
        epoch_floor: int,
        may_claim: Callable[[], bool],
    ) -> int | None:
        try:
            new_epoch = repair_control_topic(
                self._admin,
                self._config,
                writer=writer,
                reader=reader,
                detector=detector,
                lock=lock,
                metrics=self._metrics,
                epoch=epoch,
                wall_ms=wall_ms,
                epoch_floor=epoch_floor,
                may_claim=may_claim,
            )
        except RepairFailed as failed:
            self._retry_later(failed)
            return self._taken(failed.claimed_epoch)
        except (KafkaException, ControlTopicError) as error:
            self._retry_later(error)
            return None
        self.pending = None
        # The topic as it is now holds the emitter's state: its id is the one to keep,
        # and the metrics say so from now on, not one metadata interval later.
        self.watch.rebase()
        self.watch.check(self._monotonic_s(), due=True)
        if new_epoch is not None:
            self._control_metrics.repairs.inc()
        return self._taken(new_epoch)

    def _taken(self, epoch: int | None) -> int | None:
        if epoch is not None:
            self._epoch = epoch
            self._metrics.epoch.set(epoch)
            self._metrics.info.info(
                {
                    "emitter_id": self._config.emitter_id,
                    "epoch": str(epoch),
                    "control_topic": self._config.control_topic,
                }
            )
        return epoch

    def _retry_later(self, error: Exception) -> None:
        log_retry.warning(
            "control topic %s not written again yet (%s); retrying at the next check",
            self._config.control_topic,
            error,
        )

    def _say_loss(self, verdict: Verdict, id_before: str | None) -> None:
        topic = self._config.control_topic
        if verdict is Verdict.GONE:
            log.error(
                "control topic %s is gone (the broker says it does not exist): creating it "
                "again, compacted, and writing every partition's marker to it again",
                topic,
            )
        else:
            log.error(
                "control topic %s was made again under its name (topic id %s, was %s): "
                "writing every partition's marker to it again",
                topic,
                self.watch.findings.topic_id,
                id_before,
            )

    def _say_changes(self) -> None:
        """One line when the control topic has more than one partition (first seen, or
        their count changed) or stopped being compacted; the metrics say both at every
        scrape. A policy not compact at start is ensure_control_topic's line."""
        findings = self.watch.findings
        now = (findings.partitions, findings.compacted)
        if findings.present is not True or now == self._said:
            return
        if now[0] is not None and now[0] != self._said[0] and now[0] > 1:
            log.warning(
                "control topic %s has %d partitions: slackwater writes to partition 0 "
                "alone and reads them all",
                self._config.control_topic,
                now[0],
            )
        if now[1] is False and self._said[1] is True:
            log.warning(
                "control topic %s has cleanup.policy=%s, not compact: old markers may expire",
                self._config.control_topic,
                findings.cleanup_policy,
            )
        self._said = now
