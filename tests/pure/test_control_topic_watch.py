"""The control topic's watch judges its checks' answers by kafka_evidence's rules: only the
broker's word that the topic is not there, said twice, makes it GONE; another topic id
makes it RECREATED, once; a refusal, no answer or an old incarnation's id is UNKNOWN."""

from __future__ import annotations

import pytest

from emitter.control_topic_watch import (
    ControlTopicFindings,
    ControlTopicWatch,
    TopicAnswer,
    TopicIdentity,
    Verdict,
)

SAME, GONE, RECREATED, UNKNOWN = Verdict.SAME, Verdict.GONE, Verdict.RECREATED, Verdict.UNKNOWN
MISSING = TopicAnswer(missing=True)
REFUSED = TopicAnswer(missing=None, unanswered="TOPIC_AUTHORIZATION_FAILED")
NO_ANSWER = TopicAnswer(missing=None, unanswered="no answer within 5s")


def described(
    topic_id: str = "A", partitions: int = 1, policy: str | None = "compact"
) -> TopicAnswer:
    return TopicAnswer(
        missing=False,
        topic_id=topic_id,
        partitions=partitions,
        cleanup_policy=policy,
        retention_ms=604_800_000 if policy is not None else None,
    )


def verdicts(*answers: TopicAnswer) -> tuple[list[Verdict], ControlTopicFindings]:
    identity = TopicIdentity(ControlTopicFindings("ctl"))
    return [identity.judge(answer) for answer in answers], identity.findings


def test_the_topic_as_first_described_is_the_emitters() -> None:
    said, findings = verdicts(described(), described())
    assert said == [SAME, SAME]
    assert findings.as_status() == {
        "name": "ctl",
        "present": True,
        "topic_id": "A",
        "partitions": 1,
        "cleanup_policy": "compact",
        "compacted": True,
        "retention_ms": 604_800_000,
        "recreations": 0,
        "last_check": "same",
        "unanswered": None,
    }


def test_another_topic_id_is_a_topic_made_again_said_once() -> None:
    said, findings = verdicts(described("A"), described("B", policy="delete"), described("B"))
    assert said == [SAME, RECREATED, SAME]
    assert (findings.topic_id, findings.recreations) == ("B", 1)
    assert findings.cleanup_policy == "compact"  # the last answer's


def test_gone_only_when_the_broker_says_so_twice_in_a_row() -> None:
    said, findings = verdicts(described(), MISSING, MISSING, MISSING)
    assert said == [SAME, UNKNOWN, GONE, GONE]
    # Counted once per loss, not once per check; nothing of the old topic stands.
    assert (findings.present, findings.topic_id, findings.partitions) == (False, None, None)
    assert findings.recreations == 1


@pytest.mark.parametrize("silence", [REFUSED, NO_ANSWER])
def test_a_refusal_or_no_answer_is_not_an_absence(silence: TopicAnswer) -> None:
    said, findings = verdicts(described(), silence, silence)
    assert said == [SAME, UNKNOWN, UNKNOWN]
    assert findings.present is True  # the last answer stands
    assert findings.unanswered == silence.unanswered


def test_no_answer_between_two_absences_leaves_the_count() -> None:
    said, _ = verdicts(described(), MISSING, NO_ANSWER, MISSING)
    assert said == [SAME, UNKNOWN, UNKNOWN, GONE]


def test_an_answer_between_two_absences_starts_the_count_again() -> None:
    said, _ = verdicts(described(), MISSING, described(), MISSING)
    assert said == [SAME, UNKNOWN, SAME, UNKNOWN]


def test_an_old_incarnations_id_is_a_stale_answer() -> None:
    """Kafka never gives an id twice: a broker behind on metadata answers the old one."""
    said, findings = verdicts(described("A"), described("B"), described("A"))
    assert said == [SAME, RECREATED, UNKNOWN]
    assert findings.topic_id == "B"
    said, _ = verdicts(described("A"), MISSING, MISSING, described("A"))
    assert said == [SAME, UNKNOWN, GONE, UNKNOWN]


def test_after_gone_the_topic_that_appears_is_taken_as_it_is() -> None:
    """The loss was said (GONE); the emitter writes its state to whatever stands there
    now, its own re-creation or another's."""
    said, findings = verdicts(described("A"), MISSING, MISSING, described("B"), described("B"))
    assert said == [SAME, UNKNOWN, GONE, SAME, SAME]
    assert (findings.present, findings.topic_id, findings.recreations) == (True, "B", 1)


def test_rebase_takes_the_next_id_as_the_emitters() -> None:
    identity = TopicIdentity(ControlTopicFindings("ctl"))
    assert identity.judge(described("A")) is SAME
    identity.rebase()  # written again by the emitter, or read at a start
    assert identity.judge(described("B")) is SAME
    assert identity.judge(described("C")) is RECREATED


def test_a_config_not_answered_leaves_the_last_policy() -> None:
    said, findings = verdicts(described(policy="compact"), described(policy=None))
    assert said == [SAME, SAME]
    assert (findings.cleanup_policy, findings.retention_ms) == ("compact", 604_800_000)


@pytest.mark.parametrize(
    ("policy", "compacted"),
    [("compact", True), ("compact,delete", True), ("delete", False), (None, None)],
)
def test_compacted_when_compaction_keeps_the_last_marker(
    policy: str | None, compacted: bool | None
) -> None:
    assert ControlTopicFindings("ctl", cleanup_policy=policy).compacted is compacted


class ScriptedWatch(ControlTopicWatch):
    """The watch's schedule, with answers from a script instead of the broker's."""

    def __init__(self, *answers: TopicAnswer) -> None:
        super().__init__(None, "ctl", request_timeout_s=5.0, metadata_interval_s=10.0)  # type: ignore[arg-type]
        self.answers = list(answers)
        self.asked = 0

    def ask(self) -> TopicAnswer:
        self.asked += 1
        return self.answers.pop(0)


def test_checks_at_most_once_per_metadata_interval() -> None:
    watch = ScriptedWatch(described(), described())
    assert watch.check(100.0) is SAME
    assert [watch.check(t) for t in (100.5, 105.0, 109.9)] == [None, None, None]
    assert watch.check(110.0) is SAME
    assert watch.asked == 2


def test_an_absence_told_once_is_asked_again_at_the_next_poll() -> None:
    """Rule 2 wants the word twice: the second look does not wait a whole interval."""
    watch = ScriptedWatch(described(), MISSING, MISSING, MISSING)
    assert watch.check(100.0) is SAME
    assert watch.check(110.0) is UNKNOWN
    assert watch.check(110.2) is GONE
    assert watch.check(110.4) is None  # gone: checked again one interval later
    assert watch.check(120.2) is GONE
