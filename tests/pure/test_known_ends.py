"""Which lower log ends the emitter believes (emitter/known_ends.py): kafka_evidence
rules 3 and 6, one test per case of its timeline."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from emitter.known_ends import KnownEnds

P0, P1 = ("t", 0), ("t", 1)
Key = tuple[str, int]


class Ids:
    """What DescribeTopics answers: the ids of the topics it describes now."""

    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        self.asked: list[list[str]] = []

    def __call__(self, names: Collection[str]) -> dict[str, str]:
        self.asked.append(sorted(names))
        return {n: self.ids[n] for n in names if n in self.ids}


def _seen(
    ids: Ids, ends: dict[tuple[str, int], int], epochs: dict[tuple[str, int], int]
) -> KnownEnds:
    known = KnownEnds(ids)
    known.learn_topics(["t"])
    assert known.believed(dict(ends), epochs) == ends
    return known


def test_answers_at_or_past_the_highest_end_seen_are_taken() -> None:
    known = _seen(Ids({"t": "a"}), {P0: 5, P1: 3}, {P0: 1, P1: 1})
    assert known.believed({P0: 5, P1: 9}, {P0: 1, P1: 1}) == {P0: 5, P1: 9}


def test_a_lower_end_in_the_same_or_an_older_epoch_is_stale_and_not_seen() -> None:
    ids = Ids({"t": "a"})
    known = _seen(ids, {P0: 5, P1: 3}, {P0: 2, P1: 2})
    assert known.believed({P0: 4, P1: 3}, {P0: 2, P1: 2}) == {P1: 3}
    assert known.believed({P0: 1, P1: 3}, {P0: 1, P1: 2}) == {P1: 3}
    assert known.believed({P0: 4}, {}) == {}  # no epoch: tells nothing
    assert known.believed({P0: 5}, {P0: 2}) == {P0: 5}  # the stale answer left no trace


def test_a_lower_end_in_a_newer_epoch_was_truncated_and_is_taken() -> None:
    known = _seen(Ids({"t": "a"}), {P0: 5}, {P0: 2})
    assert known.believed({P0: 3}, {P0: 3}) == {P0: 3}
    assert known.believed({P0: 4}, {P0: 3}) == {P0: 4}  # the new log, from its end
    assert known.believed({P0: 3}, {P0: 3}) == {}  # below it again, same epoch: stale


def test_a_lower_end_of_a_topic_with_another_id_was_recreated_and_is_taken() -> None:
    ids = Ids({"t": "a"})
    known = _seen(ids, {P0: 5}, {P0: 7})
    ids.ids["t"] = "b"
    assert known.believed({P0: 0}, {P0: 0}) == {P0: 0}
    assert known.believed({P0: 1}, {P0: 0}) == {P0: 1}  # the new topic's epochs count


def test_a_topic_whose_id_is_unknown_tells_nothing() -> None:
    ids = Ids({})
    known = _seen(ids, {P0: 5}, {P0: 1})
    assert known.believed({P0: 0}, {P0: 0}) == {}


@pytest.mark.parametrize("epoch", [None, 1])
def test_ids_are_asked_only_for_lower_ends(epoch: int | None) -> None:
    ids = Ids({"t": "a"})
    known = _seen(ids, {P0: 5}, {} if epoch is None else {P0: epoch})
    asked = len(ids.asked)
    known.believed({P0: 6}, {})
    assert len(ids.asked) == asked
    known.believed({P0: 2}, {})
    assert len(ids.asked) == asked + 1


def test_a_higher_end_from_an_older_epoch_is_stale() -> None:
    known = _seen(Ids({"t": "a"}), {P0: 5}, {P0: 4})
    assert known.believed({P0: 9}, {P0: 3}) == {}
    assert known.believed({P0: 6}, {P0: 4}) == {P0: 6}


def test_every_partition_of_a_recreated_topic_is_seen_afresh() -> None:
    """P1 answers only after the topic was found re-created through P0: its new log,
    in the new topic's epochs, is taken, not judged against the old topic's."""
    ids = Ids({"t": "a"})
    known = _seen(ids, {P0: 5, P1: 8}, {P0: 4, P1: 4})
    ids.ids["t"] = "b"
    assert known.believed({P0: 0}, {P0: 0}) == {P0: 0}
    assert known.believed({P0: 1, P1: 2}, {P0: 0, P1: 0}) == {P0: 1, P1: 2}
