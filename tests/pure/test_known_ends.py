"""The emitter's verdicts on a poll's log ends (emitter/known_ends.py): those of
slackwater.log_verdict.judge, one test per verdict; which topics' ids a poll asks (only
where an answer differs from what was seen); then the whole against judge itself, and a
re-created topic never taken for its old log."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emitter import known_ends
from emitter.known_ends import NO_NEW_LOG, KnownEnds, NewLogs
from slackwater.log_verdict import Answer, Seen, Verdict, after, judge

P0, P1 = ("t", 0), ("t", 1)
Q0 = ("u", 0)
Key = tuple[str, int]
A = {"t": "a"}  # the topics' ids, as DescribeTopics would answer them
RECREATED_T = NewLogs(recreated=frozenset({"t"}))


def _poll(
    known: KnownEnds, ends: dict[Key, int], epochs: dict[Key, int], ids: dict[str, str] = A
) -> tuple[dict[Key, int], NewLogs]:
    """One poll as the observer makes it: the ids of the topics ``to_ask`` answered from
    ``ids`` (a topic left out of ``ids`` is not answered). Returns the answers taken,
    and what was found on a new log."""
    answers = dict(ends)
    changed = known.changed(answers, epochs)
    asked = known.to_ask(ids.keys() | {topic for topic, _ in ends}, changed)
    answered = {topic: ids[topic] for topic in asked if topic in ids}
    return answers, known.believed(answers, epochs, changed, asked, answered)


def _seen(ends: dict[Key, int], epochs: dict[Key, int], ids: dict[str, str] = A) -> KnownEnds:
    known = KnownEnds()
    assert _poll(known, ends, epochs, ids) == (ends, NO_NEW_LOG)
    return known


def test_answers_at_or_past_the_highest_end_seen_are_taken() -> None:
    known = _seen({P0: 5, P1: 3}, {P0: 1, P1: 1})
    assert _poll(known, {P0: 5, P1: 9}, {P0: 1, P1: 1}) == ({P0: 5, P1: 9}, NO_NEW_LOG)


def test_a_lower_end_in_the_same_or_an_older_epoch_is_stale_and_not_seen() -> None:
    known = _seen({P0: 5, P1: 3}, {P0: 2, P1: 2})
    assert _poll(known, {P0: 4, P1: 3}, {P0: 2, P1: 2}) == ({P1: 3}, NO_NEW_LOG)
    assert _poll(known, {P0: 1, P1: 3}, {P0: 1, P1: 2})[0] == {P1: 3}
    assert _poll(known, {P0: 4}, {})[0] == {}  # no epoch: tells nothing
    assert _poll(known, {P0: 5}, {P0: 2})[0] == {P0: 5}  # the stale answer left no trace


def test_a_lower_end_in_a_newer_epoch_was_truncated_and_is_taken() -> None:
    known = _seen({P0: 5}, {P0: 2})
    assert _poll(known, {P0: 3}, {P0: 3}) == ({P0: 3}, NewLogs(truncated=frozenset({P0})))
    assert _poll(known, {P0: 4}, {P0: 3}) == ({P0: 4}, NO_NEW_LOG)  # the new log grew
    assert _poll(known, {P0: 3}, {P0: 3})[0] == {}  # below it again, same epoch: stale


def test_a_recreated_topics_log_is_seen_from_the_answer_after_the_one_that_found_it() -> None:
    """The poll's log end came from ListOffsets, answered before DescribeTopics told the
    new id: it may be the old log's (log_verdict.after). Not taken; the next is, against
    nothing seen (epoch 0 after 7: no stale answer of the old log's epoch)."""
    known = _seen({P0: 5}, {P0: 7})
    assert _poll(known, {P0: 0}, {P0: 0}, {"t": "b"}) == ({}, RECREATED_T)
    assert _poll(known, {P0: 0}, {P0: 0}, {"t": "b"}) == ({P0: 0}, NO_NEW_LOG)
    assert _poll(known, {P0: 1}, {P0: 0}, {"t": "b"}) == ({P0: 1}, NO_NEW_LOG)


def test_a_topic_recreated_past_the_old_end_is_recreated_all_the_same() -> None:
    """Issue 41, finding 1: before, ids were asked only on a lower end, so a topic made
    again with more records than the old end was taken for the old log, grown."""
    known = _seen({P0: 5}, {P0: 0})
    assert _poll(known, {P0: 9}, {P0: 0}, {"t": "b"}) == ({}, RECREATED_T)
    assert _poll(known, {P0: 9}, {P0: 0}, {"t": "b"}) == ({P0: 9}, NO_NEW_LOG)
    assert _poll(known, {P0: 6}, {P0: 0}, {"t": "b"}) == ({}, NO_NEW_LOG)  # below 9 now


def test_a_changed_answer_of_a_topic_whose_id_was_not_answered_is_not_taken() -> None:
    """Higher or lower, it may be a new log's (a topic re-created longer would be taken
    for the old log grown): it stands still, still differs at the next poll, which asks
    again. An unchanged answer of the topic is taken: the same end shows nothing new."""
    known = _seen({P0: 5, P1: 3}, {P0: 1})
    assert _poll(known, {P0: 8, P1: 3}, {P0: 1}, {}) == ({P1: 3}, NO_NEW_LOG)
    assert _poll(known, {P0: 8, P1: 3}, {P0: 1}, {"t": "b"}) == ({}, RECREATED_T)
    known = _seen({P0: 5}, {P0: 1})
    assert _poll(known, {P0: 0}, {P0: 0}, {}) == ({}, NO_NEW_LOG)
    assert _poll(known, {P0: 8}, {P0: 1}, {}) == ({}, NO_NEW_LOG)
    assert _poll(known, {P0: 8}, {P0: 1}) == ({P0: 8}, NO_NEW_LOG)  # the same id: grown


def test_a_topic_first_seen_waits_for_its_id() -> None:
    known = KnownEnds()
    assert _poll(known, {P0: 5}, {}, {}) == ({}, NO_NEW_LOG)
    assert _poll(known, {P0: 5}, {}) == ({P0: 5}, NO_NEW_LOG)


def test_a_higher_end_from_an_older_epoch_is_stale() -> None:
    known = _seen({P0: 5}, {P0: 4})
    assert _poll(known, {P0: 9}, {P0: 3})[0] == {}
    assert _poll(known, {P0: 6}, {P0: 4})[0] == {P0: 6}


def test_every_partition_of_a_recreated_topic_is_seen_afresh() -> None:
    """P1 does not answer in the poll that finds the topic re-created (through P0): it is
    on the new log all the same, and its first answer there is taken, not judged
    against the old topic's end and epoch (2 < 8 in epoch 0 < 4: stale, if it were).
    Another topic is left alone."""
    known = _seen({P0: 5, P1: 8, Q0: 4}, {P0: 4, P1: 4, Q0: 4}, {"t": "a", "u": "c"})
    assert _poll(known, {P0: 0, Q0: 4}, {P0: 0, Q0: 4}, {"t": "b", "u": "c"}) == (
        {Q0: 4},
        RECREATED_T,
    )
    assert _poll(known, {P0: 1, P1: 2}, {P0: 0, P1: 0}, {"t": "b"}) == (
        {P0: 1, P1: 2},
        NO_NEW_LOG,
    )


def test_both_partitions_answered_in_the_poll_are_judged_against_the_old_id() -> None:
    known = _seen({P0: 5, P1: 8}, {P0: 4, P1: 4})
    assert _poll(known, {P0: 9, P1: 1}, {P0: 0, P1: 0}, {"t": "b"}) == ({}, RECREATED_T)


def test_a_quiet_poll_asks_no_id_and_a_changed_answer_its_topics_only() -> None:
    """Ids are asked of a topic whose id is not known yet (until answered), and of one
    with an answer other than what was seen: another end or another epoch (none
    answered tells nothing)."""
    known = KnownEnds()
    first = {P0: 5, P1: 3, Q0: 7}
    assert known.to_ask(["t", "u"], known.changed(first, {})) == ["t", "u"]
    assert _poll(known, first, {P0: 1}, {"u": "c"}) == ({Q0: 7}, NO_NEW_LOG)  # t: no id
    assert known.to_ask(["t", "u"], known.changed(first, {P0: 1})) == ["t"]
    assert _poll(known, first, {P0: 1}) == (first, NO_NEW_LOG)
    assert known.changed(first, {P0: 1}) == set()
    assert known.changed(first, {}) == set()
    assert known.to_ask(["t", "u"], set()) == []
    assert known.changed({**first, Q0: 8}, {P0: 1}) == {Q0}
    assert known.changed({**first, Q0: 6}, {P0: 1}) == {Q0}  # lower: asked too
    assert known.changed(first, {P0: 2, Q0: 0}) == {P0, Q0}
    assert known.to_ask(["t", "u"], {Q0}) == ["u"]


def test_a_topic_recreated_to_the_very_ends_seen_is_found_at_its_first_new_record() -> None:
    """Nothing differs, so nothing is asked and nothing misjudged; its first new record
    makes an answer differ, its id is asked in that poll, and the answer not taken."""
    known = _seen({P0: 3, P1: 3}, {})
    assert _poll(known, {P0: 3, P1: 3}, {}, {"t": "b"}) == ({P0: 3, P1: 3}, NO_NEW_LOG)
    assert _poll(known, {P0: 4, P1: 3}, {}, {"t": "b"}) == ({}, RECREATED_T)
    assert _poll(known, {P0: 4, P1: 3}, {}, {"t": "b"}) == ({P0: 4, P1: 3}, NO_NEW_LOG)


def test_a_stale_answer_is_said_once_while_it_lasts(caplog: pytest.LogCaptureFixture) -> None:
    known = _seen({P0: 5}, {P0: 2})
    with caplog.at_level(logging.WARNING, "emitter.observer"):
        for _ in range(3):
            _poll(known, {P0: 4}, {P0: 2})
        _poll(known, {P0: 5}, {P0: 2})
        _poll(known, {P0: 4}, {P0: 2})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "t[0]'s log end 4 is below the 5 seen before" in said[0]


def test_a_recreated_topic_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    known = _seen({P0: 5, P1: 8}, {P0: 4, P1: 4})
    with caplog.at_level(logging.WARNING, "emitter.observer"):
        _poll(known, {P0: 9, P1: 9}, {P0: 0, P1: 0}, {"t": "b"})
        _poll(known, {P0: 9, P1: 9}, {P0: 0, P1: 0}, {"t": "b"})
    assert [r.getMessage() for r in caplog.records] == [
        "topic t was re-created (its id is now b): its partitions' logs are new, seen "
        "afresh from their next answer, and an IDLE marker placed on the old log is "
        "withdrawn"
    ]


def test_an_answer_equal_to_what_was_seen_is_not_judged_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet poll judges nothing (it would be SAME, and change nothing); a grown log's
    answer is kept without a call (GREW, written out); any other is judged."""
    known = _seen({P0: 5, P1: 3}, {P0: 1})
    judged: list[Seen] = []

    def counted(seen: Seen, answer: Answer) -> Verdict:
        judged.append(seen)
        return judge(seen, answer)

    monkeypatch.setattr(known_ends, "judge", counted)
    _poll(known, {P0: 5, P1: 3}, {P0: 1})
    _poll(known, {P0: 5, P1: 3}, {})  # no epoch answered: the same log end tells the same
    assert judged == []
    _poll(known, {P0: 6, P1: 3}, {P0: 1})
    _poll(known, {P0: 6, P1: 4}, {P0: 2, P1: 0})
    assert judged == []
    _poll(known, {P0: 5, P1: 4}, {P0: 2})
    assert judged == [Seen(6, 2, "a")]


# The whole against log_verdict itself: every answer other than what was seen, and every
# partition of a topic whose id changed, judged and updated with judge/after, as a
# model; the ids answered only for the topics asked, and some not answered (a changed
# answer of such a topic is neither taken nor judged). A topic whose id changed is
# re-created whether or not a partition of it was seen: the detector may hold one the
# observer never saw answered (restored from its marker).
polls = st.lists(
    st.tuples(
        st.dictionaries(
            st.sampled_from([P0, P1, Q0]),
            st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 3))),
        ),
        st.dictionaries(st.sampled_from(["t", "u"]), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=25,
)


def _differs(seen: Seen | None, end: int, epoch: int | None) -> bool:
    """The model's "an answer other than what was seen"."""
    if seen is None or seen.end != end:
        return True
    return epoch is not None and epoch != seen.leader_epoch


@settings(max_examples=400, deadline=None)
@given(polls)
def test_the_verdicts_are_log_verdicts_for_every_poll(
    walk: list[tuple[dict[Key, tuple[int, int | None]], dict[str, str]]],
) -> None:
    known = KnownEnds()
    seen: dict[Key, Seen] = {}
    ids: dict[str, str] = {}
    for answered, broker_ids in walk:
        answers = {key: end for key, (end, _) in answered.items()}
        epochs = {key: epoch for key, (_, epoch) in answered.items() if epoch is not None}
        differ = {k for k, (end, epoch) in answered.items() if _differs(seen.get(k), end, epoch)}
        asked = sorted({topic for topic, _ in differ} | {t for t in ("t", "u") if t not in ids})
        topic_ids = {topic: broker_ids[topic] for topic in asked if topic in broker_ids}
        expected = dict(answers)
        truncated: set[Key] = set()
        recreated = {t for t, i in topic_ids.items() if ids.get(t, i) != i}
        for key in sorted(seen.keys() | answered.keys()):
            if key not in differ and key[0] not in recreated:
                continue
            if key in differ and key[0] not in topic_ids:  # its id asked, not answered
                expected.pop(key)
                continue
            before = Seen(*seen.get(key, Seen())[:2], ids.get(key[0]))
            answer = Answer(answers.get(key), epochs.get(key), topic_ids.get(key[0]))
            verdict = judge(before, answer)
            seen[key] = after(before, answer, verdict)
            if verdict is Verdict.UNKNOWN or verdict is Verdict.RECREATED:
                expected.pop(key, None)
            elif verdict is Verdict.TRUNCATED:
                truncated.add(key)
            assert (verdict is Verdict.RECREATED) == (key[0] in recreated)
        ids.update(topic_ids)
        changed = known.changed(answers, epochs)
        assert changed == differ
        assert known.to_ask(["t", "u"], changed) == asked
        new = known.believed(answers, epochs, changed, asked, topic_ids)
        assert answers == expected
        assert new == NewLogs(frozenset(truncated), frozenset(recreated))


# A broker whose topics are written to and re-created between polls (a new id, new
# ends), every answer current, the ids answered at some polls only: an answer taken
# that the detector has not seen is never of a log other than the one the emitter
# knows the topic by (it would place a marker of the new log on the old one's); a topic
# is found re-created only when it was; and a re-creation is found once the new log
# shows a record past the ends seen (one re-created to the very ends seen shows none to
# misjudge) at a poll whose ids are answered.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from([P0, P1, Q0]), st.integers(1, 3)),
        st.tuples(st.just("recreate"), st.sampled_from(["t", "u"]), st.integers(0, 4)),
        st.tuples(st.just("poll"), st.just(P0), st.integers(0, 1)),  # 1: ids answered
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(steps)
def test_a_recreated_topics_answers_are_never_taken_for_the_old_logs(
    walk: list[tuple[str, Key | str, int]],
) -> None:
    partitions = {"t": [P0, P1], "u": [Q0]}
    ends: dict[Key, int] = {P0: 0, P1: 0, Q0: 0}
    generation = {"t": 0, "u": 0}
    known_as: dict[str, int] = {}  # the generation the emitter knows each topic by
    taken: dict[Key, int] = {}  # the last answer taken of each partition
    known = KnownEnds()

    def poll(ids_answered: bool) -> None:
        ids = {topic: f"{topic}{number}" for topic, number in generation.items()}
        answers, new = _poll(known, dict(ends), {}, ids if ids_answered else {})
        for topic in new.recreated:
            assert known_as[topic] != generation[topic]
        known_as.update({t: g for t, g in generation.items() if t in new.recreated})
        if ids_answered:
            for topic, number in generation.items():
                known_as.setdefault(topic, number)  # its id first answered
        for key, end in answers.items():
            if taken.get(key) != end:
                assert known_as[key[0]] == generation[key[0]]
            taken[key] = end

    for step, what, count in walk:
        if step == "write":
            ends[what] += count  # type: ignore[index]
        elif step == "recreate":
            generation[what] += 1  # type: ignore[index]
            ends.update(dict.fromkeys(partitions[what], count))  # type: ignore[index]
        else:
            poll(bool(count))
    for key in ends:  # every log past any end seen: every re-creation is found
        ends[key] += 1_000
    poll(True)
    assert known_as == generation
