"""Rows from records (spark_consumer/source/executor/arrow_rows.py) in Spark: a far-future
event time is unreadable and moves no watermark, the valve's nor Spark's own.

Cases of what production brings to the source (semantics.md §6, "What production
brings"), on Apache Kafka: each stalled, crash-looped or lost data in silence before
(issue 21). It runs in Spark, since what it broke was Spark's own watermark.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS
from tests.harness.production import (
    send,
    setup,
)
from tests.harness.source_jobs import events, window_job

# ------------------------------------------------------------ 3. far-future event time


def test_one_far_future_event_time_is_unreadable_and_moves_no_watermark(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """A record's event time in microseconds read as milliseconds (year ~55,800): past
    maxEventTimeAhead (Kafka's one hour by default), so it reaches neither the valve's
    watermark nor Spark's, and every later window is still emitted."""
    topic, control, _ = setup(broker, new_topic, 1)
    send(broker, topic, *(b'{"ts": %d}' % (BASE_MS + s * 1000) for s in range(0, 8)))
    send(broker, topic, b'{"ts": %d}' % (BASE_MS * 1000))
    send(broker, topic, *(b'{"ts": %d}' % (BASE_MS + s * 1000) for s in range(8, 23)))
    frame = events(spark, broker.bootstrap_servers, [topic], control, event_time_field="ts")
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        offset = job.source_offset()
        assert offset["watermark"] == BASE_MS + 21_000
        assert job.watermark_ms() == BASE_MS + 21_000  # Spark's own: not year 55,800
        assert offset["counters"]["records_unreadable"] == 1
        assert offset["counters"]["records_late"] == 0
        # Every window up to the watermark, each record counted once.
        assert job.windows() == {(0, 5): 5, (5, 10): 5, (10, 15): 5, (15, 20): 5}
    finally:
        job.stop()
