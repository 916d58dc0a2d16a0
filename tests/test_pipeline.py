"""The Spark consumer end to end: Apache Kafka, a local SparkSession, real network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from emitter.kafka_broker import KafkaBroker
from emitter.markers import MarkerStatus
from spark_consumer.valve import MAX_WATERMARK
from tests.conftest import TopicFactory
from tests.pipeline_harness import BASE_MS, PipelineRun, Writer, run_pipeline

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


def _setup(
    broker: KafkaBroker, new_topic: TopicFactory, partitions: int
) -> tuple[str, str, Writer]:
    topic, control = new_topic(partitions=partitions), new_topic(partitions=1, prefix="ctl")
    return topic, control, Writer(broker.bootstrap_servers, topic, control)


def _start(
    spark: SparkSession,
    tmp_path: Path,
    broker: KafkaBroker,
    topic: str,
    control: str,
    **settings: Any,
) -> PipelineRun:
    return run_pipeline(
        spark,
        tmp_path,
        bootstrap_servers=broker.bootstrap_servers,
        topic=topic,
        control_topic=control,
        **settings,
    )


def _total_late(run: PipelineRun) -> int:
    return sum(r.late for r in run.reports)


def test_idle_partition_lets_windows_close_and_its_resumed_records_are_not_late(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 4)
    write.raw_control(b"junk", b"not json")  # malformed: counted and skipped
    for partition in range(4):
        write.data(partition, 0, 1, 2, 3, 4)
    for partition in range(3):
        write.data(partition, *range(5, 20))
    run = _start(spark, tmp_path, broker, topic, control)
    try:
        run.settle()
        # p3 is quiet but ACTIVE: it holds the watermark at 4 - 1 = 3 s.
        assert run.watermark == BASE_MS + 3_000
        assert run.window_counts() == {}
        assert sum(r.control_malformed for r in run.reports) == 1
        write.marker(3, IDLE)  # IDLE@5, p3's log end
        run.settle()
        assert run.watermark == BASE_MS + 18_000
        # Windows keep closing; the valve is the min of the other three (19 - 1 s).
        assert run.window_counts() == {(0, 5): 20, (5, 10): 15, (10, 15): 15}
        # p3 resumes within bounds: ACTIVE marker, then records at 18 s and 19 s.
        write.marker(3, ACTIVE)
        write.data(3, 18, 19)
        for partition in range(4):
            write.data(partition, 26)
        run.settle()
        assert run.window_counts()[(15, 20)] == 3 * 5 + 2  # p3's two records counted
        assert _total_late(run) == 0 and run.late() == []
        assert sum(r.records for r in run.reports) == 4 * 5 + 3 * 15 + 2 + 4
    finally:
        run.stop()


def test_finished_beside_idle_closes_nothing_past_the_idle_partition(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """FLINK-38477: one partition FINISHED, the other IDLE: no MAX_WATERMARK."""
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    write.data(1, *range(0, 10))
    run = _start(spark, tmp_path, broker, topic, control)
    try:
        run.settle()
        write.marker(0, FINISHED)
        write.marker(1, IDLE)
        run.settle()
        # The flush goes to the IDLE partition's watermark (9 - 1 s), not to infinity.
        assert run.watermark == BASE_MS + 8_000
        assert run.window_counts() == {(0, 5): 10}
        assert run.reports[-1].valve_status == "IDLE"
        write.marker(1, FINISHED)
        run.wait_for(lambda r: r.watermark == MAX_WATERMARK, 60, "MAX_WATERMARK")
        run.settle()
        counts = run.window_counts()
        assert counts == {(0, 5): 10, (5, 10): 10, **{(s, s + 5): 5 for s in range(10, 30, 5)}}
        assert run.reports[-1].valve_status == "FINISHED"
    finally:
        run.stop()


def test_marker_ahead_of_the_read_position_makes_no_record_late(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    write.data(1, 0, 1, 2)
    write.marker(1, IDLE, offset=10)  # the emitter saw a log end of 10 ...
    run = _start(spark, tmp_path, broker, topic, control)
    try:
        run.settle()
        # ... but the consumer has read p1 only up to 3: the marker waits.
        assert run.aligner is not None and run.aligner.pending_count == 1
        assert run.watermark == BASE_MS + 1_000
        write.data(1, *range(3, 10))  # offsets 3..9: p1 reaches 10
        run.wait_for(lambda r: r.watermark == BASE_MS + 29_000 - 1_000, 60, "p1 IDLE")
        assert _total_late(run) == 0 and run.late() == []
        assert run.window_counts() == {
            (0, 5): 10,
            (5, 10): 10,
            (10, 15): 5,
            (15, 20): 5,
            (20, 25): 5,
        }
    finally:
        run.stop()


def test_plain_spark_drops_a_lagging_partition_slackwater_does_not(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    plain = (  # what a Spark user runs today: Spark's own Kafka source
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .withWatermark("timestamp", "1 second")
        .groupBy(F.window("timestamp", "5 seconds"))
        .count()
        .writeStream.outputMode("append")
        .format("memory")
        .queryName(f"plain_{topic[2:]}")
        .option("checkpointLocation", str(tmp_path / "plain-checkpoint"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    run = _start(spark, tmp_path, broker, topic, control)
    try:
        run.settle()
        plain.processAllAvailable()
        write.data(1, *range(0, 30))  # the lagging partition catches up
        write.data(0, 40)
        run.settle()
        plain.processAllAvailable()
        dropped = sum(
            operator.get("numRowsDroppedByWatermark", 0)
            for progress in plain.recentProgress
            for operator in progress["stateOperators"]
        )
        plain_total = spark.sql(f"select coalesce(sum(count), 0) from plain_{topic[2:]}").first()
        # Plain Spark: watermark = max event time - 1 s over all partitions, so p1's
        # records in the windows [0, 5) .. [20, 25) are late (counted after partial
        # aggregation: one dropped row per window), and never reach the output.
        assert dropped >= 5
        assert plain_total is not None and plain_total[0] <= 60 - 25
        # slackwater: the minimum over partitions; nothing late, every record counted
        # once all partitions finish.
        write.marker(0, FINISHED)
        write.marker(1, FINISHED)
        run.wait_for(lambda r: r.watermark == MAX_WATERMARK, 60, "MAX_WATERMARK")
        run.settle()
        assert _total_late(run) == 0
        assert sum(run.window_counts().values()) == 61
    finally:
        run.stop()
        plain.stop()


def test_json_event_time_and_key_fields_and_late_and_unreadable_records(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)

    def send(value: bytes) -> None:
        write.producer.produce(topic, value=value, partition=0)
        assert write.producer.flush(10) == 0

    send(b'{"ts": %d, "user": "ann"}' % (BASE_MS + 1_000))
    send(b'{"ts": "2023-11-14T22:13:22.500Z", "user": "bob"}')  # BASE_MS + 2.5 s
    send(b'{"ts": %d, "user": "ann"}' % (BASE_MS + 12_000))
    send(b'{"ts": "soon", "user": "eve"}')  # unreadable event time
    send(b"not json at all")  # unreadable event time
    run = _start(spark, tmp_path, broker, topic, control, event_time_field="ts", key_field="user")
    try:
        run.settle()
        assert run.watermark == BASE_MS + 11_000
        send(b'{"ts": %d, "user": "ann"}' % (BASE_MS + 3_000))  # below 11 s: late
        run.settle()
        late = run.late()
        assert [(r["offset"], r["reason"]) for r in late] == [
            (3, "unreadable event time"),
            (4, "unreadable event time"),
            (5, "late"),
        ]
        assert late[2]["event_time"] == "2023-11-14T22:13:23.000Z"
        assert late[2]["topic"] == topic and late[2]["partition"] == 0
        assert sorted((r["key"], r["count"]) for r in run.windows()) == [("ann", 1), ("bob", 1)]
        assert all(r["window_start"] == "2023-11-14T22:13:20.000Z" for r in run.windows())
        assert sum(r.unreadable for r in run.reports) == 2
        assert sum(r.late for r in run.reports) == 1
    finally:
        run.stop()
