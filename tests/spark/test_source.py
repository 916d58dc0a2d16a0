"""The slackwater source end to end (semantics.md §6): Apache Kafka, a local SparkSession,
Spark's own window aggregation on the valve's watermark."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.query import StreamingQuery

from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.markers import MarkerStatus
from spark_consumer.source import (
    SlackwaterKafkaSource,
    SourceError,
    serve_source_metrics,
    with_valve_watermark,
)
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.metrics import partitions_of
from spark_consumer.source.shared.options import SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.factories import scrape_metrics
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_jobs import events, window_job
from tests.harness.spark_checkpoint import batch_ids, planned_batch

ACTIVE, IDLE, FINISHED = MarkerStatus.ACTIVE, MarkerStatus.IDLE, MarkerStatus.FINISHED


def _scrape(query: StreamingQuery) -> dict[str, float]:
    """A real scrape of the source's /metrics for this query."""
    server = serve_source_metrics(lambda: [query], port=free_port(), host="127.0.0.1")
    try:
        return scrape_metrics(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()


def _setup(
    broker: KafkaBroker, new_topic: TopicFactory, partitions: int
) -> tuple[str, str, Writer]:
    topic, control = new_topic(partitions=partitions), new_topic(partitions=1, prefix="ctl")
    return topic, control, Writer(broker.bootstrap_servers, topic, control)


def test_quiet_partition_marked_idle_lets_windows_close(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 3)
    for partition in range(3):
        write.data(partition, 0, 1, 2, 3, 4)
    for partition in range(2):
        write.data(partition, *range(5, 20))
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        # p2 is quiet but ACTIVE: it holds the valve at 4 - 1 = 3 s; nothing closes.
        assert job.source_offset()["watermark"] == BASE_MS + 3_000
        assert job.windows() == {}
        write.marker(2, IDLE)  # IDLE@5: p2's log end
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 18_000
        assert job.watermark_ms() == BASE_MS + 18_000  # Spark's own watermark is the valve's
        assert job.windows() == {(0, 5): 15, (5, 10): 10, (10, 15): 10}
    finally:
        job.stop()


def test_lagging_partition_rows_are_not_late(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    write.data(1, 0)
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        # p1 lags at 0 s: the valve holds at -1 s; Spark alone would be at 29 - 1 s.
        assert job.source_offset()["watermark"] == BASE_MS - 1_000
        write.data(1, *range(1, 30))  # the lagging partition catches up
        write.data(0, 40)
        write.data(1, 40)
        job.settle()
        assert job.source_offset()["counters"]["records_late"] == 0
        # Every record of both partitions counted: windows up to 35 s have closed.
        assert job.windows() == {(s, s + 5): 10 for s in range(0, 30, 5)}
    finally:
        job.stop()


def test_finished_beside_idle_flushes_to_the_idle_partitions_watermark(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """FLINK-38477: one partition FINISHED, the other IDLE: no MAX_WATERMARK."""
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    write.data(1, *range(0, 10))
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        write.marker(0, FINISHED)
        write.marker(1, IDLE)
        job.settle()
        offset = job.source_offset()
        assert (offset["watermark"], offset["status"]) == (BASE_MS + 8_000, "IDLE")
        assert job.windows() == {(0, 5): 10}
        write.marker(1, FINISHED)  # all FINISHED: every window closes
        job.settle()
        assert job.source_offset()["status"] == "FINISHED"
        metrics = _scrape(job.query)
        assert metrics[f'slackwater_source_up{{query="{job.table}"}}'] == 1
        assert (
            metrics[f'slackwater_source_valve_status{{query="{job.table}",status="FINISHED"}}'] == 1
        )
        assert metrics[f'slackwater_source_records_total{{query="{job.table}"}}'] == 40
        assert metrics[f'slackwater_source_markers_applied_total{{query="{job.table}"}}'] == 3
        assert metrics[f'slackwater_source_markers_pending{{query="{job.table}"}}'] == 0
        assert (
            metrics[
                f'slackwater_source_partition_status{{partition="1",query="{job.table}",'
                f'status="FINISHED",topic="{topic}"}}'
            ]
            == 1
        )
        assert job.windows() == {
            (0, 5): 10,
            (5, 10): 10,
            **{(s, s + 5): 5 for s in range(10, 30, 5)},
        }
        assert sorted(job.rows()) == job.rows()  # each window once
        assert len(job.rows()) == 6
    finally:
        job.stop()


def test_marker_ahead_of_the_read_position_waits_for_it(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    write.data(0, *range(0, 30))
    write.data(1, 0, 1, 2)
    write.marker(1, IDLE, offset=10)  # the emitter saw a log end of 10 ...
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        # ... but the source has read p1 only up to 3: the marker waits.
        assert job.source_offset()["watermark"] == BASE_MS + 1_000
        write.data(1, *range(3, 10))  # offsets 3..9: p1's read position reaches 10
        job.settle()
        offset = job.source_offset()
        assert offset["watermark"] == BASE_MS + 28_000
        assert offset["counters"]["records_late"] == 0
        assert job.windows() == {(0, 5): 10, (5, 10): 10, (10, 15): 5, (15, 20): 5, (20, 25): 5}
    finally:
        job.stop()


def test_unreadable_event_times_and_malformed_markers_are_counted_never_fatal(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control, write = _setup(broker, new_topic, 1)

    def send(value: bytes) -> None:
        write.producer.produce(topic, value=value, partition=0)
        assert write.producer.flush(10) == 0

    send(b'{"ts": %d}' % (BASE_MS + 1_000))
    send(b'{"ts": "2023-11-14T22:13:22.500Z"}')  # BASE_MS + 2.5 s
    send(b'{"ts": "soon"}')  # unreadable
    send(b"not json at all")  # unreadable
    send(b'{"ts": %d}' % (BASE_MS + 12_000))
    write.raw_control(b"junk", b"not json")
    frame = events(spark, broker.bootstrap_servers, [topic], control, event_time_field="ts")
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        offset = job.source_offset()
        assert offset["watermark"] == BASE_MS + 11_000
        assert offset["counters"]["records_unreadable"] == 2
        assert offset["counters"]["control_malformed"] == 1
        send(b'{"ts": %d}' % (BASE_MS + 3_000))  # below the applied 11 s: late
        send(b'{"ts": %d}' % (BASE_MS + 20_000))
        job.settle()
        assert job.source_offset()["counters"]["records_late"] == 1
        assert job.windows() == {(0, 5): 2, (10, 15): 1}  # the late record is not counted
    finally:
        job.stop()


def test_missing_control_topic_leaves_the_valve_on_data_alone(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, *range(0, 12))
    write.data(1, *range(0, 12))
    frame = events(spark, broker.bootstrap_servers, [topic], f"no-such-{topic}")
    job = window_job(spark, frame, tmp_path)
    try:
        job.settle()
        assert job.source_offset()["watermark"] == BASE_MS + 10_000
        assert job.windows() == {(0, 5): 10, (5, 10): 10}  # [5, 10) ends at the watermark
    finally:
        job.stop()


def test_marker_for_a_partition_the_broker_does_not_list_neither_stalls_nor_is_lost(
    spark: SparkSession,
    broker: KafkaBroker,
    admin: AdminClient,
    new_topic: TopicFactory,
    tmp_path: Path,
) -> None:
    topic, control, write = _setup(broker, new_topic, 2)
    for partition in range(2):
        write.data(partition, *range(0, 12))
    write.marker(3, FINISHED, offset=0)  # partition 3 does not exist (yet)
    write.raw_control(f"{topic}:0".encode(), None)  # a tombstone: skipped, counted apart
    job = window_job(spark, events(spark, broker.bootstrap_servers, [topic], control), tmp_path)
    try:
        job.settle()
        offset = job.source_offset()
        # No channel for partition 3: the valve is the min of the two real ones.
        assert offset["watermark"] == BASE_MS + 10_000
        assert list(SourceOffset.decode(offset).statuses()) == [f"{topic}:0", f"{topic}:1"]
        assert len(offset["held"]) == 1
        assert offset["counters"]["control_tombstones"] == 1
        assert "control_malformed" not in offset["counters"]
        assert job.windows() == {(0, 5): 10, (5, 10): 10}
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        write = Writer(broker.bootstrap_servers, topic, control)  # knows the new partitions
        write.data(2, *range(12, 30))
        for partition in range(2):
            write.data(partition, *range(12, 30))
        job.settle()
        offset = job.source_offset()
        # Partition 3 appeared: its held FINISHED joined it; the valve ignores it.
        assert offset["held"] == []
        statuses = SourceOffset.decode(offset).statuses()
        assert statuses[f"{topic}:3"] == "FINISHED"
        assert offset["watermark"] == BASE_MS + 28_000
    finally:
        job.stop()


def test_subscribe_pattern_and_max_offsets_per_trigger(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    prefix = f"pat{uuid.uuid4().hex[:6]}"
    first, second = new_topic(partitions=1, prefix=prefix), new_topic(partitions=1, prefix=prefix)
    control = new_topic(partitions=1, prefix="ctl")
    for topic in (first, second):
        Writer(broker.bootstrap_servers, topic, control).data(0, *range(0, 20))
    spark.dataSource.register(SlackwaterKafkaSource)
    frame = (
        spark.readStream.format("slackwater-kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribePattern", f"{prefix}-.*")
        .option("controlTopic", control)
        .option("maxOutOfOrderness", "1s")
        .option("maxOffsetsPerTrigger", "10")
        .load()
    )
    job = window_job(spark, with_valve_watermark(frame), tmp_path)
    try:
        job.settle()
        offset = job.source_offset()
        assert sorted(SourceOffset.decode(offset).data) == sorted([first, second])
        assert offset["watermark"] == BASE_MS + 18_000
        # At most 10 records per batch (plus the synthetic row), and nothing lost.
        rows_per_batch = [p["numInputRows"] for p in job.query.recentProgress]
        assert max(rows_per_batch) <= 11 and offset["counters"]["records"] == 40
        assert job.windows() == {(0, 5): 10, (5, 10): 10, (10, 15): 10}
    finally:
        job.stop()


def test_consumer_idle_timeout_idles_a_silent_partition_without_an_emitter(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """The fallback of semantics.md §6 (Flink's withIdleness): no control topic, no marker; a
    partition that gets no record for the timeout leaves the minimum."""
    import time

    topic = new_topic(partitions=2)
    write = Writer(broker.bootstrap_servers, topic, "unused")
    write.data(0, *range(0, 21))
    write.data(1, 0, 1, 2)  # then silent
    spark.dataSource.register(SlackwaterKafkaSource)
    frame = (
        spark.readStream.format("slackwater-kafka")
        .option("kafka.bootstrap.servers", broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("maxOutOfOrderness", "1s")
        .option("consumerIdleTimeout", "2s")
        .load()
    )
    job = window_job(spark, with_valve_watermark(frame), tmp_path)
    checkpoint = tmp_path / f"checkpoint-{job.table}"
    try:
        job.settle()
        deadline = time.monotonic() + 120
        while job.source_offset()["watermark"] != BASE_MS + 19_000:
            assert time.monotonic() < deadline, job.source_offset()["watermark"]
            time.sleep(0.5)
        # The batches' planned watermarks, in order: p1 held the minimum while its records
        # were new (the plan that applied them started its idle clock), then left it once
        # it had none for the timeout. How many plans that took is the machine's speed (on
        # a busy one, the next plan can already be 2 s later); the order is the rule's.
        planned = [
            planned_batch(checkpoint, batch).slackwater_offset()["watermark"]
            for batch in sorted(batch_ids(checkpoint, "offsets"))
        ]
        held = planned.index(BASE_MS + 1_000)  # p1 holds the minimum
        assert all(w <= BASE_MS + 1_000 for w in planned[:held]), planned
        assert planned[-1] == BASE_MS + 19_000 and max(planned) == BASE_MS + 19_000, planned
        job.settle()
        assert job.windows() == {(0, 5): 5 + 3, (5, 10): 5, (10, 15): 5}

        # Data on the idled partition makes it ACTIVE again (data beats the timeout), in
        # the plan that applies it (a later one may idle it again, 2 s on: a busy
        # machine's next plan can be that late).
        def p1_status(batch: int) -> str:
            offset = planned_batch(checkpoint, batch).slackwater_offset()
            return partitions_of(SourceOffset.decode(offset))[f"{topic}:1"][0]

        before = max(batch_ids(checkpoint, "offsets"))
        assert p1_status(before) == "IDLE"
        write.data(1, 22)
        job.settle()
        after = sorted(batch for batch in batch_ids(checkpoint, "offsets") if batch > before)
        assert "ACTIVE" in [p1_status(batch) for batch in after]
    finally:
        job.stop()


def test_progress_that_never_comes_is_one_clear_error(
    broker: KafkaBroker, new_topic: TopicFactory
) -> None:
    """The planner on its own, against the broker: a range of the last batch whose
    readers never reported fails after the timeout, naming the range."""
    topic, control = new_topic(partitions=1), new_topic(partitions=1, prefix="ctl")
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": broker.bootstrap_servers,
            "subscribe": topic,
            "controlTopic": control,
            "progressTimeoutMs": "1500",
        }
    )
    reader = SlackwaterStreamReader(options)
    try:
        start = reader.initialOffset()
        # As if a batch had read [0, 5) of partition 0 but no reader reported it.
        planned = SourceOffset.decode(start)
        start = dataclasses.replace(
            planned, data_from={topic: {"0": 0}}, data={topic: {"0": 5}}, plan_id=uuid.uuid4().hex
        ).encode()
        with pytest.raises(SourceError, match=rf"no progress after 2s .*{topic}:0:0-5"):
            reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()


def test_a_planner_takes_only_its_own_clients_failed_authentication() -> None:
    """Two queries in one driver: one's failed authentication never ends the other."""
    from confluent_kafka import KafkaError

    from slackwater import kafka_logging

    given = {"kafka.bootstrap.servers": f"127.0.0.1:{free_port()}", "subscribe": "t"}
    refused, healthy = (SlackwaterStreamReader(SourceOptions.parse(given)) for _ in range(2))
    words = "sasl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed"
    kafka_logging.client_logging(refused.kafka.client("admin"))["error_cb"](
        KafkaError(KafkaError._AUTHENTICATION, words)
    )
    try:
        assert healthy.kafka.authentication_failure() is None
        failure = refused.kafka.authentication_failure()
        assert failure is not None and failure.str() == words
    finally:
        refused.stop()
        healthy.stop()


def test_each_planner_client_keeps_its_own_failure_when_another_answers() -> None:
    """Issue 31, finding 8: the planner's admin, control and progress clients have a name
    each. The admin answering a plan takes the admin's failure only; the control
    consumer's (a rotated password refused on its new connection) is kept, and its next
    consume call that brings nothing ends the query with the planner's one line. With one
    name for the three, the admin's answer discarded it and the control read waited
    readTimeoutMs, then said "timed out reading control topic"."""
    from confluent_kafka import KafkaError

    from slackwater import kafka_logging

    given = {
        "kafka.bootstrap.servers": f"127.0.0.1:{free_port()}",
        "subscribe": "t",
        "kafka.sasl.username": "orders-job",
    }
    planner = SlackwaterStreamReader(SourceOptions.parse(given))
    broker = planner.kafka
    assert len({broker.client(role) for role in ("admin", "control", "progress")}) == 3
    control = broker.consumer("control")
    words = "sasl://127.0.0.1:1/1: SASL authentication error: Authentication failed"
    kafka_logging.client_logging(broker.client("control"))["error_cb"](
        KafkaError(KafkaError._AUTHENTICATION, words)
    )
    try:
        assert broker.authentication_failure() is None  # the admin answered: its own only
        with pytest.raises(SourceError) as ended:
            control.consume(num_messages=1, timeout=0)
        assert str(ended.value) == (
            f"planner (driver): authentication failed as 'orders-job': {words}"
        )
    finally:
        control.close()
        planner.stop()
