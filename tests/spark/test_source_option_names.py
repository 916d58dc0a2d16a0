"""A misspelt option reaches the job's stderr as one line, once per query start (issue
43, item 4; docs/source.md, "Options the source does not know").

The line is said in Spark's Python process for the source's planner, whose stderr the
JVM copies to its ``System.err``: the test points that at a file while its query runs.
Spark parses the options there and, before it, when ``load()`` asks the schema; the
readers on the executors get them parsed. One line, not three."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import SparkSession

from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SOURCE_NAME, SlackwaterKafkaSource
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory


def _planned_to(progress: dict[str, Any], topic: str) -> dict[str, int] | None:
    """Where a batch's offset plans ``topic``'s partitions to."""
    end = progress["sources"][0]["endOffset"]
    return SourceOffset.decode(json.loads(end) if isinstance(end, str) else end).data.get(topic)


def test_a_misspelt_option_is_one_line_on_the_jobs_stderr_and_ignored(
    spark: SparkSession,
    broker: KafkaBroker,
    new_topic: TopicFactory,
    tmp_path: Path,
    jvm_stderr: Path,
) -> None:
    """Before issue 43's item 4, ``maxOffsetPerTrigger`` (``maxOffsetsPerTrigger``
    misspelt) was taken without a word. Spark hands the source its options' names in
    lower case; ``kafka.*`` goes to the clients and ``load(path)``'s ``path`` is
    Spark's own: neither is a line."""
    topic = new_topic(partitions=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
    for n in range(3):
        producer.produce(topic, key=b"k", value=f"{n}".encode(), partition=0)
    assert producer.flush(30) == 0
    spark.dataSource.register(SlackwaterKafkaSource)
    given = {
        "kafka.bootstrap.servers": broker.bootstrap_servers,
        "kafka.client.id": "option-names-test",
        "subscribe": topic,
        "STARTINGOFFSETS": "earliest",
        "endingOffsets": "latest",
        "maxOffsetPerTrigger": "1",
    }
    frame = spark.readStream.format(SOURCE_NAME).options(**given).load(str(tmp_path / "a-path"))
    table = f"names_{uuid.uuid4().hex[:10]}"
    query = (
        frame.filter("topic IS NOT NULL")  # the rows read, not the watermark's own
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the bounded run did not end"
        assert query.exception() is None
        read = spark.sql(f"SELECT offset FROM {table}").collect()
        assert sorted(row.offset for row in read) == [0, 1, 2]
        ends = [_planned_to(progress, topic) for progress in query.recentProgress]
    finally:
        query.stop()
    # Ignored, as the line says: every batch planned to the log end (the option: 1, 2, 3).
    assert ends and all(end == {"0": 3} for end in ends), ends
    said = [line for line in jvm_stderr.read_text().splitlines() if "the source knows" in line]
    assert said == [
        "option 'maxoffsetpertrigger' is not one the source knows, ignored "
        "(nearest known name: 'maxOffsetsPerTrigger')"
    ]
