"""What a restarted emitter or `slackwater status` takes from the control topic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.control_topic import last_marker_per_partition
from slackwater.markers import (
    ControlRecord,
    FinishRequest,
    Marker,
    MarkerStatus,
    OtherRecord,
    in_protocol_order,
)
from tests.harness.control_histories import interleavings, written_histories


def _m(partition: int, status: MarkerStatus, offset: int, epoch: int, seq: int) -> Marker:
    return Marker(
        topic="t",
        partition=partition,
        status=status,
        offset=offset,
        emitted_at=0,
        emitter_id=f"e{epoch}",
        epoch=epoch,
        seq=seq,
    )


def test_last_marker_per_partition_follows_consumer_rules() -> None:
    records: list[ControlRecord] = [
        _m(0, MarkerStatus.IDLE, 5, epoch=1, seq=0),
        _m(0, MarkerStatus.ACTIVE, 5, epoch=2, seq=1),
        _m(0, MarkerStatus.IDLE, 9, epoch=1, seq=2),  # a stale emitter: ignored
        _m(1, MarkerStatus.FINISHED, 3, epoch=1, seq=0),
        _m(1, MarkerStatus.ACTIVE, 3, epoch=2, seq=1),  # after FINISHED: ignored
        FinishRequest(topic="t", partition=2, requested_at=0, requested_by="ops"),
        OtherRecord(kind="future"),
    ]
    latest = last_marker_per_partition(records)
    assert {k: (m.status, m.offset, m.epoch) for k, m in latest.items()} == {
        ("t", 0): (MarkerStatus.ACTIVE, 5, 2),
        ("t", 1): (MarkerStatus.FINISHED, 3, 1),
    }


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_last_marker_does_not_depend_on_the_read_order(data: st.DataObject) -> None:
    """Records of several control partitions (issue 42, finding 6), read back as
    ControlTopicReader.read_to_end gives them (markers.in_protocol_order): the same last
    marker for every interleaving of the partitions, the one a single log of all the
    writes gives."""
    written = data.draw(written_histories())
    read = data.draw(interleavings(written))
    one_log = last_marker_per_partition([marker for _, marker in written])
    assert last_marker_per_partition(in_protocol_order(read)) == one_log


def test_a_newer_marker_in_another_partition_is_the_last() -> None:
    """An old emitter hashed keys after the control topic grew: its newer markers landed
    in partition 3, read here before partition 0's older ones."""
    read: list[tuple[int, ControlRecord]] = [
        (3, _m(0, MarkerStatus.IDLE, 9, epoch=2, seq=3)),
        (0, _m(0, MarkerStatus.IDLE, 5, epoch=2, seq=1)),
        (0, _m(0, MarkerStatus.ACTIVE, 5, epoch=2, seq=2)),
    ]
    by_read_order = last_marker_per_partition([record for _, record in read])
    assert by_read_order[("t", 0)].status is MarkerStatus.ACTIVE  # what issue 42 found
    latest = last_marker_per_partition(in_protocol_order(read))
    assert (latest[("t", 0)].status, latest[("t", 0)].offset) == (MarkerStatus.IDLE, 9)
