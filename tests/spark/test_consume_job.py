"""`slackwater consume` on the source (spark_consumer/consume/job.py): Spark's own window
aggregations closed by the valve's watermark, and the late output.

Expected windows are computed here from the records written (`_expected`), by the rules
of semantics.md §6: a row counts in every window that holds it unless it arrived after all of
them had ended; such rows, and unreadable ones, are in the late output.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.consume.config import ConsumerConfig
from spark_consumer.consume.job import ConsumeJob, start
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.source_jobs import iso_ms, late_output_rows

IDLE, FINISHED = MarkerStatus.IDLE, MarkerStatus.FINISHED


class Records:
    """JSON records {"ts", "amount", "id"} with a Kafka key, and what was written."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self.written: list[tuple[str, float, float, int]] = []  # key, second, amount, id

    def add(self, partition: int, key: str, *seconds: float, topic: str | None = None) -> None:
        for second in seconds:
            amount, ident = second * 2, int(second) % 3
            value = {"ts": BASE_MS + int(second * 1000), "amount": amount, "id": ident}
            self.writer.producer.produce(
                topic or self.writer.topic,
                key=key.encode(),
                value=json.dumps(value).encode(),
                partition=partition,
            )
            self.written.append((key, second, amount, ident))
            if topic is None:
                self.writer.log_end[partition] = self.writer.log_end.get(partition, 0) + 1
        assert self.writer.producer.flush(10) == 0


def _expected(
    rows: list[tuple[str, float, float, int]], size_s: float, slide_s: float
) -> dict[tuple[float, str], dict[str, float]]:
    """{(window start s, key): count, sum, max, distinct ids} over the given rows."""
    found: dict[tuple[float, str], list[tuple[float, int]]] = defaultdict(list)
    for key, second, amount, ident in rows:
        last_start = math.floor(second / slide_s) * slide_s
        start = last_start
        while start > second - size_s:
            found[(start, key)].append((amount, ident))
            start -= slide_s
    return {
        where: {
            "count": len(values),
            "sum_amount": sum(a for a, _ in values),
            "max_amount": max(a for a, _ in values),
            "approx_distinct_id": len({i for _, i in values}),
        }
        for where, values in found.items()
    }


def _output(spark: SparkSession, path: Path) -> list[dict[str, Any]]:
    """The committed rows of Spark's file sink (its metadata log decides what counts)."""
    if not (path / "_spark_metadata").exists():
        return []
    return [row.asDict() for row in spark.read.json(str(path)).collect()]


def _by_window(rows: list[dict[str, Any]]) -> dict[tuple[float, str], dict[str, float]]:
    result: dict[tuple[float, str], dict[str, float]] = {}
    for row in rows:
        start = _seconds(row["window_start"])
        values = {k: row[k] for k in ("count", "sum_amount", "max_amount", "approx_distinct_id")}
        assert (start, row["key"]) not in result, f"window written twice: {row}"
        result[(start, row["key"])] = values
    return result


def _seconds(iso: str) -> float:
    return (iso_ms(iso) - BASE_MS) / 1000


def _config(bootstrap: str, control: str, tmp: Path, **settings: Any) -> ConsumerConfig:
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "control_topic": control,
        "max_out_of_orderness_ms": 1_000,
        "event_time_field": "ts",
        "output": str(tmp / "out"),
        "checkpoint": str(tmp / "checkpoint"),
        "trigger_ms": 200,
        "metrics_port": None,
        "aggregations": ("sum:amount", "max:amount", "approx_distinct:id"),
        **settings,
    }
    return ConsumerConfig(**values)


def _settle(job: ConsumeJob) -> None:
    job.query.processAllAvailable()
    assert job.query.exception() is None, job.query.exception()


def test_tumbling_windows_close_on_the_valve_and_dropped_rows_reach_the_late_output(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=3), new_topic(partitions=1, prefix="ctl")
    writer = Writer(broker.bootstrap_servers, topic, control)
    records = Records(writer)
    records.add(0, "k0", *range(25))
    records.add(1, "k1", *range(25))
    records.add(2, "k2", *range(5))  # then quiet: the emitter would mark it IDLE
    writer.marker(2, IDLE)
    config = _config(broker.bootstrap_servers, control, tmp_path, topics=(topic,), window_ms=10_000)
    job = start(spark, config)
    try:
        _settle(job)
        # V = min(24 s on p0, 24 s on p1) - 1 s = 23 s; p2 is IDLE and left out.
        on_time = list(records.written)
        expected = _expected(on_time, 10, 10)
        closed = {w: v for w, v in expected.items() if w[0] + 10 <= 23}
        assert _by_window(_output(spark, tmp_path / "out")) == closed
        # A row whose window ended (3 s: [0, 10) ended at 10 <= 23) is dropped and goes to
        # the late output; one whose window is open (21 s < 23 s, [20, 30)) still counts.
        dropped_offset = writer.log_end[0]
        records.add(0, "k0", 3)
        records.add(0, "k0", 21)
        writer.producer.produce(topic, key=b"k1", value=b"not json", partition=1)
        assert writer.producer.flush(10) == 0
        unreadable_offset = writer.log_end[1]
        writer.log_end[1] += 1
        _settle(job)
        for partition in range(3):
            writer.marker(partition, FINISHED)
        _settle(job)
        counted = records.written[:-2] + records.written[-1:]  # all but the dropped row
        assert _by_window(_output(spark, tmp_path / "out")) == _expected(counted, 10, 10)
        late = late_output_rows(Path(config.effective_late_output))
        assert [(r["topic"], r["partition"], r["offset"], r["reason"]) for r in late] == [
            (topic, 0, dropped_offset, "late"),
            (topic, 1, unreadable_offset, "unreadable: value is not JSON"),
        ]
        assert late[0]["event_time"] == "2023-11-14T22:13:23.000Z"
        assert late[1]["event_time"] is None
    finally:
        job.stop()


def test_sliding_windows_over_two_topics_each_row_in_every_window_that_holds_it(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    orders, refunds = new_topic(partitions=2), new_topic(partitions=1)
    control = new_topic(partitions=1, prefix="ctl")
    writer = Writer(broker.bootstrap_servers, orders, control)
    records = Records(writer)
    records.add(0, "a", *range(0, 20, 2))
    records.add(1, "b", *range(1, 20, 2))
    records.add(0, "a", 4.5, 13, topic=refunds)
    config = _config(
        broker.bootstrap_servers,
        control,
        tmp_path,
        topics=(orders, refunds),
        window_ms=10_000,
        slide_ms=5_000,
    )
    job = start(spark, config)
    try:
        _settle(job)
        for partition in range(2):
            writer.marker(partition, FINISHED)
        writer.topic, writer.log_end = refunds, {0: 2}  # the refunds topic's one partition
        writer.marker(0, FINISHED)
        _settle(job)
        assert _by_window(_output(spark, tmp_path / "out")) == _expected(records.written, 10, 5)
        assert late_output_rows(Path(config.effective_late_output)) == []
    finally:
        job.stop()


def test_session_windows_by_a_topic_pattern(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    writer = Writer(broker.bootstrap_servers, topic, control)
    records = Records(writer)
    records.add(0, "ann", 0, 1, 2, 10, 11)  # sessions [0, 5) and [10, 14) with a 3 s gap
    records.add(1, "bob", 0, 5)  # [0, 3) and [5, 8)
    config = _config(
        broker.bootstrap_servers,
        control,
        tmp_path,
        topic_pattern=f"{topic}$",
        session_gap_ms=3_000,
        aggregations=("sum:amount",),
    )
    job = start(spark, config)
    try:
        _settle(job)
        writer.marker(0, FINISHED)
        writer.marker(1, FINISHED)
        _settle(job)
        sessions = {
            (_seconds(r["window_start"]), _seconds(r["window_end"]), r["key"]): (
                r["count"],
                r["sum_amount"],
            )
            for r in _output(spark, tmp_path / "out")
        }
        assert sessions == {
            (0, 5, "ann"): (3, 6.0),
            (10, 14, "ann"): (2, 42.0),
            (0, 3, "bob"): (1, 0.0),
            (5, 8, "bob"): (1, 10.0),
        }
    finally:
        job.stop()
