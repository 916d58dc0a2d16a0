"""Makes ``checkpoint/`` and ``topics.json`` of this folder with the code of commit 1aaa609
(README.md says how to run it). Not a test: it imports that commit's modules, from a
worktree put first on ``PYTHONPATH``.

It starts Apache Kafka (the old tree's ``KafkaBroker``, the old tests' broker settings),
writes JSON records to a topic of two partitions and an IDLE marker to a control topic,
and runs a query on the old source until it has read them (data, the marker, data, each
data batch followed by one for the watermark its records make); it stops the query,
writes more records to both partitions and runs it once more with
``trigger(once=True)``, so that its last batch reads both partitions and no batch follows
it. It keeps the checkpoint's files Spark reads on a restart, and every record of the
three topics (the progress topic as the old readers wrote it).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import Marker, MarkerStatus, encode
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream

HERE = Path(__file__).resolve().parent
DATA, CONTROL = "sw1aaa609-orders", "sw1aaa609-control"
PROGRESS = f"{CONTROL}.progress"  # the old source's default: <controlTopic>.progress
BASE_MS = 1_700_000_000_000  # tests/harness/kafka_writer.BASE_MS
SETTINGS = {"log.retention.ms": "-1", "log.cleaner.backoff.ms": "200"}  # the tests' broker


def record(second: int, n: int) -> bytes:
    """A data record: ``ts`` (the field the old query reads) and ``at`` (30 s later)."""
    ts = BASE_MS + second * 1000
    return json.dumps({"n": n, "ts": ts, "at": ts + 30_000}).encode()


def write(producer: Producer, partition: int, *seconds: int) -> None:
    for second in seconds:
        value = record(second, second)
        producer.produce(DATA, value=value, partition=partition, timestamp=BASE_MS + second * 1000)
        assert producer.flush(10) == 0


def dump(bootstrap: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    """Every record of ``topic``, in partition and offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "dump",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records, ended = [], set()
    while len(ended) < partitions:
        message = consumer.poll(10)
        assert message is not None, f"no end of {topic}"
        if message.error():
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            ended.add(message.partition())
            continue
        records.append(
            {
                "partition": message.partition(),
                "offset": message.offset(),
                "timestamp": message.timestamp()[1],
                "key": None if message.key() is None else message.key().decode(),
                "value": message.value().decode(),
            }
        )
    consumer.close()
    return sorted(records, key=lambda r: (r["partition"], r["offset"]))


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="old1aaa609-"))
    broker = KafkaBroker(log_dir=work / "kafka", settings=SETTINGS).start()
    spark = None
    try:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [
            NewTopic(DATA, num_partitions=2, replication_factor=1),
            NewTopic(CONTROL, 1, 1, config={"cleanup.policy": "compact"}),
        ]
        for future in admin.create_topics(topics).values():
            future.result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        spark = spark_session("checkpoint-1aaa609")
        checkpoint = work / "checkpoint"
        frame = read_stream(
            spark,
            bootstrap_servers=bootstrap,
            topics=[DATA],
            control_topic=CONTROL,
            max_out_of_orderness="1s",
            event_time_field="ts",
            starting_offsets="earliest",
        )
        rows = frame.select("topic", "partition", "offset", "event_time", "late")
        query = rows.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        query = query.start()
        write(producer, 0, 1, 2, 3)  # batch 0: both partitions (1: its watermark)
        write(producer, 1, 1, 2)
        query.processAllAvailable()
        idle = Marker(
            topic=DATA,
            partition=1,
            status=MarkerStatus.IDLE,
            offset=2,
            emitted_at=0,
            emitter_id="maker",
            epoch=1,
            seq=0,
        )
        key, value = encode(idle)
        producer.produce(CONTROL, key=key, value=value, partition=0)  # batch 2: the marker
        assert producer.flush(10) == 0
        query.processAllAvailable()
        write(producer, 0, 4, 5)  # batch 3: partition 0 alone (4: its watermark)
        query.processAllAvailable()
        assert query.exception() is None, query.exception()
        query.stop()
        # A last batch that reads both partitions, and no batch after it: the restart's
        # first plan waits for its two tasks' progress (a query that runs on plans one
        # more batch for the watermark its records make).
        write(producer, 0, 6, 7)
        write(producer, 1, 3)  # data beats the IDLE marker: partition 1 ACTIVE again
        once = rows.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        last = once.trigger(once=True).start()
        assert last.awaitTermination(120), "the last batch did not end"
        assert last.exception() is None, last.exception()
        kept = HERE / "checkpoint"
        shutil.rmtree(kept, ignore_errors=True)
        # What Spark reads on a restart: no checksum files (Hadoop's local file system
        # reads a file without its .crc), nothing hidden.
        shutil.copytree(checkpoint, kept, ignore=shutil.ignore_patterns("*.crc", ".*"))
        dumped = {
            DATA: dump(bootstrap, DATA, 2),
            CONTROL: dump(bootstrap, CONTROL, 1),
            PROGRESS: dump(bootstrap, PROGRESS, 1),
        }
        (HERE / "topics.json").write_text(json.dumps(dumped, indent=1) + "\n")
        print(sorted(str(p.relative_to(kept)) for p in kept.rglob("*")), file=sys.stderr)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
