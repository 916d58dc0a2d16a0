"""A Kafka source for Spark Structured Streaming, as a Spark 4 Python data source.

Spark's own Kafka connector is a separate Maven artifact that pyspark does not
ship (DESIGN §6); this source reads Kafka with confluent-kafka instead, with
the columns of Spark's built-in source, and produces Arrow record batches.

    spark.dataSource.register(KafkaDataSource)
    df = (spark.readStream.format("slackwater-kafka-positions")
          .option("kafka.bootstrap.servers", "localhost:9092")
          .option("subscribe", "orders,payments")
          .option("startingOffsets", "earliest")
          .load())

Offsets, checkpointed by Spark, are ``{"<topic>": {"<partition>": next_offset}}``.
A micro-batch reads, per partition, ``[start, end)`` where ``end`` is the log
end when the batch was planned; partitions that appear later are read from
their earliest offset.

With ``.option("includeReadPositions", "true")`` every task also emits one
*position row* per partition it read: ``offset`` = the partition's read
position after the batch (the next offset to read, past any offset gap such as
transaction markers), ``timestampType`` = -1, key, value and timestamp null.
The slackwater pipeline aligns markers with these positions (DESIGN §3, §6).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SOURCE_NAME = "slackwater-kafka-positions"  # the old pipeline's source (issue 14 removes it)
POSITION_ROW_TIMESTAMP_TYPE = -1

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType(
                    [
                        StructField("key", StringType()),
                        StructField("value", BinaryType()),
                    ]
                )
            ),
        ),
    ]
)

ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
        pa.field(
            "headers",
            pa.list_(
                pa.struct(
                    [
                        pa.field("key", pa.string()),
                        pa.field("value", pa.binary()),
                    ]
                )
            ),
        ),
    ]
)


class KafkaSourceError(RuntimeError):
    """A micro-batch could not be planned or read."""


@dataclass(frozen=True)
class KafkaSourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str
    include_read_positions: bool
    kafka_config: dict[str, str]
    max_records_per_arrow_batch: int
    read_timeout_s: float
    request_timeout_s: float

    @classmethod
    def parse(cls, options: dict[str, str]) -> KafkaSourceOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        bootstrap = lowered.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise KafkaSourceError("option 'kafka.bootstrap.servers' is required")
        topics = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise KafkaSourceError("option 'subscribe' (comma-separated topics) is required")
        starting = lowered.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise KafkaSourceError(
                f"option 'startingOffsets' must be earliest or latest, got {starting!r}"
            )
        kafka_config = {
            key[len("kafka.") :]: value
            for key, value in options.items()
            if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers"
        }
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            starting_offsets=starting,
            include_read_positions=lowered.get("includereadpositions", "false") == "true",
            kafka_config=kafka_config,
            max_records_per_arrow_batch=int(lowered.get("maxrecordsperarrowbatch", "50000")),
            read_timeout_s=float(lowered.get("readtimeoutms", "60000")) / 1000,
            request_timeout_s=float(lowered.get("requesttimeoutms", "30000")) / 1000,
        )

    def client_config(self) -> dict[str, Any]:
        return {**self.kafka_config, "bootstrap.servers": self.bootstrap_servers}


class KafkaDataSource(DataSource):
    """``spark.readStream.format("slackwater-kafka-positions")``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(KafkaSourceOptions.parse(dict(self.options)))


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Kafka partition's offset range ``[start, end)`` in one micro-batch."""

    topic: str
    partition: int
    start: int
    end: int


Offsets = dict[str, dict[str, int]]


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options

    # The planning methods run in Spark's long-lived Python planner process.

    def _offsets(self, position: str) -> Offsets:
        """The ``earliest`` or ``latest`` offset of every partition of the topics, now.

        One metadata request and one ListOffsets round, not one request per
        partition.
        """
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient(self.options.client_config())
        timeout_s = self.options.request_timeout_s
        metadata = admin.list_topics(timeout=timeout_s)
        partitions = [
            TopicPartition(topic, partition)
            for topic in self.options.topics
            if (described := metadata.topics.get(topic)) is not None and described.error is None
            for partition in sorted(described.partitions)
        ]
        offsets: Offsets = {}
        if not partitions:
            return offsets
        spec = getattr(OffsetSpec, position)()
        futures = admin.list_offsets({tp: spec for tp in partitions}, request_timeout=timeout_s)
        for tp, future in futures.items():
            offset = future.result(timeout=timeout_s).offset
            offsets.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
        return offsets

    def initialOffset(self) -> Offsets:  # noqa: N802
        return self._offsets(self.options.starting_offsets)

    def latestOffset(self, start: Offsets, limit: Any = None) -> Offsets:  # noqa: N802
        latest = self._offsets("latest")
        # Never go backwards from what a previous batch already read.
        for topic, partitions in start.items():
            for partition, offset in partitions.items():
                current = latest.setdefault(topic, {}).get(partition)
                if current is None or current < offset:
                    latest[topic][partition] = offset
        return latest

    def partitions(self, start: Offsets, end: Offsets) -> list[KafkaInputPartition]:
        result = []
        for topic, partitions in sorted(end.items()):
            for partition, end_offset in sorted(partitions.items(), key=lambda kv: int(kv[0])):
                # A partition new since the last batch starts at its earliest (0 if unknown).
                begin = start.get(topic, {}).get(partition, 0)
                if end_offset > begin:
                    result.append(KafkaInputPartition(topic, int(partition), begin, end_offset))
        return result

    def commit(self, end: Offsets) -> None:
        pass  # offsets live in Spark's checkpoint, not in a consumer group

    # read() runs in executor Python workers: no state kept between calls.

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_partition(self.options, partition)


def read_partition(
    options: KafkaSourceOptions, split: KafkaInputPartition
) -> Iterator[pa.RecordBatch]:
    """Reads ``[start, end)`` of one partition as Arrow record batches."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **options.client_config(),
            "group.id": "slackwater-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    try:
        tp = TopicPartition(split.topic, split.partition, split.start)
        consumer.assign([tp])
        builder = _BatchBuilder(split.topic, split.partition)
        position = split.start
        deadline = time.monotonic() + options.read_timeout_s
        while position < split.end:
            messages = consumer.consume(num_messages=min(10_000, split.end - position), timeout=0.5)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaSourceError(
                        f"reading {split.topic}[{split.partition}] at {position}: {error}"
                    )
                offset = message.offset()
                assert offset is not None
                if offset >= split.end:
                    position = split.end
                    break
                builder.add(message)
                position = offset + 1
                if len(builder) >= options.max_records_per_arrow_batch:
                    yield builder.flush()
            if messages:
                deadline = time.monotonic() + options.read_timeout_s
            # Offset gaps (transaction markers, compaction): the consumer's
            # position moves past offsets that carry no record.
            consumer_position = consumer.position([TopicPartition(split.topic, split.partition)])
            if consumer_position and consumer_position[0].offset > position:
                position = min(consumer_position[0].offset, split.end)
            if position < split.end and time.monotonic() > deadline:
                raise KafkaSourceError(
                    f"timed out reading {split.topic}[{split.partition}] at {position}, "
                    f"expected up to {split.end}"
                )
        if len(builder):
            yield builder.flush()
        if options.include_read_positions:
            yield _position_row(split.topic, split.partition, split.end)
    finally:
        consumer.close()


class _BatchBuilder:
    """Column lists for one Arrow record batch."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, message: Any) -> None:
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(message.offset())
        timestamp_type, timestamp_ms = message.timestamp()
        self.timestamps.append(timestamp_ms * 1000 if timestamp_type else None)
        # librdkafka: 0 none, 1 create time, 2 log append time; Spark: 0 create, 1 append.
        self.timestamp_types.append(max(0, timestamp_type - 1))
        raw_headers = message.headers()
        self.headers.append(
            [{"key": k, "value": v} for k, v in raw_headers] if raw_headers else None
        )

    def flush(self) -> pa.RecordBatch:
        count = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.topic] * count, pa.string()),
                pa.array([self.partition] * count, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_types, pa.int32()),
                pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch


def _position_row(topic: str, partition: int, read_position: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [
            {
                "key": None,
                "value": None,
                "topic": topic,
                "partition": partition,
                "offset": read_position,
                "timestamp": None,
                "timestampType": POSITION_ROW_TIMESTAMP_TYPE,
                "headers": None,
            }
        ],
        schema=ARROW_SCHEMA,
    )
