"""The slackwater Kafka source: the valve's watermark as Spark's own (semantics.md §6).

    events = read_stream(spark, bootstrap_servers="host:9092", topics=["orders"],
                         control_topic="slackwater.control", max_out_of_orderness="2s")
    events.groupBy(F.window("event_time", "10 seconds"), "key").count()

or, as a two-line change to an existing job:

    frame = spark.readStream.format("slackwater-kafka").option(...).load()
    events = with_valve_watermark(frame)

How the valve's watermark V becomes Spark's: every micro-batch carries one synthetic
row whose event time is V + D, D being the ``withWatermark`` delay (36,500 days). Real
rows give ``max(event time) - D``, far below V, so Spark's watermark is exactly V.
``with_valve_watermark`` removes the row again, with a predicate on the event-time
column (one without it would be pushed below the watermark node). Spark applies
batch N's watermark from batch N+1 on:

    batch        N-1              N                  N+1
    planned      V(N-1)           V(N)               V(N+1)   (latestOffset, driver side)
    applied      ...              V(N-1)             V(N)     (Spark's watermark)
    late rows    event < ...      event < V(N-1)     event < V(N)

The driver side (``latestOffset``) runs semantics.md §6's steps in order: the previous
batch's progress (records, newest event time per range, produced by the readers to a
progress topic) advances the channels; new markers are read from the control topic
and applied once the read position (the end of the last batch whose progress arrived)
reaches their offset; the valve's output is planned into this batch's synthetic row.
The offset it returns records the data end offsets, the control and progress topic
positions and the aligner/valve state: Spark logs it before running the batch, so a
replay plans the same row and a restart continues from it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from slackwater import kafka_clients, list_offsets
from slackwater.kafka_logging import once_per_interval
from slackwater.markers import MalformedControlRecord, Marker, Tombstone, decode
from slackwater.settings import parse_duration_ms, parse_optional_duration_ms
from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.event_time import (
    MAX_EVENT_TIME_MS,
    UnreadableEventTime,
    from_json_field,
    from_timestamp,
)
from spark_consumer.late_rows import LATE_ONLY, DroppedRow, LateRule, write_range
from spark_consumer.valve import MIN_WATERMARK

log = logging.getLogger(__name__)
# Repeats while the broker is away: one line per kind per 30 s.
log_unreachable = once_per_interval(f"{__name__}.connection")

SOURCE_NAME = "slackwater-kafka"
# The default withWatermark delay D: so large that the synthetic row (V + D) alone sets
# Spark's watermark (real rows give newest - D, far below V).
WATERMARK_DELAY_DAYS = 36_500
WATERMARK_DELAY_MS = WATERMARK_DELAY_DAYS * 86_400_000
# Where the schema tells with_valve_watermark the D the source plans with.
WATERMARK_DELAY_METADATA = "slackwater.watermarkDelayMs"
EVENT_TIME = "event_time"
LATE = "late"
OFFSET_VERSION = 1
# Markers for partitions the broker does not list, kept until the partition appears.
MAX_HELD_MARKERS = 1_000

# Spark's Kafka source's columns, in its order, then the source's own two.
KAFKA_SCHEMA = StructType(
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

KAFKA_ARROW_SCHEMA = pa.schema(
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

SCHEMA = StructType(
    [
        *KAFKA_SCHEMA.fields,
        StructField(EVENT_TIME, TimestampType()),
        StructField(LATE, BooleanType()),
    ]
)
ARROW_SCHEMA = KAFKA_ARROW_SCHEMA.append(pa.field(EVENT_TIME, pa.timestamp("us", tz="UTC"))).append(
    pa.field(LATE, pa.bool_())
)

# Consumer settings that a producer (the readers' progress records) must not get.
_CONSUMER_ONLY = (
    "isolation.level",
    "group.",
    "auto.offset.reset",
    "enable.auto",
    "fetch.",
    "max.poll",
    "session.timeout",
    "heartbeat",
    "partition.assignment",
    "queued.",
    "check.crcs",
)

Offsets = dict[str, dict[str, int]]


def _retriable_offset_errors() -> frozenset[int]:
    """ListOffsets errors Kafka's protocol marks retriable (a RetriableException in the
    Java client) that librdkafka's admin result does not flag ``retriable()``: what a
    partition answers while it is being created or its leader moves."""
    from confluent_kafka import KafkaError

    names = (
        "NOT_LEADER_FOR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "UNKNOWN_TOPIC_OR_PART",
        "REPLICA_NOT_AVAILABLE",
        "OFFSET_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "NOT_ENOUGH_REPLICAS",
        "KAFKA_STORAGE_ERROR",
        "REQUEST_TIMED_OUT",
    )
    return frozenset(getattr(KafkaError, n) for n in names if hasattr(KafkaError, n))


_RETRIABLE_OFFSET_ERRORS = _retriable_offset_errors()


class SourceError(RuntimeError):
    """The source cannot plan or read a batch; the message says what and where."""


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, named as Spark's Kafka source names them where it has one."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    topic_pattern: str | None
    control_topic: str | None
    max_out_of_orderness_ms: int
    event_time_field: str | None
    starting_offsets: str
    max_offsets_per_trigger: int | None
    kafka_config: dict[str, str]
    progress_timeout_s: float
    request_timeout_s: float
    read_timeout_s: float
    max_records_per_arrow_batch: int
    watermark_delay_ms: int = WATERMARK_DELAY_MS
    # Where readers write the rows the job's aggregation drops (late_rows.py), or None.
    late_output: str | None = None
    late_rule: LateRule = LATE_ONLY
    progress_topic_name: str | None = None
    # Flink's withIdleness as a fallback without an emitter (semantics.md §6), or None (off).
    consumer_idle_timeout_ms: int | None = None

    @classmethod
    def parse(cls, options: dict[str, str]) -> SourceOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        bootstrap = lowered.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise SourceError("option 'kafka.bootstrap.servers' is required")
        topics = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
        pattern = lowered.get("subscribepattern") or None
        if bool(topics) == bool(pattern):
            raise SourceError("exactly one of the options 'subscribe' and 'subscribePattern'")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise SourceError(f"option 'subscribePattern' is not a regex: {error}") from None
        starting = lowered.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise SourceError(f"option 'startingOffsets' must be earliest or latest: {starting!r}")
        try:
            out_of_orderness_ms = parse_duration_ms(lowered.get("maxoutoforderness", "0s"))
        except ValueError as error:
            raise SourceError(f"option 'maxOutOfOrderness': {error}") from None
        try:
            delay_ms = parse_duration_ms(lowered.get("watermarkdelay", WATERMARK_DELAY_MS))
        except ValueError as error:
            raise SourceError(f"option 'watermarkDelay': {error}") from None
        if not 1 <= delay_ms <= WATERMARK_DELAY_MS:
            raise SourceError(
                f"option 'watermarkDelay' must be between 1 ms and {WATERMARK_DELAY_DAYS} days:"
                f" {delay_ms} ms"
            )
        try:
            late_rule = LateRule.parse(lowered.get("laterule", "late"))
        except ValueError as error:
            raise SourceError(f"option 'lateRule': {error}") from None
        try:
            idle_timeout_ms = parse_optional_duration_ms(lowered.get("consumeridletimeout"))
        except ValueError as error:
            raise SourceError(f"option 'consumerIdleTimeout': {error} (or off)") from None
        if idle_timeout_ms is not None and idle_timeout_ms < 1:
            raise SourceError("option 'consumerIdleTimeout' must be positive (or off)")
        max_per_trigger = lowered.get("maxoffsetspertrigger")
        if max_per_trigger is not None and (
            not max_per_trigger.isdigit() or int(max_per_trigger) < 1
        ):
            raise SourceError(
                f"option 'maxOffsetsPerTrigger' must be a positive integer: {max_per_trigger!r}"
            )
        kafka_config = {
            key[len("kafka.") :]: value
            for key, value in options.items()
            if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers"
        }
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            topic_pattern=pattern,
            control_topic=lowered.get("controltopic") or None,
            max_out_of_orderness_ms=out_of_orderness_ms,
            event_time_field=lowered.get("eventtimefield") or None,
            starting_offsets=starting,
            max_offsets_per_trigger=int(max_per_trigger) if max_per_trigger else None,
            kafka_config=kafka_config,
            progress_timeout_s=float(lowered.get("progresstimeoutms", "120000")) / 1000,
            request_timeout_s=float(lowered.get("requesttimeoutms", "30000")) / 1000,
            read_timeout_s=float(lowered.get("readtimeoutms", "60000")) / 1000,
            max_records_per_arrow_batch=int(lowered.get("maxrecordsperarrowbatch", "50000")),
            watermark_delay_ms=delay_ms,
            late_output=lowered.get("lateoutput") or None,
            late_rule=late_rule,
            progress_topic_name=lowered.get("progresstopic") or None,
            consumer_idle_timeout_ms=idle_timeout_ms,
        )

    @property
    def max_planned_watermark_ms(self) -> int:
        """The highest V a synthetic row can carry (V + D must stay a Spark timestamp):
        the planned form of MAX_WATERMARK, after which every window has ended."""
        return MAX_EVENT_TIME_MS - self.watermark_delay_ms

    def client_config(self) -> dict[str, Any]:
        return kafka_clients.client_settings("source", self.bootstrap_servers, self.kafka_config)

    def producer_config(self) -> dict[str, Any]:
        return {
            key: value
            for key, value in self.client_config().items()
            if not key.startswith(_CONSUMER_ONLY)
        }

    @property
    def progress_topic(self) -> str:
        """Where readers report each range's progress: named from the control topic
        unless the option ``progressTopic`` names it."""
        return self.progress_topic_name or f"{self.control_topic or 'slackwater'}.progress"

    @property
    def read_committed(self) -> bool:
        # librdkafka's default, as Spark's Kafka source is read_uncommitted by default.
        return self.kafka_config.get("isolation.level", "read_committed") == "read_committed"

    def subscribes(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def channel(topic: str, partition: int | str) -> str:
    """A valve channel: one partition of one subscribed topic."""
    return f"{topic}:{partition}"


# -------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class Progress:
    """What a reader saw in one range: the driver needs nothing else of the data."""

    records: int
    max_event_time_ms: int | None
    max_offset: int
    late: int
    unreadable: int
    # Rows written to the late output (the option lateOutput), else 0.
    dropped: int = 0
    # Spark's id of the batch that read the range (its task's local property).
    batch_id: int | None = None

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Progress:
        raw = json.loads(value)
        return cls(
            records=int(raw["records"]),
            max_event_time_ms=None
            if raw["max_event_time_ms"] is None
            else int(raw["max_event_time_ms"]),
            max_offset=int(raw["max_offset"]),
            late=int(raw["late"]),
            unreadable=int(raw["unreadable"]),
            dropped=int(raw.get("dropped", 0)),
            batch_id=None if raw.get("batch_id") is None else int(raw["batch_id"]),
        )


def progress_key(
    *, topic: str, partition: int, start: int, end: int, late_threshold_ms: int, event_time: str
) -> str:
    """The same range read with the same settings gives the same record: retries and
    replays only repeat it."""
    return f"{topic}:{partition}:{start}-{end}:{late_threshold_ms}:{event_time}"


# ------------------------------------------------------------------------ partitions


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Kafka partition's ``[start, end)`` in one micro-batch."""

    topic: str
    partition: int
    start: int
    end: int
    # The watermark Spark evicts state by in this batch (the previous batch's plan).
    late_threshold_ms: int
    # The one before it, and Spark's id of the batch that planned it: with this batch's
    # id they give the watermark Spark judges late rows by (late_events_watermark).
    previous_threshold_ms: int = MIN_WATERMARK
    previous_batch_id: int | None = None


@dataclass(frozen=True)
class SyntheticPartition(InputPartition):
    """The batch's one synthetic row: event time V + D (semantics.md §6). Its task also
    reports Spark's batch id, for a batch that read no range."""

    planned_watermark_ms: int
    watermark_delay_ms: int
    progress_key: str = ""


def late_events_watermark(split: RangePartition, batch_id: int | None) -> int:
    """The watermark Spark's first stateful operator drops late rows by in this batch.

    Since Spark 3.4 (SPARK-40925) a batch evicts state by its own watermark but judges
    late input by the watermark of the batch Spark ran just before it. That is the
    batch this source planned before (whose watermark was ``previous_threshold_ms``),
    unless Spark ran a no-data batch in between (the batch ids are not consecutive),
    whose watermark is already this batch's (``late_threshold_ms``):

        plans:      ...  D(k-1)                     D(k)
        Spark:      ...  D(k-1) [no-data batch(es)] D(k)
        late by:    D(k-1)'s watermark  if D(k) directly follows D(k-1)
                    D(k)'s watermark    if a no-data batch ran between them

    Unknown ids (an offset from an older version): this batch's watermark, as before.
    """
    if batch_id is None or split.previous_batch_id is None:
        return split.late_threshold_ms
    if batch_id > split.previous_batch_id + 1:
        return split.late_threshold_ms
    return split.previous_threshold_ms


def _spark_batch_id() -> int | None:
    """Spark's id of the micro-batch this task runs in (a local property of the task)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(value) if value is not None else None


# ---------------------------------------------------------------------------- source


class SlackwaterKafkaSource(DataSource):
    """``spark.readStream.format("slackwater-kafka")``: Kafka records plus the valve."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        # The event-time column carries D, so that with_valve_watermark applies the
        # delay the synthetic row was planned with and the two cannot disagree.
        delay_ms = SourceOptions.parse(dict(self.options)).watermark_delay_ms
        return StructType(
            [
                StructField(f.name, f.dataType, f.nullable)
                if f.name != EVENT_TIME
                else StructField(
                    EVENT_TIME, TimestampType(), True, {WATERMARK_DELAY_METADATA: delay_ms}
                )
                for f in SCHEMA.fields
            ]
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return SlackwaterStreamReader(SourceOptions.parse(dict(self.options)))


@dataclass
class _Plan:
    """The driver's view between two ``latestOffset`` calls (all of it in the offset)."""

    data: Offsets
    control: dict[str, int]
    progress: dict[str, int]
    aligner: MarkerAligner
    counters: dict[str, int] = field(default_factory=dict)
    # How long planning waited for the readers' progress (informational, not compared).
    progress_wait_ms: int = 0
    # Markers (JSON) for partitions the broker does not list yet.
    held: list[dict[str, Any]] = field(default_factory=list)


class SlackwaterStreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._admin: Any = None
        self._control_consumer: Any = None
        self._progress_consumer: Any = None
        self._warned_missing_control = False
        # (plan id, aligner) of the offset this planner returned last: the next call
        # usually starts from it and need not rebuild the state from JSON.
        self._cached: tuple[str, MarkerAligner] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Executors get the options only: Kafka clients stay with the planner."""
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # ---------------------------------------------------------------- Kafka clients

    def _admin_client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.options.client_config())
        return self._admin

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        return Consumer(
            {
                **self.options.client_config(),
                "group.id": "slackwater-source-planner",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )

    def _partition_counts(self) -> dict[str, int]:
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and self.options.subscribes(name)
        }

    def _list_offsets(
        self, partitions: list[tuple[str, int]], spec_name: str, *, wait_for_all: bool = False
    ) -> dict[tuple[str, int], int]:
        """Offsets of the partitions that have one now. A partition just created or
        moving leader answers with an error Kafka's protocol calls retriable: it is left
        out, and stands still until the next trigger, or with ``wait_for_all`` asked
        again until the request timeout."""
        deadline = time.monotonic() + self.options.request_timeout_s
        offsets, not_ready = self._list_offsets_once(partitions, spec_name)
        while wait_for_all and not_ready and time.monotonic() < deadline:
            time.sleep(0.2)
            more, not_ready = self._list_offsets_once(list(not_ready), spec_name)
            offsets.update(more)
        if not_ready:
            where = ", ".join(f"{t}[{p}] ({name})" for (t, p), name in list(not_ready.items())[:5])
            if wait_for_all:
                raise SourceError(
                    f"{spec_name} offsets not available after "
                    f"{self.options.request_timeout_s:.0f}s: {where}"
                )
            log.info("offsets not ready, retried next trigger: %s", where)
        return offsets

    def _list_offsets_once(
        self, partitions: list[tuple[str, int]], spec_name: str
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], str]]:
        from confluent_kafka import IsolationLevel, KafkaError
        from confluent_kafka.admin import OffsetSpec

        if not partitions:
            return {}, {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.options.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        answers = list_offsets.submit(
            self._admin_client(),
            list_offsets.Request(partitions, getattr(OffsetSpec, spec_name)()),
            timeout_s=self.options.request_timeout_s,
            isolation_level=isolation,
        ).result(timeout=self.options.request_timeout_s)
        offsets: dict[tuple[str, int], int] = {}
        not_ready: dict[tuple[str, int], str] = {}
        for (topic, partition), answer in answers.items():
            if isinstance(answer, KafkaError):
                if not (answer.retriable() or answer.code() in _RETRIABLE_OFFSET_ERRORS):
                    raise SourceError(f"{spec_name} offset of {topic}[{partition}]: {answer}")
                not_ready[(topic, partition)] = answer.name()
                continue
            offsets[(topic, partition)] = answer
        return offsets, not_ready

    def _ensure_progress_topic(self) -> None:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        name = self.options.progress_topic
        admin = self._admin_client()
        if name in admin.list_topics(timeout=self.options.request_timeout_s).topics:
            return
        future = admin.create_topics(
            [NewTopic(name, num_partitions=1, replication_factor=-1)],
            request_timeout=self.options.request_timeout_s,
        )[name]
        try:
            future.result(timeout=self.options.request_timeout_s)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise SourceError(f"cannot create progress topic {name!r}: {error}") from error

    def _topic_ends(self, topic: str) -> dict[str, int]:
        """The log end of every partition of a topic; empty if the topic does not exist.
        Waits for a partition just created (the progress topic at the first start)."""
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            return {}
        ends = self._list_offsets(
            [(topic, p) for p in described.partitions], "latest", wait_for_all=True
        )
        return {str(p): end for (_, p), end in ends.items()}

    # ---------------------------------------------------------------- offsets

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        # Without a broker there is no first offset: ask until it answers, saying so.
        while True:
            try:
                self._admin_client().list_topics(timeout=min(5.0, self.options.request_timeout_s))
                self._ensure_progress_topic()
                counts = self._partition_counts()
                break
            except KafkaException as error:
                self._unreachable(error)
                time.sleep(1.0)
        partitions = [(t, p) for t, count in counts.items() for p in range(count)]
        starting = self._list_offsets(partitions, self.options.starting_offsets, wait_for_all=True)
        data: Offsets = {}
        for (topic, partition), offset in starting.items():
            data.setdefault(topic, {})[str(partition)] = offset
        aligner = self._new_aligner()
        aligner.ensure_partitions(channel(t, p) for t, p in sorted(starting))
        control = (
            {p: 0 for p in self._topic_ends(self.options.control_topic)}
            if self.options.control_topic
            else {}
        )
        plan = _Plan(
            data=data,
            control=control,
            progress=self._topic_ends(self.options.progress_topic),
            aligner=aligner,
        )
        return _offset(plan, from_data=data, planned=MIN_WATERMARK, late_threshold=MIN_WATERMARK)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        try:
            now = self._look()
        except KafkaException as error:
            self._unreachable(error)
            return start  # no batch while the broker is away; the query keeps running
        if _nothing_new_since(start, now) and self.options.consumer_idle_timeout_ms is None:
            return start  # the common idle trigger: no state to restore or write
        plan = self._restore(start)
        # 1. The previous batch's progress advances the channels' watermarks; its end
        #    offsets are now the read positions.
        ranges = _ranges(start["from"], start["data"])
        waited_from = time.monotonic()
        progress = self._wait_for_progress(ranges, start, plan)
        plan.progress_wait_ms = int((time.monotonic() - waited_from) * 1000)
        batch_ids = [seen.batch_id for seen in progress.values() if seen.batch_id is not None]
        start_batch_id = max(batch_ids) if batch_ids else None
        progress.pop(("", -1), None)
        batch: dict[Any, PartitionBatch] = {}
        for topic, partitions in plan.data.items():
            for partition, read_position in partitions.items():
                seen = progress.get((topic, int(partition)))
                batch[channel(topic, partition)] = PartitionBatch(
                    records=seen.records if seen else 0,
                    max_event_time_ms=seen.max_event_time_ms if seen else None,
                    max_offset=seen.max_offset if seen else -1,
                    read_position=read_position,
                )
        for seen in progress.values():
            _count(plan, "records", seen.records)
            _count(plan, "records_late", seen.late)
            _count(plan, "records_unreadable", seen.unreadable)
            _count(plan, "records_dropped", seen.dropped)
        # 2. New markers are read, 3. and applied once the read position reaches them.
        self._read_markers(plan, now.control_ends)
        # The consumer-side idle timeout (off by default) counts wall time between plans;
        # a replay uses the logged offset, so this never makes a replay differ.
        now_ms = time.time_ns() // 1_000_000 if self.options.consumer_idle_timeout_ms else None
        plan.aligner.advance(batch, now_ms)
        # 4. The data to read next; partitions that appeared join as new channels.
        ends = self._data_ends(plan, limit, now)
        plan.aligner.ensure_partitions(
            channel(t, p) for t, partitions in ends.items() for p in partitions
        )
        self._release_held(plan)
        planned = plan.aligner.valve.watermark
        offset = _offset(
            plan,
            from_data=plan.data,
            planned=planned,
            late_threshold=int(start["watermark"]),
            data=ends,
            previous_threshold=int(start["late_threshold"]),
            previous_batch_id=start_batch_id,
        )
        if _same_batch(start, offset):
            self._cached = (start.get("plan_id", ""), plan.aligner)  # still start's state
            return start  # nothing new: no batch
        self._cached = (offset["plan_id"], plan.aligner)
        return offset

    def _unreachable(self, error: KafkaException) -> None:
        log_unreachable.warning(
            "cannot reach Kafka at %s (%s): no new batch until it answers",
            self.options.bootstrap_servers,
            error.args[0].str() if error.args else error,
        )

    def _look(self) -> _BrokerNow:
        """One metadata request and one ListOffsets round for the whole plan: the
        subscribed topics' partitions and log ends, and the control topic's ends."""
        metadata = self._admin_client().list_topics(timeout=self.options.request_timeout_s)
        counts = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None and self.options.subscribes(name)
        }
        wanted = [(t, p) for t, count in counts.items() for p in range(count)]
        control = self.options.control_topic
        described = metadata.topics.get(control) if control is not None else None
        if described is not None and described.error is None:
            wanted += [(control, p) for p in described.partitions]
        latest = self._list_offsets(wanted, "latest")
        control_ends = {str(p): end for (t, p), end in latest.items() if t == control}
        return _BrokerNow(counts, latest, control_ends)

    def _restore(self, offset: dict[str, Any]) -> _Plan:
        if offset.get("v") != OFFSET_VERSION:
            raise SourceError(f"unknown offset version {offset.get('v')!r} in the checkpoint")
        cached = self._cached
        if cached is not None and cached[0] == offset.get("plan_id"):
            aligner = cached[1]  # the state this planner left in that offset: no restore
        else:
            aligner = MarkerAligner.restore(offset["aligner"], channel_of=self._channel_of)
        # The option as the query runs now (it may have changed since the checkpoint).
        aligner.consumer_idle_timeout_ms = self.options.consumer_idle_timeout_ms
        self._cached = None  # mutated from here on
        return _Plan(
            data={t: dict(p) for t, p in offset["data"].items()},
            control=dict(offset["control"]),
            progress=dict(offset["progress"]),
            aligner=aligner,
            counters=dict(offset.get("counters", {})),
            held=list(offset.get("held", [])),
        )

    def _new_aligner(self) -> MarkerAligner:
        return MarkerAligner(
            None,
            self.options.max_out_of_orderness_ms,
            consumer_idle_timeout_ms=self.options.consumer_idle_timeout_ms,
            channel_of=self._channel_of,
        )

    def _channel_of(self, marker: Marker) -> str | None:
        return (
            channel(marker.topic, marker.partition)
            if self.options.subscribes(marker.topic)
            else None
        )

    def _data_ends(self, plan: _Plan, limit: ReadLimit, now: _BrokerNow) -> Offsets:
        latest = now.latest
        known = [(t, p) for t, count in now.counts.items() for p in range(count)]
        new = [(t, p) for t, p in known if str(p) not in plan.data.get(t, {})]
        earliest = self._list_offsets(new, "earliest")
        for (topic, number), offset in earliest.items():
            plan.data.setdefault(topic, {})[str(number)] = offset  # a new range starts here
        ends: Offsets = {}
        for topic, partitions in plan.data.items():
            for partition, begin in partitions.items():
                # Never go backwards from what was read (a deleted topic keeps its end).
                end = max(begin, latest.get((topic, int(partition)), begin))
                ends.setdefault(topic, {})[partition] = end
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limit(plan.data, ends, limit.max_rows)
        return ends

    # ---------------------------------------------------------------- control topic

    def _read_markers(self, plan: _Plan, ends: dict[str, int]) -> None:
        """Reads the control topic from the plan's position up to ``ends``."""
        from confluent_kafka import KafkaError, TopicPartition

        topic = self.options.control_topic
        if topic is None:
            return
        if not ends:
            if not self._warned_missing_control:
                log.warning(
                    "control topic %s does not exist: the valve works on data alone until it does",
                    topic,
                )
                self._warned_missing_control = True
            return
        for partition in ends:
            plan.control.setdefault(partition, 0)
        todo = {p: end for p, end in ends.items() if plan.control[p] < end}
        if not todo:
            return
        malformed: list[str] = []
        if self._control_consumer is None:
            self._control_consumer = self._consumer()
        consumer = self._control_consumer
        consumer.assign([TopicPartition(topic, int(p), plan.control[p]) for p in todo])
        deadline = time.monotonic() + self.options.read_timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise SourceError(f"timed out reading control topic {topic} up to {ends}")
            for message in consumer.consume(num_messages=10_000, timeout=0.2):
                error = message.error()
                partition = str(message.partition())
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        plan.control[partition] = max(plan.control[partition], message.offset())
                        if plan.control[partition] >= ends[partition]:
                            todo.pop(partition, None)
                        continue
                    raise SourceError(f"reading control topic {topic}: {error}")
                if message.offset() >= ends[partition]:
                    todo.pop(partition, None)
                    continue
                plan.control[partition] = message.offset() + 1
                if plan.control[partition] >= ends[partition]:
                    todo.pop(partition, None)
                self._take_control_record(plan, message, malformed)
        consumer.unassign()
        if malformed:
            log.warning(
                "skipped %d malformed control record(s) on %s (first: %s)",
                len(malformed),
                topic,
                malformed[0],
            )

    def _take_control_record(self, plan: _Plan, message: Any, malformed: list[str]) -> None:
        try:
            record = decode(message.key(), message.value())
        except Tombstone:
            _count(plan, "control_tombstones")  # compaction's deletion: not malformed
            return
        except MalformedControlRecord as reason:
            _count(plan, "control_malformed")
            malformed.append(f"{message.offset()}: {reason}")
            return
        if isinstance(record, Marker):
            _count(plan, "markers_read")
            self._offer(plan, record)

    def _offer(self, plan: _Plan, marker: Marker) -> None:
        """Channels come from the broker, not from markers: a marker for a partition the
        broker does not list (yet) is held aside, bounded, until it appears."""
        channel_id = self._channel_of(marker)
        if channel_id is None or channel_id in plan.aligner.partitions:
            plan.aligner.offer(marker)  # (a topic not read here is rejected and counted)
        elif len(plan.held) < MAX_HELD_MARKERS:
            plan.held.append(marker.model_dump(mode="json"))
        else:
            _count(plan, "markers_held_dropped")

    def _release_held(self, plan: _Plan) -> None:
        """Held markers whose partition the broker now lists join their channel."""
        still_held = []
        for raw in plan.held:
            marker = Marker.model_validate_json(json.dumps(raw))
            if self._channel_of(marker) in plan.aligner.partitions:
                plan.aligner.offer(marker)
            else:
                still_held.append(raw)
        plan.held = still_held

    # ---------------------------------------------------------------- progress

    def _wait_for_progress(
        self, ranges: list[tuple[str, int, int, int]], start: dict[str, Any], plan: _Plan
    ) -> dict[tuple[str, int], Progress]:
        from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

        threshold = int(start["late_threshold"])
        wanted: dict[str, tuple[str, int]] = {
            progress_key(
                topic=t,
                partition=p,
                start=a,
                end=b,
                late_threshold_ms=threshold,
                event_time=self._event_time_name(),
            ): (t, p)
            for t, p, a, b in ranges
        }
        if int(start["watermark"]) > MIN_WATERMARK and "previous_threshold" in start:
            # The batch's synthetic task reports Spark's batch id (ranges do too); an
            # offset planned before it did (no "previous_threshold") has no such record.
            wanted[synthetic_progress_key(str(start["plan_id"]))] = ("", -1)
        if not wanted:
            return {}
        found: dict[tuple[str, int], Progress] = {}
        if self._progress_consumer is None:
            self._progress_consumer = self._consumer()
        consumer = self._progress_consumer
        topic = self.options.progress_topic
        # Every partition of the progress topic, from where the last plan stopped (from
        # its beginning if the plan has no position for it: no record is missed).
        positions = {int(p): o for p, o in plan.progress.items()}
        if not positions:
            listed = self._admin_client().list_topics(topic, timeout=self.options.request_timeout_s)
            described = listed.topics.get(topic)
            if described is not None and described.error is None:
                positions = {p: OFFSET_BEGINNING for p in described.partitions}
        consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
        deadline = time.monotonic() + self.options.progress_timeout_s
        try:
            while wanted:
                if time.monotonic() > deadline:
                    missing = ", ".join(sorted(wanted)[:5])
                    raise SourceError(
                        f"no progress after {self.options.progress_timeout_s:.0f}s from the "
                        f"readers of {len(wanted)} range(s) of the last batch ({missing}) on "
                        f"topic {topic}: the watermark cannot advance without it"
                    )
                # consume() returns when it has num_messages or at the timeout: asking
                # for what is still wanted returns as soon as it has come.
                wanted_now = min(len(wanted), 10_000)
                for message in consumer.consume(num_messages=wanted_now, timeout=0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            continue
                        raise SourceError(f"reading progress topic {topic}: {error}")
                    plan.progress[str(message.partition())] = message.offset() + 1
                    key = (message.key() or b"").decode(errors="replace")
                    where = wanted.pop(key, None)
                    if where is not None:
                        found[where] = Progress.decode(message.value())
        finally:
            consumer.unassign()
        return found

    def _event_time_name(self) -> str:
        return self.options.event_time_field or "timestamp"

    # ---------------------------------------------------------------- planning

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        threshold = int(end["late_threshold"])  # == start["watermark"]
        previous = int(end.get("previous_threshold", threshold))
        previous_batch_id = end.get("previous_batch_id")
        result: list[InputPartition] = [
            RangePartition(topic, partition, begin, finish, threshold, previous, previous_batch_id)
            for topic, partition, begin, finish in _ranges(end["from"], end["data"])
        ]
        planned = int(end["watermark"])
        if planned > MIN_WATERMARK:
            result.append(
                SyntheticPartition(
                    min(planned, self.options.max_planned_watermark_ms),
                    self.options.watermark_delay_ms,
                    synthetic_progress_key(str(end.get("plan_id", ""))),
                )
            )
        return result

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint, not in a consumer group

    def stop(self) -> None:
        for client in (self._control_consumer, self._progress_consumer):
            if client is not None:
                client.close()
        self._control_consumer = self._progress_consumer = None

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    # ---------------------------------------------------------------- reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SyntheticPartition):
            return read_synthetic(self.options, partition)
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition)


# ------------------------------------------------------------------ offsets, pure


def _offset(
    plan: _Plan,
    *,
    from_data: Offsets,
    planned: int,
    late_threshold: int,
    data: Offsets | None = None,
    previous_threshold: int = MIN_WATERMARK,
    previous_batch_id: int | None = None,
) -> dict[str, Any]:
    """One batch's offset: its data ranges (``from`` -> ``data``), the positions read on
    the control and progress topics, the watermark planned into its synthetic row, the
    watermark Spark applies while it runs (``late_threshold``: the previous batch's plan),
    and the aligner/valve state after planning."""
    return {
        "v": OFFSET_VERSION,
        "plan_id": uuid.uuid4().hex,
        "data": data if data is not None else plan.data,
        "from": {t: dict(p) for t, p in from_data.items()},
        "control": dict(plan.control),
        "progress": dict(plan.progress),
        "watermark": planned,
        "late_threshold": late_threshold,
        # What the readers need to tell the watermark Spark judges late rows by: the
        # previous batch's threshold and Spark's id of that batch (late_events_watermark).
        "previous_threshold": previous_threshold,
        "previous_batch_id": previous_batch_id,
        "status": plan.aligner.valve.status.value,
        "counters": dict(plan.counters),
        "progress_wait_ms": plan.progress_wait_ms,
        "held": list(plan.held),
        "aligner": plan.aligner.snapshot(),
    }


@dataclass(frozen=True)
class _BrokerNow:
    """What one plan saw of the broker (``SlackwaterStreamReader._look``)."""

    counts: dict[str, int]  # partitions per subscribed topic
    latest: dict[tuple[str, int], int]  # log ends (last stable offsets if read_committed)
    control_ends: dict[str, int]  # the control topic's log ends; empty if it does not exist


def _nothing_new_since(start: dict[str, Any], now: _BrokerNow) -> bool:
    """No range to account for, no new record on the data or control topics, no new
    partition: planning would return ``start``."""
    if start["from"] != start["data"]:
        return False
    known = start["data"]
    if now.counts.keys() != known.keys() or any(len(known[t]) != n for t, n in now.counts.items()):
        return False
    if any(
        now.latest.get((t, p), -1) > known[t][str(p)]
        for t, n in now.counts.items()
        for p in range(n)
    ):
        return False
    return bool(now.control_ends.items() <= start["control"].items())


def _same_batch(start: dict[str, Any], offset: dict[str, Any]) -> bool:
    """True when the new offset would plan an empty batch that changes nothing."""
    return bool(
        offset["data"] == start["data"]
        and start["from"] == start["data"]
        and offset["control"] == start["control"]
        and offset["watermark"] == start["watermark"]
        and offset["aligner"] == start["aligner"]
        and offset["held"] == start.get("held", [])
    )


def _count(plan: _Plan, counter: str, amount: int = 1) -> None:
    plan.counters[counter] = plan.counters.get(counter, 0) + amount


def _ranges(begin: Offsets, end: Offsets) -> list[tuple[str, int, int, int]]:
    """Non-empty ``[start, end)`` per partition, in topic and partition order."""
    result = []
    for topic in sorted(end):
        for partition, finish in sorted(end[topic].items(), key=lambda kv: int(kv[0])):
            start = begin.get(topic, {}).get(partition, finish)
            if finish > start:
                result.append((topic, int(partition), int(start), int(finish)))
    return result


def _rate_limit(begin: Offsets, end: Offsets, max_records: int) -> Offsets:
    """At most ``max_records`` in all, shared in proportion to what each partition has."""
    ranges = _ranges(begin, end)
    total = sum(b - a for _, _, a, b in ranges)
    if total <= max_records:
        return end
    limited = {t: dict(p) for t, p in end.items()}
    for topic, partition, a, b in ranges:
        share = max(1, (b - a) * max_records // total)
        limited[topic][str(partition)] = min(b, a + share)
    return limited


# ---------------------------------------------------------------------- executors


def read_range(options: SourceOptions, split: RangePartition) -> Iterator[pa.RecordBatch]:
    """Reads ``[start, end)`` of one partition as Arrow batches, then reports its progress."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            # librdkafka (>= 2.3) pauses fetching for fetch.queue.backoff.ms (default
            # 1 s) whenever its queue holds queued.min.messages (100,000): a reader that
            # drains 10,000 at a time then sat idle most of the time, at 180k records/s
            # instead of over 1M (docs/performance.md). A kafka.* option overrides it.
            "fetch.queue.backoff.ms": 10,
            **options.client_config(),
            "group.id": "slackwater-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
        }
    )
    batch_id = _spark_batch_id()
    builder = _Builder(
        split,
        options.event_time_field,
        late_events_watermark(split, batch_id),
        options.late_rule if options.late_output is not None else None,
    )
    try:
        consumer.assign([TopicPartition(split.topic, split.partition, split.start)])
        position = split.start
        deadline = time.monotonic() + options.read_timeout_s
        while position < split.end:
            messages = consumer.consume(num_messages=min(10_000, split.end - position), timeout=0.5)
            records = _records_before(messages, split, position)
            if records:
                builder.add_many(records)
                position = int(records[-1].offset()) + 1
                if len(builder) >= options.max_records_per_arrow_batch:
                    yield builder.flush()
            if (
                messages
                and messages[-1].error() is None
                and (messages[-1].offset() or 0) >= split.end
            ):
                position = split.end  # read past the range: it is complete
            if messages:
                deadline = time.monotonic() + options.read_timeout_s
            # Offset gaps (transaction markers, compaction): the consumer's position
            # moves past offsets that carry no record.
            current = consumer.position([TopicPartition(split.topic, split.partition)])
            if current and current[0].offset > position:
                position = min(current[0].offset, split.end)
            if position < split.end and time.monotonic() > deadline:
                raise SourceError(
                    f"timed out reading {split.topic}[{split.partition}] at {position}, "
                    f"expected up to {split.end}"
                )
        if len(builder):
            yield builder.flush()
    finally:
        consumer.close()
    # The rows the job will drop, aside, before the progress that lets the plan go on.
    if options.late_output is not None:
        write_range(
            options.late_output,
            builder.dropped,
            topic=split.topic,
            partition=split.partition,
            start=split.start,
            end=split.end,
            threshold_ms=builder.threshold_ms,
        )
    # The range was read whole: its progress goes to the driver.
    key = progress_key(
        topic=split.topic,
        partition=split.partition,
        start=split.start,
        end=split.end,
        late_threshold_ms=split.late_threshold_ms,
        event_time=options.event_time_field or "timestamp",
    )
    _report_progress(options, key, dataclasses.replace(builder.progress(), batch_id=batch_id))


def read_synthetic(options: SourceOptions, split: SyntheticPartition) -> Iterator[pa.RecordBatch]:
    """The synthetic row, then Spark's batch id to the planner (as a range's progress)."""
    yield _synthetic_batch(split.planned_watermark_ms, split.watermark_delay_ms)
    if split.progress_key:
        progress = Progress(0, None, -1, 0, 0, batch_id=_spark_batch_id())
        _report_progress(options, split.progress_key, progress)


def _report_progress(options: SourceOptions, key: str, progress: Progress) -> None:
    """One progress record, acknowledged before the task ends (a retry or a replay
    writes the same record again, harmlessly)."""
    from confluent_kafka import Producer

    producer = Producer({**options.producer_config(), "linger.ms": 0, "acks": "all"})
    producer.produce(options.progress_topic, key=key.encode(), value=progress.encode())
    if producer.flush(options.request_timeout_s) != 0:
        raise SourceError(f"progress of {key} not acknowledged by {options.progress_topic}")


def synthetic_progress_key(plan_id: str) -> str:
    return f"synthetic:{plan_id}"


def _records_before(messages: list[Any], split: RangePartition, position: int) -> list[Any]:
    """The records of one consume call that belong to the range, in offset order.

    Errors are rare: one check over the call, and the slow path only when one is there.
    """
    if any(message.error() is not None for message in messages):
        from confluent_kafka import KafkaError

        for message in messages:
            error = message.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                raise SourceError(
                    f"reading {split.topic}[{split.partition}] at {position}: {error}"
                )
        messages = [message for message in messages if message.error() is None]
    if messages and messages[-1].offset() >= split.end:
        messages = [message for message in messages if message.offset() < split.end]
    return messages


class _Builder:
    """Column lists for Arrow batches, filled a consume call at a time, and the range's
    running progress. Column-wise on purpose: one comprehension per column costs a
    fraction of one Python call per record (docs/performance.md)."""

    def __init__(
        self,
        split: RangePartition,
        event_time_field: str | None,
        threshold_ms: int,
        late_rule: LateRule | None = None,
    ) -> None:
        self.split = split
        self.event_time_field = event_time_field
        # The watermark Spark judges this range's rows late by (late_events_watermark).
        self.threshold_ms = threshold_ms
        self.late_rule = late_rule
        self.dropped: list[DroppedRow] = []
        self.records = self.late = self.unreadable = 0
        self.max_event_ms: int | None = None
        self.max_offset = -1
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int | None] = []
        self.timestamp_types: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.event_times: list[int | None] = []
        self.lates: list[bool] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add_many(self, messages: list[Any]) -> None:
        values = [m.value() for m in messages]
        stamps = [m.timestamp() for m in messages]
        offsets = [m.offset() for m in messages]
        self.keys += [m.key() for m in messages]
        self.values += values
        self.offsets += offsets
        # librdkafka: 0 none, 1 create time, 2 log append time; Spark: 0 create, 1 append.
        self.timestamps += [ms * 1000 if kind else None for kind, ms in stamps]
        self.timestamp_types += [kind - 1 if kind else 0 for kind, _ in stamps]
        self.headers += [
            [{"key": k, "value": v} for k, v in raw] if raw else None
            for raw in (m.headers() for m in messages)
        ]
        event_ms = self._event_times(values, stamps)
        threshold = self.threshold_ms
        # No event time: the row is late (it cannot be placed in event time), counted.
        lates = [ms is None or ms < threshold for ms in event_ms]
        readable = [ms for ms in event_ms if ms is not None]
        unreadable = len(event_ms) - len(readable)
        self.records += len(messages)
        self.unreadable += unreadable
        self.late += sum(lates) - unreadable
        if readable:
            newest = max(readable)
            if self.max_event_ms is None or newest > self.max_event_ms:
                self.max_event_ms = newest
        self.max_offset = offsets[-1]
        self.event_times += [None if ms is None else ms * 1000 for ms in event_ms]
        self.lates += lates
        if self.late_rule is not None and any(lates):
            self._note_dropped(values, stamps, offsets, event_ms, threshold)

    def _note_dropped(
        self,
        values: list[bytes | None],
        stamps: list[tuple[int, int]],
        offsets: list[int],
        event_ms: list[int | None],
        threshold: int,
    ) -> None:
        """The rows the job's aggregation will drop, with why (late_rows.py). Only
        late rows can be dropped, so only consume calls that have one come here."""
        assert self.late_rule is not None
        for index, ms in enumerate(event_ms):
            if ms is None:
                reason = "unreadable: " + self._why_unreadable(values[index], stamps[index])
            elif self.late_rule.dropped(ms, threshold):
                reason = "late"
            else:
                continue
            self.dropped.append(DroppedRow(offsets[index], ms, reason))

    def _why_unreadable(self, value: bytes | None, stamp: tuple[int, int]) -> str:
        try:
            if self.event_time_field is None:
                from_timestamp(*stamp)
            else:
                from_json_field(value, self.event_time_field)
        except UnreadableEventTime as error:
            return str(error)
        return "no event time"

    def _event_times(
        self, values: list[bytes | None], stamps: list[tuple[int, int]]
    ) -> list[int | None]:
        if self.event_time_field is None:
            return [ms if kind and ms >= 0 else None for kind, ms in stamps]
        field_name = self.event_time_field
        result: list[int | None] = []
        for value in values:
            try:
                result.append(from_json_field(value, field_name))
            except UnreadableEventTime:
                result.append(None)
        return result

    def flush(self) -> pa.RecordBatch:
        count = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                pa.array([self.split.topic] * count, pa.string()),
                pa.array([self.split.partition] * count, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.timestamps, pa.timestamp("us", tz="UTC")),
                pa.array(self.timestamp_types, pa.int32()),
                pa.array(self.headers, ARROW_SCHEMA.field("headers").type),
                pa.array(self.event_times, pa.timestamp("us", tz="UTC")),
                pa.array(self.lates, pa.bool_()),
            ],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch

    def progress(self) -> Progress:
        return Progress(
            records=self.records,
            max_event_time_ms=self.max_event_ms,
            max_offset=self.max_offset,
            late=self.late,
            unreadable=self.unreadable,
            dropped=len(self.dropped),
        )


def _synthetic_batch(planned_watermark_ms: int, watermark_delay_ms: int) -> pa.RecordBatch:
    row: dict[str, Any] = {name: None for name in ARROW_SCHEMA.names}
    row[EVENT_TIME] = (planned_watermark_ms + watermark_delay_ms) * 1000
    row[LATE] = False
    return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)


# ------------------------------------------------------------------------ public API


def _not_synthetic() -> Column:
    """True for every real row.

    It references the event-time column, so Spark does not push it below the watermark
    node. And it is not deterministic (``spark_partition_id() < 0``, never true, one
    lookup per row; Spark folds ``rand() < 0`` away, and rejects
    ``monotonically_increasing_id()`` in streaming), so Spark pushes no later filter of
    the user's below it either: a filter on ``topic`` or ``key`` would otherwise drop
    the synthetic row before the watermark node sees it, and the valve's watermark
    with it.
    """
    synthetic = F.col("topic").isNull() & F.col(EVENT_TIME).isNotNull()
    return ~synthetic | (F.spark_partition_id() < 0)


def with_valve_watermark(frame: DataFrame) -> DataFrame:
    """The valve's watermark as Spark's: ``withWatermark`` on ``event_time`` with the
    delay the source planned its synthetic row with (from the column's metadata), then
    the synthetic row removed."""
    delay_ms = frame.schema[EVENT_TIME].metadata.get(WATERMARK_DELAY_METADATA, WATERMARK_DELAY_MS)
    return frame.withWatermark(EVENT_TIME, f"{int(delay_ms)} milliseconds").filter(_not_synthetic())


def read_stream(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    topics: Sequence[str],
    control_topic: str | None,
    max_out_of_orderness: str = "0s",
    event_time_field: str | None = None,
    starting_offsets: str = "earliest",
    kafka_config: dict[str, str] | None = None,
    watermark_delay: str | None = None,
) -> DataFrame:
    """The source with its watermark applied: what a job reads (semantics.md §6).

    ``watermark_delay`` (e.g. ``"1h"``) is for ``dropDuplicatesWithinWatermark``, whose
    state lives for the delay: Spark's watermark then becomes max(V, newest - delay),
    the valve's only while no partition lags the newest record by more than the delay.
    """
    spark.dataSource.register(SlackwaterKafkaSource)
    reader = (
        spark.readStream.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", ",".join(topics))
        .option("maxOutOfOrderness", max_out_of_orderness)
        .option("startingOffsets", starting_offsets)
    )
    if control_topic is not None:
        reader = reader.option("controlTopic", control_topic)
    if event_time_field is not None:
        reader = reader.option("eventTimeField", event_time_field)
    if watermark_delay is not None:
        reader = reader.option("watermarkDelay", watermark_delay)
    for key, value in (kafka_config or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    return with_valve_watermark(reader.load())
