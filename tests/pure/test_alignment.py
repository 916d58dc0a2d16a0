"""Marker alignment (semantics.md §3): exact valve elements after each micro-batch."""

from __future__ import annotations

from slackwater.markers import Marker, MarkerStatus
from spark_consumer.alignment import MarkerAligner, MarkerOutcome, PartitionBatch
from spark_consumer.valve import MAX_WATERMARK, Watermark, WatermarkStatus
from tests.harness.factories import marker

T = "orders"
ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


def data(event_ms: int, max_offset: int, position: int, records: int = 1) -> PartitionBatch:
    return PartitionBatch(
        records=records, max_event_time_ms=event_ms, max_offset=max_offset, read_position=position
    )


def aligner(partitions: int = 2) -> MarkerAligner:
    return MarkerAligner(T, max_out_of_orderness_ms=0, partitions=range(partitions))


def test_watermark_is_min_over_partitions_minus_out_of_orderness() -> None:
    a = MarkerAligner(T, max_out_of_orderness_ms=100, partitions=[0, 1])
    assert a.advance({0: data(1_000, 4, 5)}) == []
    assert a.advance({1: data(2_000, 9, 10)}) == [Watermark(900)]


def test_idle_marker_waits_for_the_read_position() -> None:
    a = aligner()
    a.advance({0: data(10, 3, 4), 1: data(50, 0, 1)})
    assert a.offer(marker(0, IDLE, 6)) is MarkerOutcome.PENDING
    assert a.advance({0: data(20, 4, 5)}) == [Watermark(20)]  # position 5 < 6: still waits
    assert a.pending_count == 1
    assert a.advance({0: data(30, 5, 6)}) == [Watermark(30), Watermark(50)]
    assert a.status_of(0) is IDLE and a.pending_count == 0


def test_idle_marker_before_the_data_makes_no_record_late() -> None:
    """The marker is read before the data it follows: nothing closes early."""
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(100, 0, 1)})
    a.offer(marker(0, IDLE, 3))
    assert a.advance({}) == []  # position 1 < 3: partition 0 still holds the watermark
    assert a.valve.watermark == 10
    assert a.advance({0: data(40, 2, 3)}) == [Watermark(40), Watermark(100)]


def test_idle_contradicted_by_data_is_dropped() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(100, 0, 1)})
    a.offer(marker(0, IDLE, 1))
    assert a.advance({0: data(20, 1, 2)}) == [Watermark(20)]  # record at offset 1 >= 1
    assert a.status_of(0) is ACTIVE
    assert a.counters.markers_superseded == 1


def test_data_beats_markers_reactivates_an_idle_partition() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(100, 0, 1)})
    a.offer(marker(0, IDLE, 1))
    assert a.advance({}) == [Watermark(100)]
    assert a.advance({0: data(150, 1, 2)}) == []  # ACTIVE again, 150 > 100: aligned
    assert a.status_of(0) is ACTIVE and a.counters.data_reactivations == 1
    assert a.advance({1: data(200, 1, 2)}) == [Watermark(150)]


def test_active_marker_applies_at_once() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(100, 0, 1)})
    a.offer(marker(0, IDLE, 1, seq=0))
    a.advance({})
    a.offer(marker(0, ACTIVE, 1, seq=1))
    assert a.advance({}) == []
    assert a.status_of(0) is ACTIVE


def test_finished_while_other_idle_never_gives_max_watermark() -> None:
    a = aligner(3)
    a.advance({0: data(10, 0, 1), 1: data(50, 0, 1), 2: data(30, 0, 1)})
    a.offer(marker(2, IDLE, 1))
    a.offer(marker(0, FINISHED, 1))
    # partition order: 0 FINISHED leaves the min (30 = partition 2), then 2 IDLE (50)
    assert a.advance({}) == [Watermark(30), Watermark(50)]
    a.offer(marker(1, IDLE, 1))
    assert a.advance({}) == [WatermarkStatus.IDLE]
    assert a.valve.watermark == 50  # max over the IDLE ones, not MAX_WATERMARK


def test_all_finished_gives_max_watermark() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)})
    a.offer(marker(0, FINISHED, 1))
    a.offer(marker(1, FINISHED, 1))
    assert a.advance({}) == [Watermark(20), Watermark(MAX_WATERMARK), WatermarkStatus.FINISHED]


def test_stale_epoch_and_after_finished_are_rejected() -> None:
    a = aligner()
    assert a.offer(marker(0, IDLE, 0, epoch=3)) is MarkerOutcome.PENDING
    assert a.offer(marker(0, ACTIVE, 0, epoch=2)) is MarkerOutcome.STALE_EPOCH
    assert a.offer(marker(1, FINISHED, 0)) is MarkerOutcome.PENDING
    assert a.offer(marker(1, ACTIVE, 0)) is MarkerOutcome.AFTER_FINISHED
    assert (
        a.offer(
            Marker(
                topic="other",
                partition=0,
                status=IDLE,
                offset=0,
                emitted_at=0,
                emitter_id="e",
                epoch=1,
                seq=0,
            )
        )
        is MarkerOutcome.OTHER_TOPIC
    )
    assert a.counters.markers_rejected == {"stale_epoch": 1, "after_finished": 1, "other_topic": 1}


def test_data_after_finished_is_counted_and_changes_nothing() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)})
    a.offer(marker(0, FINISHED, 1))
    assert a.advance({}) == [Watermark(20)]
    assert a.advance({0: data(5, 3, 4, records=3)}) == []
    assert a.counters.records_after_finished == 3


def test_offset_gap_read_position_past_last_record_applies_the_marker() -> None:
    """Transactions leave a commit marker after the last record: position > offset + 1."""
    a = aligner()
    a.advance({1: data(100, 0, 1)})
    a.offer(marker(0, IDLE, 5))
    assert a.advance({0: data(10, 3, 5)}) == [Watermark(10), Watermark(100)]
    assert a.status_of(0) is IDLE


def test_new_partition_joins_as_active_channel() -> None:
    a = aligner(1)
    a.advance({0: data(10, 0, 1)})
    assert a.valve.watermark == 10
    assert a.advance({1: data(5, 0, 1)}) == []  # 5 < 10: unaligned, output stays
    assert a.advance({0: data(30, 1, 2), 1: data(40, 1, 2)}) == [Watermark(30)]


def test_snapshot_restore_continues_identically() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)})
    a.offer(marker(0, IDLE, 3))
    b = MarkerAligner.restore(a.snapshot())
    assert b.snapshot() == a.snapshot()
    step = {0: data(15, 2, 3)}
    assert b.advance(step) == a.advance(step)
    assert b.snapshot() == a.snapshot()


def test_consumer_idle_timeout_fallback_idles_a_silent_partition_until_data() -> None:
    a = MarkerAligner(
        T, max_out_of_orderness_ms=0, partitions=[0, 1], consumer_idle_timeout_ms=1_000
    )
    assert a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)}, now_ms=0) == [Watermark(10)]
    assert a.advance({1: data(30, 1, 2)}, now_ms=600) == []
    # p0 silent for 1 s of wall time: IDLE, the output follows p1.
    assert a.advance({1: data(40, 2, 3)}, now_ms=1_000) == [Watermark(30), Watermark(40)]
    assert a.status_of(0) is IDLE and a.counters.consumer_idle_timeouts == 1
    # data on p0 makes it ACTIVE again at once (data beats the timeout too)
    assert a.advance({0: data(50, 1, 2)}, now_ms=1_100) == []
    assert a.status_of(0) is ACTIVE


def test_consumer_idle_timeout_counts_records_waiting_past_the_read_position_as_records() -> None:
    a = MarkerAligner(
        T, max_out_of_orderness_ms=0, partitions=[0, 1], consumer_idle_timeout_ms=1_000
    )
    assert a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)}, now_ms=0) == [Watermark(10)]
    # p0 reads nothing for 2 s (held back by watermark alignment, or not read yet) but
    # its log end is past its read position: not silence, it stays ACTIVE.
    assert a.advance({1: data(30, 1, 2)}, now_ms=1_000, waiting=[0]) == []
    assert a.advance({}, now_ms=2_000, waiting=[0, 1]) == []
    before = a.snapshot()
    assert a.advance({}, now_ms=9_000, waiting=[0, 1]) == []
    assert a.status_of(0) is ACTIVE and a.counters.consumer_idle_timeouts == 0
    # Waiting changes no state (an availableNow run whose ends it waits past can end).
    assert a.snapshot() == before
    # Read up: the clocks start at the first plan that finds them so.
    assert a.advance({1: data(40, 2, 3)}, now_ms=9_500) == []
    assert a.advance({1: data(50, 3, 4)}, now_ms=10_499) == []
    assert a.advance({1: data(60, 4, 5)}, now_ms=10_500) == [Watermark(50), Watermark(60)]
    assert a.status_of(0) is IDLE


def test_consumer_idle_timeout_is_off_without_a_setting() -> None:
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)}, now_ms=0)
    assert a.advance({1: data(40, 1, 2)}, now_ms=10**9) == []
    assert a.status_of(0) is ACTIVE


def test_a_partition_that_appears_after_every_partition_finished_is_finished_data() -> None:
    """A FINISHED valve takes no channel: the new partition is data after FINISHED."""
    a = aligner(1)
    a.offer(marker(0, FINISHED, 1))
    assert a.advance({0: data(10, 0, 1)}) == [
        Watermark(10),
        Watermark(MAX_WATERMARK),
        WatermarkStatus.FINISHED,
    ]
    assert a.ensure_partitions([1], {1: 0}) == []
    assert a.status_of(1) is FINISHED
    assert a.counters.partitions_after_finished == 1
    assert a.advance({1: data(20, 1, 2, records=2)}) == []
    assert a.counters.records_after_finished == 2


def test_finish_takes_a_partition_out_of_the_valve_whatever_is_pending() -> None:
    """A deleted topic's partitions: FINISHED at once, as the emitter's FINISHED@log_end."""
    a = aligner()
    a.advance({0: data(10, 0, 1), 1: data(50, 0, 1)})
    a.offer(marker(0, IDLE, 9))  # waits for a read position the partition never reaches
    assert a.finish(0) == [Watermark(50)]
    assert a.status_of(0) is FINISHED and a.pending_count == 0
    assert a.finish(0) == []  # once
    assert a.finish(1) == [Watermark(MAX_WATERMARK), WatermarkStatus.FINISHED]


def test_a_new_partition_starts_at_its_first_read_position() -> None:
    """FINISHED@X for a new partition whose log starts at X applies without a read."""
    a = aligner(1)
    a.advance({0: data(10, 0, 1)})
    a.ensure_partitions([1], {1: 7})
    a.offer(marker(1, FINISHED, 7))
    assert a.advance({}) == []
    assert a.status_of(1) is FINISHED


def test_the_consumer_idle_clock_starts_again_at_a_restart() -> None:
    a = MarkerAligner(T, 0, partitions=[0, 1], consumer_idle_timeout_ms=1_000)
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)}, now_ms=0)
    restored = MarkerAligner.restore(a.snapshot())
    restored.restart_idle_clocks()
    # A day later: the downtime is not silence; the clock starts at this first sight.
    assert restored.advance({}, now_ms=86_400_000) == []
    assert restored.advance({}, now_ms=86_400_000 + 999) == []
    assert restored.advance({}, now_ms=86_400_000 + 1_000) == [Watermark(20), WatermarkStatus.IDLE]


def test_the_idle_clock_of_a_partition_the_broker_did_not_show_does_not_run() -> None:
    """A partition whose log end the broker did not give: its time is not silence, and
    its state stays the same plan after plan (no empty batch while it stays unseen)."""
    a = MarkerAligner(T, 0, partitions=[0, 1], consumer_idle_timeout_ms=1_000)
    a.advance({0: data(10, 0, 1), 1: data(20, 0, 1)}, now_ms=0)
    assert a.advance({}, now_ms=1_000, unseen={1}) == [Watermark(20)]  # 0 idles
    before = a.snapshot()
    assert a.advance({}, now_ms=5_000, unseen={1}) == []
    assert a.snapshot() == before
    assert a.status_of(0) is IDLE and a.status_of(1) is ACTIVE
    assert a.advance({}, now_ms=6_000) == []  # seen again: its clock starts here
    assert a.advance({}, now_ms=6_999) == []
    assert a.advance({}, now_ms=7_000) == [WatermarkStatus.IDLE]


def test_offsets_that_went_back_restart_the_read_position() -> None:
    """A re-created topic: offsets of the old log mean nothing in the new one."""
    a = aligner(1)
    a.advance({0: data(10, 99, 100)})
    a.offer(marker(0, IDLE, 150))  # the old log's: pending, meaningless in the new one
    a.restart_at(0, 0)
    assert a.pending_count == 0
    a.offer(marker(0, IDLE, 3))  # the new log's offset 3
    assert a.advance({}) == []  # position 0 < 3: waits (before: 100 >= 3, applied at once)
    assert a.advance({0: data(20, 2, 3)}) == [Watermark(20), WatermarkStatus.IDLE]


def test_finished_again_after_finished_is_the_same_end_not_a_violation() -> None:
    a = aligner(1)
    a.finish(0)  # its topic was deleted
    assert a.offer(marker(0, FINISHED, 5)) is MarkerOutcome.ALREADY_FINISHED  # the emitter's
    assert a.offer(marker(0, IDLE, 5)) is MarkerOutcome.AFTER_FINISHED
    assert a.counters.markers_rejected == {"after_finished": 1}


def test_a_new_control_topic_history_starts_its_epochs_again() -> None:
    a = aligner(1)
    a.offer(marker(0, ACTIVE, 0, epoch=5))
    assert a.offer(marker(0, IDLE, 0, epoch=1)) is MarkerOutcome.STALE_EPOCH
    a.forget_epochs()  # the control topic was re-created: a new emitter, epoch 1
    assert a.offer(marker(0, IDLE, 0, epoch=1)) is MarkerOutcome.PENDING
