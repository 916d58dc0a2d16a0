"""The topic ids and leader epochs an offset keeps (spark_consumer/source/driver/seen_in.py)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from spark_consumer.source.driver.seen_in import SeenIn

topics = st.sampled_from(["orders", "clicks", "ctl"])
partitions = st.integers(min_value=0, max_value=5)
epochs_strategy = st.dictionaries(st.tuples(topics, partitions), st.integers(0, 9), max_size=12)
ids_strategy = st.dictionaries(topics, st.text(min_size=1, max_size=22))


@given(ids_strategy, epochs_strategy)
def test_a_restart_remembers_every_id_and_epoch_the_offset_kept(
    ids: dict[str, str], epochs: dict[tuple[str, int], int]
) -> None:
    written = SeenIn(dict(ids), dict(epochs)).encode()
    positions: dict[str, dict[str, int]] = {}
    for topic, partition in epochs:
        positions.setdefault(topic, {})[str(partition)] = 0
    restarted = SeenIn()
    restarted.remember(json.loads(json.dumps(written)), positions)  # through the checkpoint
    assert (restarted.topic_ids, restarted.leader_epochs) == (ids, epochs)


def test_a_topic_whose_partitions_share_an_epoch_is_written_as_one_number() -> None:
    seen = SeenIn({"t": "id"}, {("t", 0): 3, ("t", 1): 3, ("u", 0): 1, ("u", 1): 2})
    assert seen.encode() == {"ids": {"t": "id"}, "epochs": {"t": 3, "u": {"0": 1, "1": 2}}}


def test_what_this_planner_saw_itself_wins_over_the_offset() -> None:
    seen = SeenIn({"t": "new"}, {("t", 0): 7})
    seen.remember({"ids": {"t": "old"}, "epochs": {"t": 2}}, {"t": {"0": 5}})
    assert (seen.topic_ids, seen.leader_epochs) == ({"t": "new"}, {("t", 0): 7})


def test_an_unreadable_kept_part_is_left_out_and_the_rest_taken() -> None:
    seen = SeenIn()
    seen.remember({"ids": {"t": "id"}, "epochs": {"t": {"zero": 1}}}, {"t": {"0": 5}})
    assert seen.topic_ids == {"t": "id"}
    assert seen.leader_epochs == {}


def test_the_offset_form_is_made_again_after_a_change() -> None:
    seen = SeenIn({"t": "id"}, {("t", 0): 1})
    assert seen.encode()["epochs"] == {"t": 1}
    seen.leader_epochs[("t", 0)] = 2
    seen.changed()
    assert seen.encode()["epochs"] == {"t": 2}
