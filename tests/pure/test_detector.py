"""The emitter's pure state machine (semantics.md §4): observations and time in, markers out.

Each test asserts the exact proposals after every poll, and that nothing else
is proposed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.config import EmitterConfig
from emitter.detector import Detector, Observation, Proposal, Reason
from emitter.known_ends import NewLogs
from slackwater import kafka_evidence
from slackwater.markers import Marker, MarkerStatus
from slackwater.settings import ConfigError, load_config
from tests.harness.factories import marker, run_cli

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED
T = "orders"


def obs(
    at_s: float,
    offsets: dict[int, int] | None,
    topics: dict[str, int] | None = None,
) -> Observation:
    """An observation at ``at_s``; ``offsets=None`` is a failed poll."""
    log_ends = {(T, p): o for p, o in (offsets or {}).items()}
    if topics is None and offsets is not None:
        topics = {T: max(offsets, default=-1) + 1}
    return Observation(
        monotonic_s=at_s, wall_ms=int(at_s * 1000), log_end_offsets=log_ends, topics=topics
    )


def run(detector: Detector, observation: Observation) -> list[Proposal]:
    """Observes, then confirms every proposal as the service does after delivery."""
    proposals = detector.observe(observation, [T])
    for proposal in proposals:
        state = detector.partitions[(proposal.topic, proposal.partition)]
        detector.published(
            marker(proposal.partition, proposal.status, proposal.offset, seq=state.seq)
        )
    return proposals


def P(partition: int, status: MarkerStatus, offset: int, reason: Reason) -> Proposal:  # noqa: N802
    return Proposal(T, partition, status, offset, reason)


def test_new_partition_is_active_without_a_marker() -> None:
    detector = Detector(idle_timeout_s=3)
    assert run(detector, obs(0, {0: 5})) == []
    assert detector.partitions[(T, 0)].status is ACTIVE


def test_idle_after_idle_timeout_without_log_end_movement_at_log_end() -> None:
    detector = Detector(idle_timeout_s=3)
    assert run(detector, obs(0, {0: 100})) == []
    assert run(detector, obs(1, {0: 100})) == []
    assert run(detector, obs(2, {0: 100})) == []
    assert run(detector, obs(3, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]
    assert run(detector, obs(4, {0: 100})) == []  # no duplicate


def test_movement_resets_the_idle_clock() -> None:
    detector = Detector(idle_timeout_s=3)
    run(detector, obs(0, {0: 100}))
    run(detector, obs(2, {0: 100}))
    assert run(detector, obs(2.5, {0: 101})) == []
    assert run(detector, obs(5, {0: 101})) == []
    assert run(detector, obs(5.5, {0: 101})) == [P(0, IDLE, 101, Reason.IDLE_TIMEOUT)]


def test_active_at_previous_log_end_when_log_end_moves() -> None:
    detector = Detector(idle_timeout_s=1)
    run(detector, obs(0, {0: 100}))
    assert run(detector, obs(1, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]
    assert run(detector, obs(2, {0: 130})) == [P(0, ACTIVE, 100, Reason.LOG_END_MOVED)]
    assert run(detector, obs(2.5, {0: 130})) == []
    assert run(detector, obs(3, {0: 130})) == [P(0, IDLE, 130, Reason.IDLE_TIMEOUT)]


def test_idle_clock_stops_while_polls_fail() -> None:
    """The docstring's timeline: failed polls add nothing to the still time."""
    detector = Detector(idle_timeout_s=3)
    assert run(detector, obs(0, {0: 100})) == []
    assert run(detector, obs(1, {0: 100})) == []
    assert run(detector, obs(2, None)) == []
    assert run(detector, obs(30, None)) == []
    assert run(detector, obs(31, {0: 100})) == []  # the gap 1s..31s does not count
    assert detector.partitions[(T, 0)].still_s == 1.0
    assert run(detector, obs(32, {0: 100})) == []
    assert run(detector, obs(33, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_partial_failure_stops_only_the_unobserved_partitions_clock() -> None:
    detector = Detector(idle_timeout_s=2)
    run(detector, obs(0, {0: 10, 1: 20}))
    run(detector, obs(1, {0: 10}, topics={T: 2}))  # partition 1 not read
    assert run(detector, obs(2, {0: 10, 1: 20})) == [P(0, IDLE, 10, Reason.IDLE_TIMEOUT)]
    assert detector.partitions[(T, 1)].still_s == 0.0
    assert run(detector, obs(4, {0: 10, 1: 20})) == [P(1, IDLE, 20, Reason.IDLE_TIMEOUT)]


def test_unconfirmed_marker_is_proposed_again_and_status_unchanged() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.observe(obs(0, {0: 7}), [T])
    proposals = detector.observe(obs(1, {0: 7}), [T])
    assert proposals == [P(0, IDLE, 7, Reason.IDLE_TIMEOUT)]
    assert detector.partitions[(T, 0)].status is ACTIVE  # not delivered: not the status
    assert detector.observe(obs(2, {0: 7}), [T]) == proposals


def test_unconfirmed_idle_is_dropped_when_data_arrives_meanwhile() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.observe(obs(0, {0: 7}), [T])
    assert detector.observe(obs(1, {0: 7}), [T]) != []
    assert detector.observe(obs(2, {0: 8}), [T]) == []  # no IDLE@7 any more: data came


def test_finish_request_gives_finished_at_log_end_and_nothing_after() -> None:
    detector = Detector(idle_timeout_s=1)
    run(detector, obs(0, {0: 50}))
    detector.request_finish(T, 0)
    assert run(detector, obs(0.5, {0: 52})) == [P(0, FINISHED, 52, Reason.FINISH_REQUESTED)]
    assert run(detector, obs(5, {0: 52})) == []
    assert run(detector, obs(6, {0: 90})) == []
    detector.request_finish(T, 0)
    assert run(detector, obs(7, {0: 90})) == []


def test_finish_request_waits_for_an_observation() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.request_finish(T, 3)
    assert run(detector, obs(0, None)) == []
    assert run(detector, obs(1, {3: 4})) == [P(3, FINISHED, 4, Reason.FINISH_REQUESTED)]


def test_finish_from_idle() -> None:
    detector = Detector(idle_timeout_s=1)
    run(detector, obs(0, {0: 5}))
    assert run(detector, obs(1, {0: 5})) == [P(0, IDLE, 5, Reason.IDLE_TIMEOUT)]
    detector.request_finish(T, 0)
    assert run(detector, obs(2, {0: 5})) == [P(0, FINISHED, 5, Reason.FINISH_REQUESTED)]


def test_deleted_topic_finishes_its_partitions_after_consecutive_absent_polls() -> None:
    detector = Detector(idle_timeout_s=100, deleted_topic_polls=2)
    run(detector, obs(0, {0: 3, 1: 9}))
    assert run(detector, obs(1, {}, topics={})) == []  # one absent poll: maybe a glitch
    assert run(detector, obs(2, {0: 3, 1: 9})) == []  # back: the count starts over
    assert run(detector, obs(3, {}, topics={})) == []
    assert run(detector, obs(4, {}, topics={})) == [
        P(0, FINISHED, 3, Reason.TOPIC_DELETED),
        P(1, FINISHED, 9, Reason.TOPIC_DELETED),
    ]
    assert run(detector, obs(5, {}, topics={})) == []


def test_failed_metadata_never_counts_as_deletion() -> None:
    detector = Detector(idle_timeout_s=100)
    run(detector, obs(0, {0: 3}))
    for at in range(1, 5):
        assert detector.observe(Observation(at, at * 1000, {}, None), [T]) == []


def test_a_topic_the_broker_would_not_describe_is_neither_present_nor_deleted() -> None:
    """An ACL taken away hides a topic from metadata as a deletion would: only a topic
    the broker says is not there counts towards deletion (FINISHED is for good)."""
    detector = Detector(idle_timeout_s=3)
    run(detector, obs(0, {0: 3}))
    unseen = frozenset({T})
    for at in range(1, 10):  # past the idle timeout, many times the deletion count
        assert run(detector, Observation(at, at * 1000, {}, {}, unseen_topics=unseen)) == []
    assert detector.missing_topics == set()  # not "not created yet" either
    # Seen again: its clock counts from there (the unseen polls were no observation).
    assert run(detector, obs(10, {0: 3})) == []
    assert run(detector, obs(12, {0: 3})) == []
    assert run(detector, obs(13, {0: 3})) == [P(0, IDLE, 3, Reason.IDLE_TIMEOUT)]


def test_an_unseen_poll_breaks_a_run_of_absent_polls() -> None:
    """Deletion needs ``deleted_topic_polls`` confirmed absences in a row."""
    detector = Detector(idle_timeout_s=100, deleted_topic_polls=2)
    run(detector, obs(0, {0: 3}))
    unseen = Observation(2, 2000, {}, {}, unseen_topics=frozenset({T}))
    assert run(detector, obs(1, {}, topics={})) == []
    assert run(detector, unseen) == []
    assert run(detector, obs(3, {}, topics={})) == []  # one in a row again
    assert run(detector, obs(4, {}, topics={})) == [P(0, FINISHED, 3, Reason.TOPIC_DELETED)]


def test_a_topic_never_seen_and_refused_stays_missing() -> None:
    detector = Detector(idle_timeout_s=1)
    unseen = Observation(0, 0, {}, {}, unseen_topics=frozenset({T}))
    assert run(detector, unseen) == []
    assert detector.missing_topics == {T}


def test_topic_not_created_yet_is_missing_then_tracked() -> None:
    detector = Detector(idle_timeout_s=1)
    assert run(detector, obs(0, {}, topics={})) == []
    assert detector.missing_topics == {T}
    assert run(detector, obs(1, {0: 0, 1: 0})) == []
    assert detector.missing_topics == set()
    assert set(detector.partitions) == {(T, 0), (T, 1)}


def test_partition_added_to_a_topic_is_tracked() -> None:
    detector = Detector(idle_timeout_s=1)
    run(detector, obs(0, {0: 5, 1: 5}))
    assert run(detector, obs(0.5, {0: 6, 1: 6, 2: 0})) == []
    assert detector.partitions[(T, 2)].status is ACTIVE
    assert run(detector, obs(1.5, {0: 6, 1: 6, 2: 0})) == [
        P(0, IDLE, 6, Reason.IDLE_TIMEOUT),
        P(1, IDLE, 6, Reason.IDLE_TIMEOUT),
        P(2, IDLE, 0, Reason.IDLE_TIMEOUT),
    ]


# A log end counts as seen when its answer came (issue 42, finding 1): a run of equal
# answers is still from the first one's answer to the latest one's request.


def answered(requested_s: float, answered_s: float, offsets: dict[int, int] | None) -> Observation:
    """An observation whose log ends were asked for at ``requested_s`` and answered at
    ``answered_s``."""
    return dataclasses.replace(obs(answered_s, offsets), requested_s=requested_s)


def test_a_run_of_equal_answers_is_still_from_the_first_answers_arrival() -> None:
    """The log may have reached 100 as late as the first answer came (2.0, asked at 0):
    the still time is counted from there, so IDLE comes with the request at 5.0."""
    detector = Detector(idle_timeout_s=3)
    assert run(detector, answered(0, 2, {0: 100})) == []
    assert run(detector, answered(4.5, 4.6, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == 2.5
    assert run(detector, answered(5, 5.1, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_a_run_is_still_only_up_to_the_latest_equal_answers_request() -> None:
    """An answer proves the log unchanged only until it was asked for: answered at 9 to a
    request sent at 2, it proves 2 s of stillness, not 9."""
    detector = Detector(idle_timeout_s=3)
    assert run(detector, answered(0, 0, {0: 100})) == []
    assert run(detector, answered(2, 9, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == 2.0
    assert run(detector, answered(10, 10, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_a_slow_answer_adds_no_stillness() -> None:
    """The docstring's timeline: the poll sent at 2.0 waited on a slow group coordinator
    and ended at 7.0; its log end was answered at 2.1. Still 1.9 s, not 6.9 s: no IDLE
    until the poll sent at 8.0 says the log has not moved (it may have at 2.5)."""
    detector = Detector(idle_timeout_s=5)
    assert run(detector, answered(0.0, 0.1, {0: 100})) == []
    assert run(detector, answered(1.0, 1.1, {0: 100})) == []
    assert run(detector, answered(2.0, 2.1, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == pytest.approx(1.9)
    assert run(detector, answered(8.0, 8.1, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_a_slow_list_offsets_answer_counts_up_to_its_own_request() -> None:
    """The docstring's second timeline: asked at 1.0, answered at 4.0."""
    detector = Detector(idle_timeout_s=5)
    assert run(detector, answered(0.0, 0.1, {0: 100})) == []
    assert run(detector, answered(1.0, 4.0, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == pytest.approx(0.9)
    assert run(detector, answered(5.0, 5.1, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == pytest.approx(4.9)
    assert run(detector, answered(5.1, 5.2, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_after_a_gap_the_clock_resumes_at_the_next_answers_arrival() -> None:
    """A failed poll closes the run at the last answer's request (1.0); the next answer
    (asked at 10, answered at 12) resumes it from 12, not from 10."""
    detector = Detector(idle_timeout_s=3)
    assert run(detector, answered(0, 0, {0: 100})) == []
    assert run(detector, answered(1, 1.5, {0: 100})) == []
    assert run(detector, answered(2, 6, None)) == []
    assert run(detector, answered(10, 12, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == 1.0
    assert run(detector, answered(13.5, 13.5, {0: 100})) == []
    assert detector.partitions[(T, 0)].still_s == 2.5
    assert run(detector, answered(14, 14, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_an_active_published_starts_the_still_time_again_at_the_latest_answer() -> None:
    """An ACTIVE delivered a poll after it was proposed (asked at 3, answered at 5):
    the new ACTIVE period is still from that answer, 5, not from its request."""
    detector = Detector(idle_timeout_s=2)
    run(detector, answered(0, 0, {0: 100}))
    assert run(detector, answered(2, 2, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]
    moved = P(0, ACTIVE, 100, Reason.LOG_END_MOVED)
    assert detector.observe(answered(2.5, 2.5, {0: 101}), [T]) == [moved]  # not delivered
    assert run(detector, answered(3, 5, {0: 101})) == [moved]
    assert run(detector, answered(6.5, 6.5, {0: 101})) == []
    assert detector.partitions[(T, 0)].still_s == 1.5
    assert run(detector, answered(7, 7, {0: 101})) == [P(0, IDLE, 101, Reason.IDLE_TIMEOUT)]


def _marker(partition: int, status: MarkerStatus, offset: int) -> Marker:
    """A marker written by an earlier emitter (epoch 3)."""
    return marker(partition, status, offset, epoch=3, seq=4, emitter_id="old")


def test_restore_idle_continues_without_duplicate_and_activates_on_movement() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.restore([_marker(0, IDLE, 40)])
    assert run(detector, obs(0, {0: 40})) == []
    assert run(detector, obs(5, {0: 40})) == []  # still IDLE: no second IDLE@40
    assert run(detector, obs(6, {0: 41})) == [P(0, ACTIVE, 40, Reason.LOG_END_MOVED)]
    assert detector.partitions[(T, 0)].seq == 6  # continues after the restored seq 4


def test_restore_idle_then_log_end_moved_while_down() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.restore([_marker(0, IDLE, 40)])
    assert run(detector, obs(0, {0: 55})) == [P(0, ACTIVE, 40, Reason.LOG_END_MOVED)]


def test_restore_active_waits_a_full_idle_timeout() -> None:
    detector = Detector(idle_timeout_s=2)
    detector.restore([_marker(0, ACTIVE, 40)])
    assert run(detector, obs(0, {0: 60})) == []
    assert run(detector, obs(1, {0: 60})) == []
    assert run(detector, obs(2, {0: 60})) == [P(0, IDLE, 60, Reason.IDLE_TIMEOUT)]


def test_restore_finished_stays_finished() -> None:
    detector = Detector(idle_timeout_s=1)
    detector.restore([_marker(0, FINISHED, 40)])
    detector.request_finish(T, 0)
    assert run(detector, obs(0, {0: 40})) == []
    assert run(detector, obs(9, {0: 70})) == []


# A random walk of log ends and failed polls: the invariants of semantics.md §4.
walks = st.lists(
    st.tuples(st.floats(0.1, 3.0), st.one_of(st.none(), st.integers(0, 3))),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(walks, st.floats(0.5, 5.0))
def test_markers_alternate_and_are_true_of_the_log(
    walk: list[tuple[float, int | None]], idle_timeout_s: float
) -> None:
    detector = Detector(idle_timeout_s=idle_timeout_s)
    now, log_end, status = 0.0, 0, ACTIVE
    still_s, last_ok = 0.0, False
    for step_s, growth in walk:
        now += step_s
        if growth is None:  # failed poll
            proposals = run(detector, obs(now, None))
            assert proposals == []  # an unreachable broker never yields a marker
            last_ok = False
            continue
        previous = log_end
        log_end += growth
        still_s = 0.0 if growth else still_s + (step_s if last_ok else 0.0)
        last_ok = True
        proposals = run(detector, obs(now, {0: log_end}))
        assert len(proposals) <= 1
        for proposal in proposals:
            assert proposal.status is not status  # never a repeat of the current status
            if proposal.status is IDLE:
                assert proposal.offset == log_end and growth == 0
                assert still_s >= idle_timeout_s - 1e-9
            else:
                assert proposal.status is ACTIVE and growth > 0 and proposal.offset == previous
            status = proposal.status


def test_deleted_topic_finishes_at_the_highest_log_end_seen() -> None:
    detector = Detector(idle_timeout_s=100)
    run(detector, obs(0, {0: 30}))
    run(detector, obs(1, {0: 0}, topics={T: 1}))  # answered for a new incarnation, say
    assert run(detector, obs(2, {}, topics={})) == []
    assert run(detector, obs(3, {}, topics={})) == [P(0, FINISHED, 30, Reason.TOPIC_DELETED)]


def test_a_marker_for_a_partition_the_broker_does_not_list_is_held_not_marked() -> None:
    detector = Detector(idle_timeout_s=100, deleted_topic_polls=2)
    detector.restore([_marker(0, IDLE, 40), _marker(9, IDLE, 7)])
    detector.request_finish(T, 12)
    assert run(detector, obs(0, {0: 40, 1: 0, 2: 0})) == []  # metadata: 3 partitions
    assert set(detector.partitions) == {(T, 0), (T, 1), (T, 2)}
    assert set(detector.held) == {(T, 9), (T, 12)}
    # A deleted topic finishes the partitions the broker listed, none of the held ones.
    assert run(detector, obs(1, {}, topics={})) == []
    assert run(detector, obs(2, {}, topics={})) == [
        P(0, FINISHED, 40, Reason.TOPIC_DELETED),
        P(1, FINISHED, 0, Reason.TOPIC_DELETED),
        P(2, FINISHED, 0, Reason.TOPIC_DELETED),
    ]


def test_a_held_partition_is_taken_back_when_the_broker_lists_it() -> None:
    detector = Detector(idle_timeout_s=100)
    detector.restore([_marker(9, IDLE, 7)])
    assert run(detector, obs(0, {0: 1})) == []
    assert (T, 9) in detector.held
    # create_partitions: the topic now has 10; the marker's state is the partition's.
    offsets = {p: 0 for p in range(9)} | {9: 7}
    assert run(detector, obs(1, offsets)) == []  # still IDLE@7: nothing to say
    assert detector.held == {}
    assert detector.partitions[(T, 9)].status is IDLE
    assert run(detector, obs(2, offsets | {9: 8})) == [P(9, ACTIVE, 7, Reason.LOG_END_MOVED)]


def test_held_partitions_are_bounded_and_the_rest_counted() -> None:
    from emitter.detector import MAX_HELD

    detector = Detector(idle_timeout_s=1)
    detector.restore([_marker(p, IDLE, 1) for p in range(1, MAX_HELD + 6)])
    run(detector, obs(0, {0: 0}))
    assert len(detector.held) == MAX_HELD
    assert detector.held_dropped == 5


# Many partitions, partial failures, undelivered markers, finish requests, answers that
# take their time: the exact proposals of every poll against a model written from
# semantics.md §4's sentences. Times are whole seconds, so still times are exact in
# floating point.
Step = tuple[int, int, dict[int, int], bool, int | None]


@st.composite
def fleet_walks(draw: st.DrawFn) -> tuple[int, list[Step]]:
    partitions = draw(st.integers(1, 5))
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(1, 3),  # seconds from the previous answer to this request
                st.integers(0, 2),  # seconds this poll's answers took to come
                st.dictionaries(st.integers(0, partitions - 1), st.integers(0, 2)),  # growth
                st.booleans(),  # the markers of this poll are delivered
                st.one_of(st.none(), st.integers(0, partitions - 1)),  # a finish request
            ),
            max_size=40,
        )
    )
    # Which partitions each poll reads: all, some (a failed batch), none (failed poll).
    reads = draw(st.lists(st.sets(st.integers(0, partitions - 1)), min_size=len(steps)))
    return partitions, [
        (seconds, took, {p: g for p, g in growth.items() if p in read}, delivered, finish)
        for (seconds, took, growth, delivered, finish), read in zip(steps, reads, strict=False)
    ]


class StillClock:
    """The model's still time of one partition, from semantics.md §4: "measured only over
    polls that succeeded"; "a log end counts as seen at the time its answer came": a run
    of equal answers is still from the first one's answer to the latest one's request."""

    def __init__(self) -> None:
        self.closed = 0  # still time of the runs a gap closed
        self.run_from: int | None = 0  # the open run's start (None: stopped)

    def gap(self, last_asked: int) -> None:
        """Not read this poll: the run closes at the last request that read it."""
        if self.run_from is not None:
            self.closed += max(0, last_asked - self.run_from)
        self.run_from = None

    def read(self, moved: bool, asked: int, answered: int) -> int:
        """Read this poll: a new end, or a return after a gap, starts from this answer."""
        if moved:
            self.closed, self.run_from = 0, answered
        elif self.run_from is None:
            self.run_from = answered
        return self.closed + max(0, asked - self.run_from)

    def active(self, answered: int) -> None:
        """An ACTIVE published: still from zero, from the latest answer."""
        self.closed = 0
        if self.run_from is not None:
            self.run_from = answered


@settings(max_examples=400, deadline=None)
@given(fleet_walks(), st.integers(1, 6))
def test_every_poll_proposes_exactly_what_the_rules_say(
    walk: tuple[int, list[Step]], idle_timeout_s: int
) -> None:
    partitions, steps = walk
    detector = Detector(idle_timeout_s=idle_timeout_s)
    # The model: per partition the status, the last log end offset, and its still clock.
    log_end = dict.fromkeys(range(partitions), 0)
    status = dict.fromkeys(range(partitions), ACTIVE)
    idle_offset: dict[int, int] = {}
    clocks = {p: StillClock() for p in range(partitions)}
    finish_asked: set[int] = set()
    asked = answered = 0
    first = {(T, p): 0 for p in range(partitions)}
    assert detector.observe(Observation(0, 0, first, {T: partitions}), [T]) == []
    seen, read_last_poll = dict(log_end), set(range(partitions))
    for seconds, took, growth, delivered, finish in steps:
        last_asked, asked = asked, answered + seconds
        answered = asked + took
        if finish is not None:
            detector.request_finish(T, finish)
            finish_asked.add(finish)
        for p, g in growth.items():
            log_end[p] += g
        for p in read_last_poll - set(growth):
            if status[p] is not FINISHED:
                clocks[p].gap(last_asked)
        expected = []
        for p in sorted(growth):
            moved, seen[p] = log_end[p] != seen[p], log_end[p]
            if status[p] is FINISHED:
                continue  # terminal: no clock, no marker
            still = clocks[p].read(moved, asked, answered)
            if p in finish_asked:  # -> FINISHED on an explicit finish: FINISHED@log_end
                expected.append(P(p, FINISHED, log_end[p], Reason.FINISH_REQUESTED))
            elif status[p] is IDLE and log_end[p] != idle_offset[p]:
                # IDLE -> ACTIVE when the log end moves: ACTIVE@previous_log_end
                expected.append(P(p, ACTIVE, idle_offset[p], Reason.LOG_END_MOVED))
            elif status[p] is ACTIVE and still >= idle_timeout_s:
                # ACTIVE -> IDLE when the log end has not moved for idle_timeout
                expected.append(P(p, IDLE, log_end[p], Reason.IDLE_TIMEOUT))
        read_last_poll = set(growth)
        log_ends = {(T, p): log_end[p] for p in sorted(growth)}
        observation = Observation(answered, answered * 1000, log_ends, None, requested_s=asked)
        proposals = detector.observe(observation, [T])
        assert sorted(proposals, key=lambda x: x.partition) == expected
        if not delivered:
            continue  # undelivered: the status stays, and true proposals come again
        for proposal in proposals:
            p = proposal.partition
            detector.published(
                marker(p, proposal.status, proposal.offset, seq=detector.partitions[(T, p)].seq)
            )
            status[p] = proposal.status
            if proposal.status is IDLE:
                idle_offset[p] = proposal.offset
            elif proposal.status is ACTIVE:
                clocks[p].active(answered)
            else:
                finish_asked.discard(p)


@given(
    st.lists(
        st.tuples(st.sampled_from([ACTIVE, IDLE, FINISHED]), st.integers(0, 1_000)),
        min_size=1,
        max_size=6,
    )
)
def test_a_marker_published_or_restored_leaves_the_same_status_seq_and_idle_offset(
    history: list[tuple[MarkerStatus, int]],
) -> None:
    """restore (at a start) and published (after the broker's ack) adopt a marker alike:
    a partition that is not IDLE keeps no idle offset (FINISHED after IDLE included)."""
    published, restored = Detector(idle_timeout_s=5), Detector(idle_timeout_s=5)
    for seq, (status, offset) in enumerate(history):
        published.published(marker(0, status, offset, seq=seq))
    status, offset = history[-1]
    restored.restore([marker(0, status, offset, seq=len(history) - 1)])
    last = published.partitions[(T, 0)]
    again = restored.partitions[(T, 0)]
    assert (last.status, last.seq, last.last_marker, last.idle_offset) == (
        again.status,
        again.seq,
        again.last_marker,
        again.idle_offset,
    )
    assert last.idle_offset == (offset if status is IDLE else None)


# A new log under a partition (issue 41): the observer's verdict (known_ends.py,
# slackwater.log_verdict) reaches the detector as Observation.new_logs.


def new_log(
    at_s: float,
    offsets: dict[int, int],
    *,
    recreated: bool = False,
    truncated: frozenset[int] = frozenset(),
    topics: dict[str, int] | None = None,
) -> Observation:
    """An observation whose poll found ``T`` re-created, or partitions truncated."""
    logs = NewLogs(frozenset((T, p) for p in truncated), frozenset({T} if recreated else ()))
    return dataclasses.replace(obs(at_s, offsets, topics), new_logs=logs)


def _idle_at(offset: int, partitions: int = 1) -> Detector:
    """A detector whose partitions are IDLE@offset (idle timeout 3 s), at time 3."""
    detector = Detector(idle_timeout_s=3)
    run(detector, obs(0, dict.fromkeys(range(partitions), offset)))
    idle = [P(p, IDLE, offset, Reason.IDLE_TIMEOUT) for p in range(partitions)]
    assert run(detector, obs(3, dict.fromkeys(range(partitions), offset))) == idle
    return detector


def test_a_topic_recreated_past_the_old_end_withdraws_the_old_logs_idle() -> None:
    """Re-created with more records than before: IDLE@100 was of the old log. The poll
    that finds it re-created takes no answer of it (known_ends.py: it may be the old
    log's); at its first answer on the new log, ACTIVE@0 (all of the new log is new
    data), then IDLE at the new log's end after a whole idle timeout from that answer."""
    detector = _idle_at(100)
    assert run(detector, new_log(4, {}, recreated=True, topics={T: 1})) == []
    assert run(detector, obs(5, {0: 150})) == [P(0, ACTIVE, 0, Reason.TOPIC_RECREATED)]
    assert run(detector, obs(7, {0: 150})) == []
    assert run(detector, obs(8, {0: 150})) == [P(0, IDLE, 150, Reason.IDLE_TIMEOUT)]


def test_a_topic_recreated_at_the_old_end_still_withdraws_the_idle() -> None:
    """The same end in another log is not the same log (before issue 41: no marker, and
    the old IDLE@100 stood for records 0..99 of the new log)."""
    detector = _idle_at(100)
    assert run(detector, new_log(4, {}, recreated=True, topics={T: 1})) == []
    assert run(detector, obs(5, {0: 100})) == [P(0, ACTIVE, 0, Reason.TOPIC_RECREATED)]
    assert run(detector, obs(8, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_the_detector_takes_a_recreated_topics_answer_in_the_same_poll_too() -> None:
    """Should an observation carry the answer with the news (the observer's does not),
    the withdrawal is proposed at once."""
    detector = _idle_at(100)
    assert run(detector, new_log(4, {0: 150}, recreated=True)) == [
        P(0, ACTIVE, 0, Reason.TOPIC_RECREATED)
    ]
    assert run(detector, obs(7, {0: 150})) == [P(0, IDLE, 150, Reason.IDLE_TIMEOUT)]


def test_the_withdrawal_waits_for_the_partition_and_its_delivery() -> None:
    """A partition of the re-created topic is decided when it is next answered; an
    ACTIVE not delivered is proposed again, and nothing else meanwhile."""
    detector = _idle_at(100, partitions=2)
    assert run(detector, new_log(4, {}, recreated=True, topics={T: 2})) == []
    assert run(detector, obs(5, {0: 150})) == [P(0, ACTIVE, 0, Reason.TOPIC_RECREATED)]
    withdrawn = P(1, ACTIVE, 0, Reason.TOPIC_RECREATED)
    assert detector.observe(obs(6, {0: 150, 1: 100}), [T]) == [withdrawn]  # not delivered
    assert run(detector, obs(7, {0: 150, 1: 100})) == [withdrawn]
    assert detector.partitions[(T, 1)].new_log is None
    assert run(detector, obs(8, {0: 150, 1: 100})) == [P(0, IDLE, 150, Reason.IDLE_TIMEOUT)]
    assert run(detector, obs(9, {0: 150, 1: 100})) == []  # still from its ACTIVE, at 7
    assert run(detector, obs(10, {0: 150, 1: 100})) == [P(1, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_an_active_partition_of_a_recreated_topic_starts_its_clock_again() -> None:
    detector = Detector(idle_timeout_s=3)
    run(detector, obs(0, {0: 100}))
    assert run(detector, new_log(2, {}, recreated=True, topics={T: 1})) == []
    assert run(detector, obs(3, {0: 100})) == []
    assert run(detector, obs(5, {0: 100})) == []  # 5 s since the old log's 100, 2 of the new
    assert run(detector, obs(6, {0: 100})) == [P(0, IDLE, 100, Reason.IDLE_TIMEOUT)]


def test_a_recreated_topic_deleted_finishes_at_the_new_logs_end() -> None:
    """The highest end seen is the new log's: FINISHED@30 would wait for an offset the
    new log never had."""
    detector = Detector(idle_timeout_s=100)
    run(detector, obs(0, {0: 30}))
    run(detector, new_log(1, {}, recreated=True, topics={T: 1}))
    run(detector, obs(2, {0: 5}))
    assert run(detector, obs(3, {}, topics={})) == []
    assert run(detector, obs(4, {}, topics={})) == [P(0, FINISHED, 5, Reason.TOPIC_DELETED)]


def test_a_truncated_log_withdraws_an_idle_where_its_new_data_starts() -> None:
    """An unclean election cut the log from 100 to 90: new records come from 90."""
    detector = _idle_at(100, partitions=2)
    assert run(detector, new_log(4, {0: 90, 1: 100}, truncated=frozenset({0}))) == [
        P(0, ACTIVE, 90, Reason.LOG_TRUNCATED)
    ]
    assert run(detector, obs(7, {0: 90, 1: 100})) == [P(0, IDLE, 90, Reason.IDLE_TIMEOUT)]


def test_finished_stays_finished_on_a_new_log() -> None:
    detector = Detector(idle_timeout_s=3)
    detector.restore([_marker(0, FINISHED, 40)])
    assert run(detector, new_log(0, {0: 70}, recreated=True)) == []
    assert run(detector, new_log(9, {0: 10}, truncated=frozenset({0}))) == []
    assert detector.partitions[(T, 0)].status is FINISHED


def test_a_deleted_topic_needs_rule_2s_count_at_least() -> None:
    """kafka_evidence rule 2: believed missing only when told so TOLD_IN_A_ROW times in
    a row; more is allowed (a cluster whose metadata lags further), fewer is refused."""
    assert Detector(idle_timeout_s=1).deleted_topic_polls == kafka_evidence.TOLD_IN_A_ROW
    assert Detector(idle_timeout_s=1, deleted_topic_polls=5).deleted_topic_polls == 5
    with pytest.raises(ValueError, match="deleted_topic_polls must be at least 2"):
        Detector(idle_timeout_s=1, deleted_topic_polls=1)


REQUIRED = {"bootstrap_servers": "localhost:9092", "topics": ["orders"], "control_topic": "c"}


@pytest.mark.parametrize(("polls", "kept"), [(None, 2), (2, 2), (3, 3)])
def test_the_deleted_topic_count_of_a_yaml_file_is_kept_or_defaults_to_rule_2(
    tmp_path: Path, polls: int | None, kept: int
) -> None:
    """Files written before issue 41 (``deleted_topic_polls: 3``) keep working."""
    settings = tmp_path / "emitter.yaml"
    extra = "" if polls is None else f"deleted_topic_polls: {polls}\n"
    settings.write_text("bootstrap_servers: a:1\ntopics: [orders]\ncontrol_topic: c\n" + extra)
    assert load_config(EmitterConfig, {}, settings, {}).deleted_topic_polls == kept


@pytest.mark.parametrize("polls", [0, 1])
def test_a_deleted_topic_count_below_rule_2_is_refused_naming_the_field(polls: int) -> None:
    with pytest.raises(ConfigError, match="invalid config field 'deleted_topic_polls': at least 2"):
        load_config(EmitterConfig, {**REQUIRED, "deleted_topic_polls": polls}, environ={})


def test_emit_refuses_a_yaml_count_below_rule_2_in_one_line(tmp_path: Path) -> None:
    settings = tmp_path / "emitter.yaml"
    settings.write_text("bootstrap_servers: localhost:9092\ntopics: [orders]\n"
                        "control_topic: ctl\ndeleted_topic_polls: 1\n")  # fmt: skip
    result = run_cli("emit", "--config", str(settings))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "invalid config field 'deleted_topic_polls': at least 2" in result.stderr
