"""What a restarted emitter or `slackwater status` takes from the control topic."""

from __future__ import annotations

from emitter.control_topic import last_marker_per_partition
from slackwater.markers import ControlRecord, FinishRequest, Marker, MarkerStatus, OtherRecord


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
