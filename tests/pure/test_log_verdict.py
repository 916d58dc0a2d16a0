"""The one judge of a log that changed (slackwater/log_verdict.py): one test per row of
its table, named after the row, then what each verdict loses and what is seen after it.
The rows are docs/semantics.md's rules of Kafka's evidence; the expected verdicts here
are read from those rules, not from the code."""

from __future__ import annotations

import pytest

from slackwater.log_verdict import Answer, Seen, Verdict, after, judge, lost

SEEN = Seen(end=100, leader_epoch=4, topic_id="a")


def test_another_topic_id_is_recreated_whatever_the_log_end() -> None:
    for end in (0, 50, 100, 500, None):
        assert judge(SEEN, Answer(end, 0, "b")) is Verdict.RECREATED
    # Even told missing (re-created with fewer partitions): the old log is gone.
    assert judge(SEEN, Answer(None, None, "b", missing_in_a_row=2)) is Verdict.RECREATED


def test_an_unknown_id_on_either_side_tells_nothing() -> None:
    assert judge(SEEN, Answer(120, 4, None)) is Verdict.GREW
    assert judge(Seen(100, 4, None), Answer(120, 4, "b")) is Verdict.GREW


def test_told_missing_twice_in_a_row_is_deleted() -> None:
    assert judge(SEEN, Answer(missing_in_a_row=2)) is Verdict.DELETED
    assert judge(SEEN, Answer(missing_in_a_row=3)) is Verdict.DELETED


def test_told_missing_once_is_unknown() -> None:
    assert judge(SEEN, Answer(100, 4, "a", missing_in_a_row=1)) is Verdict.UNKNOWN


@pytest.mark.parametrize("end", [None, -1001, -1, -2])
def test_no_log_end_or_an_unknown_one_is_unknown(end: int | None) -> None:
    assert judge(SEEN, Answer(end, 4, "a")) is Verdict.UNKNOWN


def test_an_older_leader_epoch_is_unknown_whatever_its_end() -> None:
    assert judge(SEEN, Answer(150, 3, "a")) is Verdict.UNKNOWN
    assert judge(SEEN, Answer(50, 3, "a")) is Verdict.UNKNOWN


def test_a_lower_end_from_a_newer_epoch_is_truncated() -> None:
    assert judge(SEEN, Answer(60, 5, "a")) is Verdict.TRUNCATED


@pytest.mark.parametrize("epoch", [4, None])
def test_a_lower_end_without_a_newer_epoch_is_unknown(epoch: int | None) -> None:
    assert judge(SEEN, Answer(60, epoch, "a")) is Verdict.UNKNOWN
    assert judge(Seen(100, None, "a"), Answer(60, 9, "a")) is Verdict.UNKNOWN


def test_the_end_seen_is_the_same_log() -> None:
    assert judge(SEEN, Answer(100, 4, "a")) is Verdict.SAME
    assert judge(SEEN, Answer(100, 6, "a")) is Verdict.SAME


def test_past_the_end_seen_or_nothing_seen_before_grew() -> None:
    assert judge(SEEN, Answer(101, 4, "a")) is Verdict.GREW
    assert judge(Seen(), Answer(0, 0, "a")) is Verdict.GREW


# ------------------------------------------------------------ what a verdict loses


def test_a_deleted_or_recreated_log_loses_what_was_seen_past_the_position() -> None:
    for verdict in (Verdict.DELETED, Verdict.RECREATED):
        assert lost(verdict, 40, SEEN, Answer(5, 0, "b")) == (40, 100)
        assert lost(verdict, 100, SEEN, Answer(5, 0, "b")) is None  # read it all


def test_a_truncated_log_loses_only_what_was_past_its_new_end_and_not_read() -> None:
    assert lost(Verdict.TRUNCATED, 40, SEEN, Answer(60, 5, "a")) == (60, 100)
    assert lost(Verdict.TRUNCATED, 80, SEEN, Answer(60, 5, "a")) == (80, 100)


@pytest.mark.parametrize("verdict", [Verdict.SAME, Verdict.GREW, Verdict.UNKNOWN])
def test_the_same_log_loses_nothing(verdict: Verdict) -> None:
    assert lost(verdict, 40, SEEN, Answer(60, 5, "a")) is None


# ------------------------------------------------------------ what is seen after


def test_a_recreated_log_is_seen_from_its_next_answer() -> None:
    """The answer that came with the new id may be the old log's (two requests)."""
    assert after(SEEN, Answer(500, 7, "b"), Verdict.RECREATED) == Seen(None, None, "b")
    assert judge(Seen(None, None, "b"), Answer(3, 0, "b")) is Verdict.GREW


def test_a_truncated_log_is_seen_afresh_from_its_answer() -> None:
    assert after(SEEN, Answer(60, 5, None), Verdict.TRUNCATED) == Seen(60, 5, "a")


def test_an_unknown_or_deleted_answer_changes_nothing_seen() -> None:
    assert after(SEEN, Answer(60, 3, "a"), Verdict.UNKNOWN) == SEEN
    assert after(SEEN, Answer(missing_in_a_row=2), Verdict.DELETED) == SEEN


def test_the_same_log_keeps_the_highest_end_and_the_newest_epoch() -> None:
    assert after(SEEN, Answer(120, 6, "a"), Verdict.GREW) == Seen(120, 6, "a")
    assert after(SEEN, Answer(100, None, "a"), Verdict.SAME) == SEEN
    assert after(Seen(), Answer(7, None, "a"), Verdict.GREW) == Seen(7, None, "a")
