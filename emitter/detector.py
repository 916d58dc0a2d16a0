"""The emitter's decisions: a pure state machine of observations and time (DESIGN §4).

No Kafka here. The service feeds one :class:`Observation` per poll and gets
back the markers to publish; a marker's status counts only once the service
confirms its delivery (:meth:`Detector.published`), so a marker that could not
be delivered is proposed again by the next poll, if it is still true.

Per partition, the idle clock runs only between two successful observations:

    poll      ok      ok      FAIL    FAIL    ok      ok      ok
    log end   100     100     ?       ?       100     100     100
    still     0s      1s      1s      1s      1s      2s      3s    (idle_timeout 3s)
                                                              ^ IDLE@100

    poll      ok      ok      ok
    log end   100     100     130
    status    IDLE    IDLE    ACTIVE@100   (the first new record is at 100)

An unreachable broker therefore never produces a transition.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from emitter.markers import Marker, MarkerStatus

TopicPartitionKey = tuple[str, int]
# Partitions held aside at most (markers for partitions the broker does not list); more
# are dropped and counted: a forged control topic cannot grow the emitter's memory.
MAX_HELD = 1_000


@dataclass(frozen=True)
class Observation:
    """What one poll saw.

    ``log_end_offsets`` holds the partitions whose log end was read; a watched
    partition missing from it was not observed this time (request failed).
    ``topics`` maps every watched topic that metadata showed to its partition
    count; ``None`` when the metadata request failed.
    """

    monotonic_s: float
    wall_ms: int
    log_end_offsets: Mapping[TopicPartitionKey, int]
    topics: Mapping[str, int] | None


class Reason(enum.StrEnum):
    """Why a marker is proposed (logged, and the label of a metric)."""

    IDLE_TIMEOUT = "idle_timeout"
    LOG_END_MOVED = "log_end_moved"
    FINISH_REQUESTED = "finish_requested"
    TOPIC_DELETED = "topic_deleted"


@dataclass(frozen=True)
class Proposal:
    topic: str
    partition: int
    status: MarkerStatus
    offset: int
    reason: Reason


@dataclass
class PartitionState:
    """What the emitter knows of one partition."""

    status: MarkerStatus = MarkerStatus.ACTIVE
    # Offset of the last IDLE marker: the ACTIVE marker that ends the idleness
    # is aligned to it (new data starts where nothing was).
    idle_offset: int | None = None
    log_end_offset: int | None = None
    # Highest log end ever seen: where a deleted topic's partition ends. (Between
    # a deletion and the metadata that shows it, a broker may answer ListOffsets
    # for the topic's next incarnation, or with 0.)
    max_log_end_offset: int | None = None
    # Seconds the log end has not moved, counted over successful polls only.
    still_s: float = 0.0
    last_observed_s: float | None = None
    last_moved_wall_ms: int | None = None
    finish_requested: bool = False
    seq: int = 0
    last_marker: Marker | None = None


@dataclass
class Detector:
    """Turns observations into IDLE / ACTIVE / FINISHED proposals per partition."""

    idle_timeout_s: float
    deleted_topic_polls: int = 3
    partitions: dict[TopicPartitionKey, PartitionState] = field(default_factory=dict)
    # Successful metadata polls in a row that did not show a topic we had seen.
    _absent_polls: dict[str, int] = field(default_factory=dict)
    _seen_topics: set[str] = field(default_factory=set)
    missing_topics: set[str] = field(default_factory=set)
    # Partitions known only from the control topic (a marker, a finish request) that
    # the broker's metadata does not list: kept aside, never proposed for, and taken
    # back if the partition appears (create_partitions). Bounded: see MAX_HELD.
    held: dict[TopicPartitionKey, PartitionState] = field(default_factory=dict)
    held_dropped: int = 0

    def restore(self, markers: Iterable[Marker]) -> None:
        """Continues from the last marker of every partition (read back from the control topic)."""
        for marker in markers:
            state = self.partitions.setdefault((marker.topic, marker.partition), PartitionState())
            state.status = marker.status
            state.seq = marker.seq + 1
            state.last_marker = marker
            state.idle_offset = marker.offset if marker.status is MarkerStatus.IDLE else None
            # Until the first poll, the marker's offset is the log end we know of.
            if marker.status is not MarkerStatus.ACTIVE:
                state.log_end_offset = state.max_log_end_offset = marker.offset
            self._seen_topics.add(marker.topic)

    def request_finish(self, topic: str, partition: int) -> None:
        """A finish request: FINISHED@log_end at the next poll that sees the log end."""
        state = self.partitions.setdefault((topic, partition), PartitionState())
        if state.status is not MarkerStatus.FINISHED:
            state.finish_requested = True

    def observe(self, observation: Observation, watched_topics: Iterable[str]) -> list[Proposal]:
        """Updates clocks and log ends; returns the markers that should now be published."""
        proposals: list[Proposal] = []
        now = observation.monotonic_s
        if observation.topics is not None:
            proposals += self._track_topics(observation.topics, watched_topics)
        for key, log_end in observation.log_end_offsets.items():
            state = self.partitions.get(key)
            if state is None:
                # A partition seen for the first time is ACTIVE (what consumers assume).
                state = self.partitions[key] = PartitionState()
            proposal = self._observe_partition(key, state, log_end, observation.wall_ms, now)
            if proposal is not None:
                proposals.append(proposal)
        # A partition not observed this time keeps its clock stopped: the next
        # successful observation starts counting from there, not from the gap.
        for key, state in self.partitions.items():
            if key not in observation.log_end_offsets:
                state.last_observed_s = None
        return proposals

    def _observe_partition(
        self,
        key: TopicPartitionKey,
        state: PartitionState,
        log_end: int,
        wall_ms: int,
        now: float,
    ) -> Proposal | None:
        topic, partition = key
        if state.status is MarkerStatus.FINISHED:
            state.log_end_offset = log_end
            return None  # FINISHED is terminal.
        previous = state.log_end_offset
        moved = previous is not None and log_end != previous
        if previous is None or moved:
            state.still_s = 0.0
            state.last_moved_wall_ms = wall_ms
        elif state.last_observed_s is not None:
            state.still_s += max(0.0, now - state.last_observed_s)
        state.log_end_offset = log_end
        if state.max_log_end_offset is None or log_end > state.max_log_end_offset:
            state.max_log_end_offset = log_end
        state.last_observed_s = now
        if state.finish_requested:
            return Proposal(
                topic, partition, MarkerStatus.FINISHED, log_end, Reason.FINISH_REQUESTED
            )
        if state.status is MarkerStatus.IDLE:
            if state.idle_offset is not None and log_end != state.idle_offset:
                # IDLE -> ACTIVE when the log end moves: ACTIVE@previous_log_end.
                offset = min(state.idle_offset, log_end)
                return Proposal(topic, partition, MarkerStatus.ACTIVE, offset, Reason.LOG_END_MOVED)
            return None
        if state.still_s >= self.idle_timeout_s:
            # ACTIVE -> IDLE when the log end has not moved for idle_timeout: IDLE@log_end.
            return Proposal(topic, partition, MarkerStatus.IDLE, log_end, Reason.IDLE_TIMEOUT)
        return None

    def _track_topics(
        self, present: Mapping[str, int], watched_topics: Iterable[str]
    ) -> list[Proposal]:
        proposals: list[Proposal] = []
        self.missing_topics = set()
        for topic in watched_topics:
            if topic in present:
                self._seen_topics.add(topic)
                self._absent_polls.pop(topic, None)
                self._hold_unlisted(topic, present[topic])
                continue
            if topic not in self._seen_topics:
                self.missing_topics.add(topic)  # not created yet: retried every poll
                continue
            absent = self._absent_polls.get(topic, 0) + 1
            self._absent_polls[topic] = absent
            if absent < self.deleted_topic_polls:
                continue
            # A deleted topic's partitions become FINISHED@last known log end.
            for (state_topic, partition), state in self.partitions.items():
                if (
                    state_topic == topic
                    and state.status is not MarkerStatus.FINISHED
                    and state.max_log_end_offset is not None
                ):
                    proposals.append(
                        Proposal(
                            topic,
                            partition,
                            MarkerStatus.FINISHED,
                            state.max_log_end_offset,
                            Reason.TOPIC_DELETED,
                        )
                    )
        return proposals

    def _hold_unlisted(self, topic: str, partition_count: int) -> None:
        """Partitions come from the broker, not from markers (DESIGN §3): a state for a
        partition the metadata does not list is held aside until it is listed."""
        for key in [k for k in self.partitions if k[0] == topic and k[1] >= partition_count]:
            state = self.partitions.pop(key)
            if len(self.held) < MAX_HELD:
                self.held[key] = state
            else:
                self.held_dropped += 1
        for key in [k for k in self.held if k[0] == topic and k[1] < partition_count]:
            self.partitions.setdefault(key, self.held.pop(key))

    def published(self, marker: Marker) -> None:
        """The broker acknowledged this marker: from now on it is the partition's status."""
        state = self.partitions.setdefault((marker.topic, marker.partition), PartitionState())
        state.status = marker.status
        state.seq = marker.seq + 1
        state.last_marker = marker
        if marker.status is MarkerStatus.IDLE:
            state.idle_offset = marker.offset
        elif marker.status is MarkerStatus.ACTIVE:
            state.idle_offset = None
            state.still_s = 0.0
        else:
            state.finish_requested = False
