"""An emitter's terms as the active one of its control topic: stand by until the
emitters' group elects it (election.py), start as a restart does, poll while it holds
the role, stand down when it loses it or is fenced.

    standby ──(assigned the election topic's partition 0)──> start: read back, claim
       ^                                                               |
       |                                                               v
    stand down <──(partition 0 revoked or lost; fenced)─────── poll and publish
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from emitter.election import Election, RoleClock, election_topic, ensure_election_topic
from emitter.startup import why_not_started
from emitter.status_view import status_time
from slackwater.http_server import MetricsServer
from slackwater.kafka_logging import once_per_interval, redacted_document

if TYPE_CHECKING:
    from emitter.service import Emitter

log = logging.getLogger("emitter.service")  # one logger for the service's lines
log_unreachable = once_per_interval("emitter.service.connection")


class Terms:
    """The role of one emitter, and the loop that takes it up and gives it back."""

    def __init__(self, emitter: Emitter) -> None:
        self._emitter = emitter
        # Set by run(): the emitters' group that says whether this one publishes.
        self.election: Election | None = None
        # The term (an assignment of the election partition) this emitter took up: it
        # publishes only in that one, so a term lost and won again mid-poll is started
        # afresh (another emitter may have claimed in between).
        self._taken_term: int | None = None
        # Fenced by an emitter outside its group (another deployment, a forged record):
        # the role is taken up again after a pause of one session, not at once (the two
        # would claim in turn every poll), and not never (a stall).
        self._fenced_until_s = 0.0
        metrics = emitter.metrics
        self._roles = RoleClock(metrics.role_since, metrics.fenced)
        # Read at scrape time: a role lost mid-poll shows at once.
        metrics.active.set_function(lambda: 1.0 if self.role == "active" else 0.0)

    def may_publish(self) -> bool:
        """Active in the emitters' group in the term it took up (always without a group:
        poll_once driven directly)."""
        election = self.election
        return election is None or (election.active and election.term == self._taken_term)

    @property
    def role(self) -> str:
        """``active``, ``standby``, or ``fenced``: elected, but another emitter's epoch
        is newer (one outside the group)."""
        election, emitter = self.election, self._emitter
        if emitter.fenced or (
            election is not None and election.active and time.monotonic() < self._fenced_until_s
        ):
            return "fenced"
        if self.may_publish() and emitter.epoch is not None:
            return "active"
        return "standby"

    def note_role(self) -> None:
        self._roles.note(self.role, self._emitter.wall_ms())

    def fenced(self) -> None:
        """A newer epoch was read: this term is over, and not taken up again."""
        pause_s = self._emitter.config.session_timeout_ms / 1000
        self._fenced_until_s = time.monotonic() + pause_s
        self.note_role()

    def epoch_floor(self) -> int:
        """The highest epoch an active emitter of the group kept (election.py)."""
        election = self.election
        timeout_s = self._emitter.config.request_timeout_ms / 1000
        if election is None:
            return 0
        return election.committed_epoch(timeout_s)

    def keep_epoch(self, epoch: int) -> None:
        if self.election is not None and self.may_publish():
            self.election.commit_epoch(epoch)

    def status_fields(self) -> dict[str, Any]:
        """Of the emitters on this control topic, whether this one publishes, since
        when, and in which group (``/status``)."""
        election = self.election
        return {
            "role": self.role,
            "role_since": status_time(self._roles.since_ms),
            "election_group": self._emitter.config.election_group_name,
            "election_problem": None if election is None else election.problem,
        }

    def ready_probe(self) -> tuple[bool, str]:
        """Readiness: only the active emitter publishes, so only it is ready."""
        role = self.role
        return role == "active", f"{role}\n"

    def live_probe(self) -> tuple[bool, str]:
        """Liveness: the membership in the emitters' group is kept (a standby is live)."""
        alive = self.election is None or self.election.alive()
        return alive, "ok\n" if alive else "the emitters' group is not being kept\n"

    # ------------------------------------------------------------------- run

    def run(self, stop: threading.Event, ready: threading.Event | None) -> int:
        emitter, config = self._emitter, self._emitter.config
        metrics = emitter.metrics
        server = MetricsServer(
            config.metrics_host,
            config.metrics_port,
            metrics.registry,
            # Every text an HTTP answer carries passes the secrets' filter.
            {"/status": lambda: redacted_document(emitter.status_view())},
            extra=(metrics.partition_text if config.metrics_per_partition else metrics.topic_text),
            probes={"/ready": self.ready_probe, "/live": self.live_probe},
        ).start()
        emitter.metrics_port = server.port
        log.info(
            "metrics on http://%s:%d/metrics, status on /status, probes on /ready and /live",
            config.metrics_host,
            server.port,
        )
        self.election = Election(
            config.bootstrap_servers,
            election_topic(config.control_topic),
            config.election_group_name,
            config.kafka_config,
            session_timeout_ms=config.session_timeout_ms,
            metadata_interval_ms=config.metadata_interval_ms,
            wall_ms=emitter.wall_ms,
        ).start()
        self.note_role()
        try:
            while self._await_active(stop):
                if emitter.connect(stop):
                    metrics.takeovers.inc()
                    self.note_role()
                    if ready is not None:
                        ready.set()
                    self._poll_while_active(stop)
                emitter.stand_down()
            return 0
        finally:
            self.election.close()
            emitter.close()
            server.stop()

    def _await_active(self, stop: threading.Event) -> bool:
        """Stands by until the group makes this emitter the active one, and a fencing's
        pause is over; False at ``stop``."""
        election, emitter = self.election, self._emitter
        assert election is not None
        interval_s = emitter.config.poll_interval_ms / 1000
        metadata_interval_s = emitter.config.metadata_interval_ms / 1000
        created_at_s: float | None = None
        while not stop.is_set():
            election.changed.clear()
            if election.active and time.monotonic() >= self._fenced_until_s:
                self._taken_term = election.term
                return True
            now_s = time.monotonic()
            if created_at_s is None or now_s - created_at_s >= metadata_interval_s:
                # The group assigns a topic's partitions only: one that is not there (not
                # created yet, deleted) is created by whichever emitter sees it.
                self._create_election_topic(election.topic)
                created_at_s = now_s
            emitter.serve_client_callbacks()
            self.note_role()
            election.changed.wait(interval_s)
        return False

    def _create_election_topic(self, name: str) -> None:
        emitter = self._emitter
        try:
            if ensure_election_topic(emitter.admin, name, emitter.config.request_timeout_ms / 1000):
                log.info("created the emitters' election topic %s", name)
        except KafkaException as error:
            why = why_not_started(
                error, f"describe or create election topic {name}", emitter.admin, emitter.config
            )
            log_unreachable.warning("cannot stand for election yet: %s; retrying", why)

    def _poll_while_active(self, stop: threading.Event) -> None:
        emitter = self._emitter
        interval_s = emitter.config.poll_interval_ms / 1000
        while not stop.is_set() and self.may_publish() and not emitter.fenced:
            began = time.monotonic()
            try:
                emitter.poll_once()
                emitter.serve_client_callbacks()
            except Exception:  # a poll must never end the service
                log.exception("poll failed")
            stop.wait(max(0.0, interval_s - (time.monotonic() - began)))
