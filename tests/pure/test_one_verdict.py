"""One verdict per Kafka event (issue 41): the emitter (``emitter/known_ends.py``) and the
source's planner (``spark_consumer/source/driver/partition_identity.py``) each judge
Kafka's answers through ``slackwater.log_verdict``, in their own way (the emitter keeps
the highest end seen, the planner its read position and the highest end seen; the
planner reads a new log again from its start). Fed the same sequences of answers, they
must give the same verdict at every step.

The answers come from a model of one partition's life written from Kafka's behaviour
(docs/semantics.md, "Kafka's evidence"), not from either side: its log grows, its
leader changes (a newer epoch), an unclean election truncates it (a newer epoch, a lower
end), its topic is re-created (a new id, epoch 0), a deposed leader answers from an old
log (an older epoch), the epoch goes unanswered. A DescribeTopics left unanswered is
each side's to follow (each stands still where it matters to it: the planner whenever
it has records to plan, the emitter where an answer changed):
tests/pure/test_partition_identity.py and tests/pure/test_known_ends.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.known_ends import KnownEnds
from spark_consumer.source.driver.partition_identity import PartitionIdentity
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.shared.options import SourceOptions

KEY = ("t", 0)


@dataclass
class Log:
    """The partition as Kafka holds it, and the answers its leaders have given."""

    end: int = 10
    epoch: int = 0
    topic_id: str = "id0"
    # (end, epoch) answers given before: a deposed leader may answer one again.
    history: list[tuple[int, int]] = field(default_factory=list)

    def answered(self) -> tuple[int, int]:
        self.history.append((self.end, self.epoch))
        return self.end, self.epoch


EVENTS = st.sampled_from(["grow", "leader", "truncate", "recreate", "stale", "same"])


@st.composite
def lives(draw: st.DrawFn) -> list[tuple[int, int | None, str]]:
    """A sequence of answers (log end, leader epoch, topic id; an epoch None: not given)."""
    log, answers = Log(), list[tuple[int, int | None, str]]()
    for event in draw(st.lists(EVENTS, min_size=1, max_size=25)):
        if event == "grow":
            log.end += draw(st.integers(1, 20))
        elif event == "leader":
            log.epoch += 1
        elif event == "truncate" and log.end > 0:
            log.end = draw(st.integers(0, log.end - 1))
            log.epoch += 1
        elif event == "recreate":
            log = Log(draw(st.integers(0, 60)), 0, f"id{len(answers) + 1}", log.history)
        if event == "stale" and log.history:
            end, epoch = draw(st.sampled_from(log.history))
        else:
            end, epoch = log.answered()
        answers.append(
            (
                end,
                epoch if draw(st.booleans()) or event == "truncate" else None,
                log.topic_id,  # (a DescribeTopics unanswered: each side's own tests)
            )
        )
    return answers


def _emitter_verdict(known: KnownEnds, end: int, epoch: int | None, topic_id: str) -> str:
    """As the observer drives it, the topic's id asked and answered (when each side asks
    is its own: the emitter when an answer changed, the planner also when it has records
    to plan; the same answers are what this test compares)."""
    answers, epochs = {KEY: end}, {KEY: epoch} if epoch is not None else {}
    changed = known.changed(answers, epochs)
    ids = {"t": topic_id} if topic_id else {}
    new_logs = known.believed(answers, epochs, changed, ["t"], ids)
    if "t" in new_logs.recreated:
        return "recreated"
    if KEY in new_logs.truncated:
        return "truncated"
    return "taken" if KEY in answers else "stale"


@dataclass
class Planner:
    """The planner's judge as ``topic_partitions.follow`` drives it: a partition whose
    log is new is read again from its start (0 here), any other reads to the end taken."""

    identity: PartitionIdentity
    position: int = 10

    def verdict(self, end: int, epoch: int | None, topic_id: str) -> str:
        epochs = {KEY: epoch} if epoch is not None else {}
        ids = {"t": topic_id} if topic_id else {}
        now = PlanAnswers({"t": 1}, frozenset({"t"}), {KEY: end}, {}, epochs, None, ids)
        self.identity.learn(now)  # (the id asked and answered, as the emitter's)
        ids_before = dict(self.identity.topic_ids)
        went_back = self.identity.went_back({"t": {"0": self.position}}, now)
        lost = self.identity.take_records_lost()
        if KEY in went_back:
            self.position = 0  # read again from its earliest offset
            self.identity.started_again(KEY)
            return "recreated" if self.identity.topic_ids != ids_before else "truncated"
        if lost:
            # Truncated past the position: read on, the records seen past the new end lost.
            self.position = max(self.position, now.latest[KEY])
            return "truncated"
        if KEY not in now.latest:
            return "stale"
        self.position = max(self.position, now.latest[KEY])
        return "taken"


def _planner() -> Planner:
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "failOnDataLoss": "false"}
    )
    return Planner(PartitionIdentity(options, lambda topic: None))


@settings(max_examples=300, deadline=None)
@given(lives())
def test_the_emitter_and_the_planner_give_the_same_verdict_on_the_same_answers(
    answers: list[tuple[int, int | None, str]],
) -> None:
    known, planner = KnownEnds(), _planner()
    # Both first see the log at 10, in epoch 0, under its first id.
    first = (10, 0, "id0")
    assert _emitter_verdict(known, *first) == planner.verdict(*first) == "taken"
    for step, (end, epoch, topic_id) in enumerate(answers):
        emitter, source = (
            _emitter_verdict(known, end, epoch, topic_id),
            planner.verdict(end, epoch, topic_id),
        )
        assert emitter == source, (step, (end, epoch, topic_id), emitter, source)
