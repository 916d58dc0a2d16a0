"""Rows from records (spark_consumer/source/executor/arrow_rows.py) on Apache Kafka: every
record is a row, its event time read or the reason it cannot be (poison values,
timestamps Spark cannot hold, event times past maxEventTimeAhead).

A case of what production brings (semantics.md §6, issue 21); tests/harness/production.py
says how the cases are driven.
"""

from __future__ import annotations

import time
from pathlib import Path

from slackwater.kafka_broker import KafkaBroker
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS
from tests.harness.production import (
    send,
    setup,
)
from tests.harness.source_driver import Driven, options, real
from tests.harness.source_jobs import late_output_rows

# ------------------------------------------------------------ 2, 4. poison records


POISON_VALUES: list[tuple[bytes, str | None]] = [
    (b'{"ts": ' + b"9" * 5000 + b"}", "a number too long to parse"),
    (b'{"ts": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"ts": 9223372036854775807}', "out of range"),
    (b'{"ts": NaN}', "not a finite number"),
    (b'{"ts": 1e400}', "not a finite number"),
    (b"\xff\xfe not even UTF-8", "not JSON"),
    (b'{"ts": "2023-11-14T22:13:22.500Z"}', None),  # BASE_MS + 2.5 s
    # Epoch milliseconds as time.time() * 1000 writes them: a float, cut to the ms.
    (b'{"ts": %r}' % (BASE_MS + 3_000.75), None),
]


def test_poison_data_records_give_rows_with_reasons_and_counts_never_a_failed_read(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = setup(broker, new_topic, 1)
    send(broker, topic, *(value for value, _ in POISON_VALUES))
    # The same poison on the control topic: skipped and counted, the plan goes on.
    write.raw_control(f"{topic}:0".encode(), b'{"v": ' + b"1" * 5000 + b"}")
    write.raw_control(f"{topic}:0".encode(), b"[" * 100_000)
    late = tmp_path / "late"
    given = options(
        broker.bootstrap_servers, topic, control, eventTimeField="ts", lateOutput=str(late)
    )
    driven = Driven.start(given)
    try:
        rows = real(driven.step())
        # Every record is a row: none lost, none failed the read.
        assert [row["offset"] for row in rows] == list(range(len(POISON_VALUES)))
        readable = [row["event_time"] for row in rows if row["event_time"] is not None]
        assert readable == [BASE_MS + 2_500, BASE_MS + 3_000]
        driven.step()  # the progress of that batch reaches the planner
        assert driven.counter("records") == len(POISON_VALUES)
        assert driven.counter("records_unreadable") == 6
        assert driven.counter("control_malformed") == 2
        reasons = {row["offset"]: row["reason"] for row in late_output_rows(late)}
        for offset, (_, why) in enumerate(POISON_VALUES):
            if why is None:
                assert offset not in reasons
            else:
                assert why in reasons[offset], (offset, reasons[offset])
    finally:
        driven.stop()


def test_a_kafka_timestamp_no_spark_timestamp_holds_is_an_unreadable_row(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Kafka takes any int64 timestamp where the topic allows it; Spark's microseconds do not."""
    topic, control, _ = setup(
        broker, new_topic, 1, **{"message.timestamp.after.max.ms": str(2**63 - 1)}
    )
    send(broker, topic, b"{}", timestamp=9_300_000_000_000_000)  # over int64 microseconds
    send(broker, topic, b"{}", timestamp=BASE_MS)
    late = tmp_path / "late"
    driven = Driven.start(options(broker.bootstrap_servers, topic, control, lateOutput=str(late)))
    try:
        rows = real(driven.step())
        first = rows[0]
        assert (first["offset"], first["timestamp"], first["event_time"]) == (0, None, None)
        assert rows[1]["event_time"] == BASE_MS
        assert [row["reason"] for row in late_output_rows(late)] == [
            "unreadable: timestamp is out of range: 9300000000000000"
        ]
    finally:
        driven.stop()


# ------------------------------------------------------------ 3. far-future event time


def test_far_future_event_times_go_to_the_late_output_with_their_reason(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, _ = setup(broker, new_topic, 1)
    now_ms = time.time_ns() // 1_000_000
    send(broker, topic, b'{"ts": %d}' % (now_ms + 30 * 60_000))  # 30 min ahead: readable
    send(broker, topic, b'{"ts": %d}' % (now_ms + 3 * 3_600_000))  # 3 h ahead: not
    late = tmp_path / "late"
    given = options(
        broker.bootstrap_servers, topic, control, eventTimeField="ts", lateOutput=str(late)
    )
    driven = Driven.start(given)
    try:
        rows = real(driven.step())
        assert [row["event_time"] is None for row in rows] == [False, True]
        driven.step()
        # The valve's watermark: the readable record's, not the far one's.
        assert driven.offset["watermark"] == now_ms + 30 * 60_000 - 1_000
        [dropped] = late_output_rows(late)
        assert dropped["offset"] == 1
        assert "more than maxEventTimeAhead" in dropped["reason"]
    finally:
        driven.stop()
