"""Whether a partition's offsets went back (spark_consumer/source/driver/partition_identity.py), on
Kafka's evidence alone (docs/semantics.md, "Kafka's evidence", rules 3 and 6): one test
per row of the module's table, on plans the test makes (no broker needed: the topic ids
Kafka would describe, every plan, are the test's)."""

from __future__ import annotations

import pytest

from spark_consumer.source.driver.partition_identity import PartitionIdentity
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.shared.options import SourceError, SourceOptions

Key = tuple[str, int]


class Ids:
    """What DescribeTopics answers now (every plan asks)."""

    def __init__(self, **ids: str) -> None:
        self.ids = dict(ids)


# What the plans of a test are answered with: the test changes it between plans.
IDS = Ids()


def _judge(ids: Ids, fail_on_data_loss: bool = False) -> PartitionIdentity:
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "controlTopic": "c",
            "failOnDataLoss": str(fail_on_data_loss).lower(),
        }
    )
    judge = PartitionIdentity(options, _not_described)
    IDS.ids = ids.ids  # the plans' answers
    judge.learn(_view({}, {}))  # first seen
    return judge


def _not_described(topic: str) -> None:
    raise AssertionError(f"went_back asked for {topic}'s metadata: only vanished does")


def _view(latest: dict[Key, int], epochs: dict[Key, int]) -> PlanAnswers:
    control = {str(p): end for (t, p), end in latest.items() if t == "c"}
    return PlanAnswers(
        {"t": 3}, frozenset({"t", "c"}), dict(latest), control, dict(epochs), None, dict(IDS.ids)
    )


DATA = {"t": {"0": 100, "1": 100, "2": 100}}


def _seen_at(judge: PartitionIdentity, epoch: int) -> None:
    """A plan whose every answer is at the position, in ``epoch``: the known epoch."""
    now = _view({("t", p): 100 for p in range(3)}, {("t", p): epoch for p in range(3)})
    assert judge.went_back(DATA, now) == []


def test_an_end_at_or_past_the_position_is_no_finding_and_its_epoch_is_known() -> None:
    judge = _judge(Ids(t="a"))
    _seen_at(judge, 4)
    assert judge.leader_epochs == {("t", p): 4 for p in range(3)}


def test_a_lower_end_from_the_same_epoch_is_stale_and_not_planned_to() -> None:
    judge = _judge(Ids(t="a"), fail_on_data_loss=True)
    _seen_at(judge, 4)
    now = _view({("t", 0): 3, ("t", 1): 100, ("t", 2): 120}, {("t", p): 4 for p in range(3)})
    assert judge.went_back(DATA, now) == []
    assert now.latest == {("t", 1): 100, ("t", 2): 120}  # ("t", 0) not seen this plan


def test_a_higher_end_from_an_older_epoch_is_stale_and_not_planned_to() -> None:
    judge = _judge(Ids(t="a"))
    _seen_at(judge, 4)
    now = _view({("t", p): 150 for p in range(3)}, {("t", 0): 3, ("t", 1): 4, ("t", 2): 5})
    assert judge.went_back(DATA, now) == []
    assert sorted(now.latest) == [("t", 1), ("t", 2)]
    assert judge.leader_epochs[("t", 2)] == 5


def test_a_lower_end_from_a_newer_epoch_was_truncated() -> None:
    judge = _judge(Ids(t="a"))
    _seen_at(judge, 4)
    now = _view({("t", 0): 60, ("t", 1): 100, ("t", 2): 100}, {("t", p): 5 for p in range(3)})
    assert judge.went_back(DATA, now) == [("t", 0)]


def test_a_lower_end_without_a_known_epoch_tells_nothing() -> None:
    judge = _judge(Ids(t="a"))
    now = _view({("t", 0): 60}, {("t", 0): 5})
    assert judge.went_back(DATA, now) == []


def test_a_recreated_topic_goes_back_whole_even_where_no_answer_came_yet() -> None:
    ids = Ids(t="a")
    judge = _judge(ids)
    _seen_at(judge, 4)
    ids.ids["t"] = "b"
    # Partition 0 answers low, 1 above the position, 2 not at all (no leader yet).
    now = _view({("t", 0): 5, ("t", 1): 300}, {("t", 0): 0, ("t", 1): 0})
    assert judge.went_back(DATA, now) == [("t", 0), ("t", 1), ("t", 2)]
    assert judge.topic_ids == {"t": "b"}
    # One made again with fewer partitions: those past its count are left to vanish.
    fewer = _judge(Ids(t="a"))
    _seen_at(fewer, 4)
    IDS.ids = {"t": "b"}
    smaller = _view({("t", 0): 5}, {("t", 0): 0})
    smaller = PlanAnswers(
        {"t": 2}, smaller.listed, smaller.latest, {}, smaller.leader_epochs, None, smaller.topic_ids
    )
    assert fewer.went_back(DATA, smaller) == [("t", 0), ("t", 1)]
    # Not started again yet (its earliest offset not answered): still found, next plan.
    later = _view({("t", p): 5 for p in range(3)}, {("t", p): 0 for p in range(3)})
    assert judge.went_back(DATA, later) == [("t", 0), ("t", 1), ("t", 2)]
    for partition in range(3):
        judge.started_again(("t", partition))
    assert judge.went_back({"t": {"0": 0, "1": 0, "2": 0}}, later) == []


def test_a_recreated_topic_stops_the_query_with_failondataloss() -> None:
    ids = Ids(t="a")
    judge = _judge(ids, fail_on_data_loss=True)
    _seen_at(judge, 4)
    ids.ids["t"] = "b"
    # Partition 0 has no answer yet: the line names one that answered.
    with pytest.raises(
        SourceError, match=r"data loss: t\[0\]: the topic was deleted and re-created .* offset 100"
    ):
        judge.went_back(DATA, _view({("t", 1): 5}, {("t", 1): 0}))


def test_a_recreated_control_topic_is_read_again_once_whole() -> None:
    ids = Ids(c="x")
    judge = _judge(ids)
    control = {"0": 7, "1": 9}
    seen = _view({("c", 0): 7, ("c", 1): 9}, {("c", 0): 2, ("c", 1): 2})
    assert judge.control_went_back(control, seen) == []
    ids.ids["c"] = "y"
    assert judge.control_went_back(control, _view({("c", 0): 1}, {("c", 0): 0})) == ["0", "1"]
    reread = {"0": 0, "1": 0}
    assert judge.control_went_back(reread, _view({("c", 0): 1}, {("c", 0): 0})) == []


def test_a_forgotten_topic_made_again_later_is_a_new_one_not_one_gone_back() -> None:
    ids = Ids(t="a")
    judge = _judge(ids)
    _seen_at(judge, 4)
    for partition in range(3):
        judge.forget(("t", partition), last_of_topic=partition == 2)
    assert judge.topic_ids == {} and judge.leader_epochs == {}
    ids.ids["t"] = "b"
    judge.learn(_view({}, {}))  # learned afresh when it is first seen again
    new = {"t": {"0": 0}}
    assert judge.went_back(new, _view({("t", 0): 0}, {("t", 0): 0})) == []


def test_a_lower_end_past_the_position_from_a_newer_epoch_goes_on_and_counts_the_rest() -> None:
    judge = _judge(Ids(t="a"))
    ahead = _view({("t", p): 150 for p in range(3)}, {("t", p): 4 for p in range(3)})
    assert judge.went_back(DATA, ahead) == []  # 150 seen, 100 read
    truncated = _view(
        {("t", 0): 120, ("t", 1): 150, ("t", 2): 150}, {("t", p): 5 for p in range(3)}
    )
    assert judge.went_back(DATA, truncated) == []  # read on from 100: [100, 120) is there
    assert judge.take_records_lost() == 30  # [120, 150): seen, never read
    assert truncated.latest[("t", 0)] == 120 and judge.ends_seen[("t", 0)] == 120


def test_a_truncated_end_past_the_position_stops_the_query_with_failondataloss() -> None:
    judge = _judge(Ids(t="a"), fail_on_data_loss=True)
    assert judge.went_back(DATA, _view({("t", 0): 150}, {("t", 0): 4})) == []
    with pytest.raises(SourceError, match=r"t\[0\] offsets 120 to 149 \(30 records, seen only"):
        judge.went_back(DATA, _view({("t", 0): 120}, {("t", 0): 5}))


def test_a_lower_end_below_the_end_seen_but_past_the_position_is_stale_without_evidence() -> None:
    judge = _judge(Ids(t="a"), fail_on_data_loss=True)
    assert judge.went_back(DATA, _view({("t", 0): 150}, {("t", 0): 4})) == []
    stale = _view({("t", 0): 120, ("t", 1): 100}, {("t", 0): 4, ("t", 1): 4})
    assert judge.went_back(DATA, stale) == []
    assert stale.latest == {("t", 1): 100}  # not planned to 120: this plan did not see it
    assert judge.ends_seen[("t", 0)] == 150


def _described_missing(topic: str) -> None:
    return None  # not listed: does not exist (rule 1)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_deleted_topic_loses_what_a_log_end_showed_past_the_position(
    fail_on_data_loss: bool,
) -> None:
    judge = _judge(Ids(t="a"), fail_on_data_loss=fail_on_data_loss)
    judge._describe = _described_missing
    data = {"t": {"0": 10}}
    assert judge.went_back(data, _view({("t", 0): 100}, {("t", 0): 4})) == []  # seen 100
    gone = PlanAnswers({}, frozenset(), {}, {}, {}, None, {})
    assert judge.vanished(data, gone) == []  # told once: not believed yet
    if fail_on_data_loss:
        with pytest.raises(SourceError, match=r"t\[0\] offsets 10 to 99 \(90 records, seen only"):
            judge.vanished(data, gone)
        return
    assert judge.vanished(data, gone) == [("t", 0)]
    assert judge.take_records_lost() == 90


def test_a_deleted_topic_read_to_its_end_loses_nothing_even_with_failondataloss() -> None:
    judge = _judge(Ids(t="a"), fail_on_data_loss=True)
    judge._describe = _described_missing
    assert judge.went_back(DATA, _view({("t", p): 100 for p in range(3)}, {})) == []
    gone = PlanAnswers({}, frozenset(), {}, {}, {}, None, {})
    assert judge.vanished(DATA, gone) == []
    assert judge.vanished(DATA, gone) == [("t", 0), ("t", 1), ("t", 2)]
    assert judge.take_records_lost() == 0


class Asked:
    """DescribeTopics as the planner asks it: what it was asked, what it answers."""

    def __init__(self, **ids: str) -> None:
        self.ids, self.asked = dict(ids), list[list[str]]()

    def __call__(self, names: list[str]) -> dict[str, str]:
        self.asked.append(list(names))
        return {n: self.ids[n] for n in names if n in self.ids}


def test_a_plan_asks_the_ids_of_topics_whose_answers_changed_or_are_not_known() -> None:
    """Rule 6 at a DescribeTopics' price (~12 ms of CPU per 1,000 partitions): an idle
    plan asks nothing; a topic with an answer other than the ends planned, a topic never
    described, and a control topic whose ends moved are asked."""
    judge = _judge(Ids(t="a", c="x"))
    IDS.ids = {}  # only what identify asks is answered
    ask = Asked(t="a", c="x")
    planned = {("t", p): 100 for p in range(3)}

    def plan(now: PlanAnswers) -> None:  # as a plan runs: identified, then judged
        judge.identify(now, planned, ask)
        judge.went_back(DATA, now)

    plan(_view({**planned, ("c", 0): 7}, {}))  # t's ends first seen, c's too
    plan(_view({**planned, ("c", 0): 7}, {}))  # idle: none
    plan(_view({**planned, ("t", 1): 101, ("c", 0): 7}, {}))
    plan(_view({**planned, ("t", 1): 101, ("c", 0): 8}, {}))  # (t[1] ahead of planned)
    judge.forget(("t", 0), last_of_topic=True)  # its id forgotten: asked again
    plan(_view({**planned, ("c", 0): 8}, {}))
    assert ask.asked == [["c", "t"], ["t"], ["c", "t"], ["t"]]


def test_a_topic_whose_id_was_asked_and_not_answered_stands_still() -> None:
    """Asked because its ends changed, not answered: not known to be the same log (a
    topic re-created longer would otherwise be read on from the old position)."""
    judge = _judge(Ids(t="a", c="x"))
    IDS.ids = {}  # only what identify asks is answered
    planned = {("t", p): 100 for p in range(3)}
    now = _view({**planned, ("t", 1): 180, ("c", 0): 9}, {})
    judge.identify(now, planned, Asked())  # DescribeTopics unanswered
    assert now.latest == {} and now.control_ends == {}  # the whole topic stands still
    again = _view({**planned, ("t", 1): 180, ("c", 0): 9}, {})
    ask = Asked(t="a", c="x")
    judge.identify(again, planned, ask)  # asked again, answered: planned to
    assert ask.asked == [["c", "t"]]
    assert again.latest[("t", 1)] == 180 and again.control_ends == {"0": 9}


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_backlog_seen_before_a_restart_is_lost_when_its_topic_is_deleted_meanwhile(
    fail_on_data_loss: bool,
) -> None:
    """The log ends seen past the planned ends travel in the offset: a restart counts a
    deleted topic's backlog as the query before it would have."""
    before = _judge(Ids(t="a"), fail_on_data_loss=fail_on_data_loss)
    data = {"t": {"0": 50}}
    assert before.went_back(data, _view({("t", 0): 100}, {("t", 0): 4})) == []
    kept = before.kept(data)
    assert kept["ends"] == {"t": {"0": 100}}
    after = _judge(Ids(t="a"), fail_on_data_loss=fail_on_data_loss)
    after._describe = _described_missing
    after.remember(kept, data)
    gone = PlanAnswers({}, frozenset(), {}, {}, {}, None, {})
    assert after.vanished(data, gone) == []
    if fail_on_data_loss:
        with pytest.raises(SourceError, match=r"t\[0\] offsets 50 to 99 \(50 records"):
            after.vanished(data, gone)
        return
    assert after.vanished(data, gone) == [("t", 0)]
    assert after.take_records_lost() == 50


def test_a_partition_past_a_recreated_topics_new_count_loses_what_was_seen_of_it() -> None:
    ids = Ids(t="a")
    judge = _judge(ids)
    judge._describe = _described_missing
    data = {"t": {"0": 100, "1": 50}}
    assert judge.went_back(data, _view({("t", 0): 100, ("t", 1): 100}, {})) == []
    IDS.ids = {"t": "b"}
    fewer = PlanAnswers({"t": 1}, frozenset({"t"}), {("t", 0): 5}, {}, {}, None, {"t": "b"})
    assert judge.went_back(data, fewer) == [("t", 0)]
    assert judge.vanished(data, fewer) == []
    assert judge.vanished(data, fewer) == [("t", 1)]
    assert judge.take_records_lost() == 50  # [50, 100) of the old partition 1


def test_a_partition_found_on_a_new_log_and_not_read_again_yet_is_kept_across_a_restart() -> None:
    ids = Ids(t="a")
    judge = _judge(ids)
    _seen_at(judge, 4)
    IDS.ids = {"t": "b"}
    assert judge.went_back(DATA, _view({("t", 0): 300}, {})) == [("t", 0), ("t", 1), ("t", 2)]
    kept = judge.kept(DATA)  # (no earliest offset answered: not started again)
    assert kept["ids"] == {"t": "b"} and kept["again"] == {"t": [0, 1, 2]}
    restarted = _judge(Ids(t="b"))
    restarted.remember(kept, DATA)
    assert restarted.went_back(DATA, _view({("t", 0): 300}, {})) == [("t", 0), ("t", 1), ("t", 2)]
