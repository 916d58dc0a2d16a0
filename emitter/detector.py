"""The emitter's decisions: a pure state machine of observations and time (semantics.md §4).

No Kafka here. The service feeds one :class:`Observation` per poll and gets
back the markers to publish; a marker's status counts only once the service
confirms its delivery (:meth:`Detector.published`), so a marker that could not
be delivered is proposed again by the next poll, if it is still true.

Per partition, the idle clock runs only between two successful observations (answers
taken as instant here; the next timelines show their times):

    poll      ok      ok      FAIL    FAIL    ok      ok      ok
    log end   100     100     ?       ?       100     100     100
    still     0s      1s      1s      1s      1s      2s      3s    (idle_timeout 3s)
                                                              ^ IDLE@100

    poll      ok      ok      ok
    log end   100     100     130
    status    IDLE    IDLE    ACTIVE@100   (the first new record is at 100)

An unreachable broker therefore never produces a transition.

A log end counts as seen when its answer came, not when the poll ended (issue 42).
Two equal answers prove the log still only from the first one's arrival (it may have
reached that end as late as that) to the second one's request (proven unchanged only
until then): a run of equal answers counts from the ``answered_s`` of the answer that
started it to the ``requested_s`` of the latest one (the observer's stamps around
ListOffsets). A slow answer, to any request of the poll, adds no stillness. A poll that
waited on a slow group coordinator (sent at 2.0, ended at 7.0; idle_timeout 5s):

    time (s)     0.0 0.1     1.0 1.1     2.0 2.1 ...... 7.0     8.0 8.1
    ListOffsets  req ans     req ans     req ans                req ans
    log end          100         100         100                    100
    still            0s          0.9s        1.9s (not 6.9s)        7.9s
                                                                    ^ IDLE@100

The log may have moved at 2.5: only the poll sent at 8.0 can say it has not. A slow
ListOffsets answer counts up to its own request:

    time (s)     0.0 0.1     1.0 .......... 4.0     5.0 5.1
    ListOffsets  req ans     req            ans     req ans
    log end          100                    100         100
    still            0s                     0.9s        4.9s

A new log under a partition (its topic re-created, or its log truncated: the observer's
verdict, slackwater.log_verdict) is another log: nothing known of the old one carries
over. An IDLE partition goes ACTIVE where the new log's new data starts (0 for a
re-created topic; the new end, or the IDLE's offset if lower, for a truncated log), at
its first answer on the new log, and every partition's clock, log end and highest end
start again from that answer. A re-created topic's answer of the poll that finds it is
not taken (it may be the old log's: known_ends.py), so its partitions go ACTIVE a poll
later:

    poll      ok        ok        re-created     ok (150 records)   ...idle_timeout...
    log end   100       100       (not taken)    150                150
    status    IDLE@100  IDLE      IDLE           ACTIVE@0           IDLE@150
                                                 (topic_recreated)

Work per poll follows what changed (issue 15): a partition is looked at when its log
end differs from the previous observation's, when it comes back after a gap, when
its idle deadline passes (a heap of deadlines), or when a proposal or a control
record asks for a decision (``_recheck``). A quiet partition in an unbroken run of
observations costs nothing: its still time is read off the run's start.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from emitter.known_ends import NO_NEW_LOG, NewLogs
from slackwater import kafka_evidence
from slackwater.markers import Marker, MarkerStatus, TopicPartitionKey

# Partitions held aside at most (markers for partitions the broker does not list); more
# are dropped and counted: a forged control topic cannot grow the emitter's memory.
MAX_HELD = 1_000
# Still times are differences of poll times, not sums of steps: a nanosecond of float
# rounding must not put an IDLE marker off by a whole poll.
ROUNDING_S = 1e-9


@dataclass(frozen=True)
class Observation:
    """What one poll saw.

    ``log_end_offsets`` holds the partitions whose log end was read; a watched
    partition missing from it was not observed this time (request failed).
    ``topics`` maps every watched topic that metadata showed to its partition
    count; ``None`` when the metadata request failed. ``unseen_topics``: watched topics
    it did not show though the broker did not say they are not there (refused by an
    ACL, or not answered): neither present nor deleted. ``new_logs``: the partitions and
    topics the observer found on a new log this poll (truncated, re-created).

    ``monotonic_s`` is when the log ends were answered (the observer's ``answered_s``:
    a run of equal answers counts from the first one's) and ``requested_s`` when they
    were asked for (a run counts up to the latest one's); None: at ``monotonic_s``, an
    answer as good as instant (tests, and the bench's stepped clock).
    """

    monotonic_s: float
    wall_ms: int
    log_end_offsets: Mapping[TopicPartitionKey, int]
    topics: Mapping[str, int] | None
    unseen_topics: frozenset[str] = frozenset()
    new_logs: NewLogs = NO_NEW_LOG
    requested_s: float | None = None

    @property
    def asked_s(self) -> float:
        """When the log ends were asked for: stillness is proven up to here, no further."""
        return self.monotonic_s if self.requested_s is None else self.requested_s


class Reason(enum.StrEnum):
    """Why a marker is proposed (logged, and the label of a metric)."""

    IDLE_TIMEOUT = "idle_timeout"
    LOG_END_MOVED = "log_end_moved"
    FINISH_REQUESTED = "finish_requested"
    TOPIC_DELETED = "topic_deleted"
    TOPIC_RECREATED = "topic_recreated"
    LOG_TRUNCATED = "log_truncated"


@dataclass(frozen=True)
class Proposal:
    topic: str
    partition: int
    status: MarkerStatus
    offset: int
    reason: Reason


@dataclass
class Clock:
    """The times of the detector's latest observation, shared by its partitions: when its
    log ends were asked for (``now_s``: still time is counted up to it) and when they
    were answered (``answered_s``: a run that starts with this observation starts
    there)."""

    now_s: float = 0.0
    answered_s: float = 0.0


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
    # The idle clock counts only between successful observations: the still time of
    # the runs a failed observation closed, plus the open run since ``run_started_s``
    # (None while the clock is stopped, until the next successful observation). A run
    # starts when the answer that started it came and counts up to the request of the
    # latest equal answer (the module's docstring).
    still_closed_s: float = 0.0
    run_started_s: float | None = None
    finish_requested: bool = False
    seq: int = 0
    last_marker: Marker | None = None
    # The idle deadline this partition has in the detector's heap, if any.
    deadline_s: float | None = None
    # Found IDLE on a log that is gone (re-created, truncated): the ACTIVE marker that
    # withdraws that IDLE (where the new log's new data starts, and why), proposed
    # until a marker is published.
    new_log: tuple[int, Reason] | None = None
    clock: Clock = field(default_factory=Clock, repr=False, compare=False)

    @property
    def still_s(self) -> float:
        """Seconds the log end is proven not to have moved, over successful polls only."""
        if self.run_started_s is None:
            return self.still_closed_s
        return self.still_closed_s + max(0.0, self.clock.now_s - self.run_started_s)


@dataclass
class Detector:
    """Turns observations into IDLE / ACTIVE / FINISHED proposals per partition."""

    idle_timeout_s: float
    # Metadata polls in a row that must confirm a topic gone (kafka_evidence rule 2: at
    # least TOLD_IN_A_ROW; more only delays FINISHED).
    deleted_topic_polls: int = kafka_evidence.TOLD_IN_A_ROW
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
    # The previous observation's log ends: what "changed" is measured against.
    _observed: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # Partitions to decide on at their next observation, whatever their log end does.
    _recheck: set[TopicPartitionKey] = field(default_factory=set)
    # (idle deadline, partition) of ACTIVE partitions in an unbroken run.
    _deadlines: list[tuple[float, TopicPartitionKey]] = field(default_factory=list)
    _clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        if self.deleted_topic_polls < kafka_evidence.TOLD_IN_A_ROW:
            raise ValueError(
                f"deleted_topic_polls must be at least {kafka_evidence.TOLD_IN_A_ROW} (a "
                f"topic is believed deleted only when told so {kafka_evidence.TOLD_IN_A_ROW} "
                f"times in a row), got {self.deleted_topic_polls}"
            )

    def _state(self, key: TopicPartitionKey) -> PartitionState:
        state = self.partitions.get(key)
        if state is None:
            # A partition seen for the first time is ACTIVE (what consumers assume).
            state = self.partitions[key] = PartitionState(clock=self._clock)
        return state

    def restore(self, markers: Iterable[Marker]) -> None:
        """Continues from the last marker of every partition (read back from the control topic)."""
        for marker in markers:
            key = (marker.topic, marker.partition)
            state = self._adopt(marker)
            # Until the first poll, the marker's offset is the log end we know of.
            if marker.status is not MarkerStatus.ACTIVE:
                state.log_end_offset = state.max_log_end_offset = marker.offset
            self._seen_topics.add(marker.topic)
            self._recheck.add(key)

    def request_finish(self, topic: str, partition: int) -> None:
        """A finish request: FINISHED@log_end at the next poll that sees the log end."""
        key = (topic, partition)
        state = self._state(key)
        if state.status is not MarkerStatus.FINISHED:
            state.finish_requested = True
            self._recheck.add(key)

    def observe(self, observation: Observation, watched_topics: Iterable[str]) -> list[Proposal]:
        """Updates clocks and log ends; returns the markers that should now be published."""
        proposals: list[Proposal] = []
        log_ends = observation.log_end_offsets
        if observation.topics is not None:
            proposals += self._track_topics(
                observation.topics, watched_topics, observation.unseen_topics
            )
        self._stop_unobserved_clocks(log_ends)
        # Still time is proven up to this observation's request; a run it starts, or
        # resumes, starts at its answer (a slow answer adds no stillness).
        self._clock.now_s = observation.asked_s
        self._clock.answered_s = observation.monotonic_s
        if observation.new_logs is not NO_NEW_LOG:
            self._recheck |= _seen_afresh(self.partitions, observation.new_logs, log_ends)
        proposals += self._decide_all(self._to_decide(log_ends), log_ends)
        self._observed = dict(log_ends)
        return proposals

    def _stop_unobserved_clocks(self, log_ends: Mapping[TopicPartitionKey, int]) -> None:
        """A partition not observed this time stops its clock at its last observation (the
        previous one's request): the next successful observation counts from its own
        answer, not from the gap."""
        for key in self.partitions.keys() - log_ends.keys():
            state = self.partitions[key]
            if state.run_started_s is not None:
                state.still_closed_s += max(0.0, self._clock.now_s - state.run_started_s)
                state.run_started_s = None

    def _to_decide(self, log_ends: Mapping[TopicPartitionKey, int]) -> set[TopicPartitionKey]:
        """The partitions whose log end is new since the previous observation, those asked
        for, and those whose idle deadline has passed: nothing else can change."""
        decide = {key for key, _ in log_ends.items() - self._observed.items()}
        decide |= self._recheck
        self._recheck = set()
        while self._deadlines and self._deadlines[0][0] <= self._clock.now_s + ROUNDING_S:
            deadline, key = heapq.heappop(self._deadlines)
            state = self.partitions.get(key) or self.held.get(key)
            if state is not None and state.deadline_s == deadline:
                state.deadline_s = None
                decide.add(key)
        first_seen = decide - self.partitions.keys()
        if first_seen:  # states made in the observation's order, as the partitions were listed
            for key in log_ends:
                if key in first_seen:
                    self._state(key)
        return decide

    def _decide_all(
        self, decide: set[TopicPartitionKey], log_ends: Mapping[TopicPartitionKey, int]
    ) -> list[Proposal]:
        now, answered = self._clock.now_s, self._clock.answered_s
        active = MarkerStatus.ACTIVE
        # A busy topic's common case needs no decision: an ACTIVE partition whose log end
        # moved has its still time restarted and can propose nothing (unless the idle
        # timeout is zero); its queued idle deadline is decided when it passes.
        moved_active_is_quiet = self.idle_timeout_s > ROUNDING_S
        decided: list[tuple[TopicPartitionKey, Proposal]] = []
        for key in decide:
            log_end = log_ends.get(key)
            if log_end is None:
                if key in self.partitions or key in self.held:
                    self._recheck.add(key)  # not observed: decided when it is
                continue
            state = self._state(key)
            previous = state.log_end_offset
            self._update_clock(state, log_end, answered)
            if (
                moved_active_is_quiet
                and previous is not None
                and log_end > previous
                and state.status is active
                and not state.finish_requested
                and state.deadline_s is not None
                and state.deadline_s > now + ROUNDING_S
            ):
                continue  # nothing to propose, and its idle deadline is queued already
            proposal = self._decide(key, state, log_end, now)
            if proposal is not None:
                decided.append((key, proposal))
                # Decided again next poll: proposed again until published, if still true,
                # and a partition that became ACTIVE gets its idle deadline there.
                self._recheck.add(key)
        if len(decided) > 1:  # in the observation's order, as a full pass would give them
            order = {key: index for index, key in enumerate(log_ends)}
            decided.sort(key=lambda pair: order[pair[0]])
        return [proposal for _, proposal in decided]

    @staticmethod
    def _update_clock(state: PartitionState, log_end: int, answered: float) -> None:
        previous = state.log_end_offset
        state.log_end_offset = log_end
        if state.status is MarkerStatus.FINISHED:
            return  # FINISHED is terminal: no clock, and its end is already written
        if previous is None or log_end != previous:
            # A new end: the log may have reached it as late as this answer came.
            state.still_closed_s, state.run_started_s = 0.0, answered
        elif state.run_started_s is None:
            # The clock resumes at this answer's arrival: the gap does not count.
            state.run_started_s = answered
        if state.max_log_end_offset is None or log_end > state.max_log_end_offset:
            state.max_log_end_offset = log_end

    def _decide(
        self, key: TopicPartitionKey, state: PartitionState, log_end: int, now: float
    ) -> Proposal | None:
        topic, partition = key
        if state.status is MarkerStatus.FINISHED:
            return None  # FINISHED is terminal.
        if state.finish_requested:
            return Proposal(
                topic, partition, MarkerStatus.FINISHED, log_end, Reason.FINISH_REQUESTED
            )
        if state.status is MarkerStatus.IDLE:
            if state.new_log is not None:  # an IDLE of a log that is gone: withdrawn
                offset, reason = state.new_log
                return Proposal(topic, partition, MarkerStatus.ACTIVE, offset, reason)
            if state.idle_offset is not None and log_end != state.idle_offset:
                # IDLE -> ACTIVE when the log end moves: ACTIVE@previous_log_end.
                offset = min(state.idle_offset, log_end)
                return Proposal(topic, partition, MarkerStatus.ACTIVE, offset, Reason.LOG_END_MOVED)
            return None
        still_s = state.still_s
        if still_s >= self.idle_timeout_s - ROUNDING_S:
            # ACTIVE -> IDLE when the log end has not moved for idle_timeout: IDLE@log_end.
            return Proposal(topic, partition, MarkerStatus.IDLE, log_end, Reason.IDLE_TIMEOUT)
        # Not yet: decided again at the first request by which the timeout would be
        # reached, if nothing moves (the open run's start plus what is left of it).
        start = state.run_started_s if state.run_started_s is not None else now
        deadline = start + (self.idle_timeout_s - state.still_closed_s)
        # One live heap entry per partition, kept while it is earlier than needed (it is
        # decided again when it pops); one already due is replaced (popping clears it, so
        # this only guards against a deadline left without its heap entry).
        if (
            state.deadline_s is None
            or state.deadline_s <= now + ROUNDING_S
            or deadline < state.deadline_s
        ):
            state.deadline_s = deadline
            heapq.heappush(self._deadlines, (deadline, key))
        return None

    def _track_topics(
        self, present: Mapping[str, int], watched_topics: Iterable[str], unseen: frozenset[str]
    ) -> list[Proposal]:
        proposals: list[Proposal] = []
        self.missing_topics = set()
        for topic in watched_topics:
            if topic in unseen:
                # Not seen, not gone: its partitions wait, unobserved (no clock); the
                # polls without it in a row start again. Never seen: still missing.
                self._absent_polls.pop(topic, None)
                if topic not in self._seen_topics:
                    self.missing_topics.add(topic)
                continue
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
        """Partitions come from the broker, not from markers (semantics.md §3): a state for a
        partition the metadata does not list is held aside until it is listed."""
        for key in [k for k in self.partitions if k[0] == topic and k[1] >= partition_count]:
            state = self.partitions.pop(key)
            # Its clock stops where it was last observed, as for any partition not observed.
            state.still_closed_s, state.run_started_s = state.still_s, None
            if len(self.held) < MAX_HELD:
                self.held[key] = state
            else:
                self.held_dropped += 1
        for key in [k for k in self.held if k[0] == topic and k[1] < partition_count]:
            self.partitions.setdefault(key, self.held.pop(key))

    def _adopt(self, marker: Marker) -> PartitionState:
        """A marker becomes its partition's status, whether the broker just acknowledged
        it (published) or the control topic held it at a start (restore)."""
        state = self._state((marker.topic, marker.partition))
        state.status = marker.status
        state.seq = marker.seq + 1
        state.last_marker = marker
        state.new_log = None  # a marker published since: the old log's IDLE is past
        # Only an IDLE partition has an idle offset: the ACTIVE that ends it aligns there.
        state.idle_offset = marker.offset if marker.status is MarkerStatus.IDLE else None
        return state

    def published(self, marker: Marker) -> None:
        """The broker acknowledged this marker: from now on it is the partition's status."""
        state = self._adopt(marker)
        if marker.status is MarkerStatus.ACTIVE:
            # The still time starts again from here (the latest answer's arrival); the
            # clock keeps running.
            state.still_closed_s = 0.0
            if state.run_started_s is not None:
                state.run_started_s = self._clock.answered_s
        elif marker.status is MarkerStatus.FINISHED:
            state.finish_requested = False
            state.still_closed_s, state.run_started_s = state.still_s, None  # clock stops


def _seen_afresh(
    partitions: Mapping[TopicPartitionKey, PartitionState],
    new_logs: NewLogs,
    log_ends: Mapping[TopicPartitionKey, int],
) -> set[TopicPartitionKey]:
    """A new log under these partitions: their log end, highest end and clock start
    again from the new log's first answer (FINISHED stays: it is terminal), and an IDLE
    one goes ACTIVE where the new log's new data starts. Returns those to decide."""
    keys = set(new_logs.truncated)
    if new_logs.recreated:
        keys |= {key for key in partitions if key[0] in new_logs.recreated}
    renewed: set[TopicPartitionKey] = set()
    for key in keys:
        state = partitions.get(key)
        if state is None or state.status is MarkerStatus.FINISHED:
            continue
        if state.status is MarkerStatus.IDLE:
            if key[0] in new_logs.recreated:
                state.new_log = (0, Reason.TOPIC_RECREATED)  # all of the new log is new
            else:  # truncated: an answered end, and the records below it still stand
                end = log_ends[key]
                if state.idle_offset is not None:
                    end = min(end, state.idle_offset)
                state.new_log = (end, Reason.LOG_TRUNCATED)
        state.log_end_offset = state.max_log_end_offset = None
        state.still_closed_s, state.run_started_s = 0.0, None
        renewed.add(key)
    return renewed
