"""The slackwater source's options, schemas and constants: what the driver and the readers
both need, parsed once from the DataSource options."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from pyspark.sql.pandas.types import to_arrow_schema
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

from slackwater import kafka_clients, kafka_logging
from slackwater.markers import TopicPartitionKey, partition_key
from slackwater.settings import parse_duration_ms, parse_optional_duration_ms
from spark_consumer.source.shared.event_time import MAX_EVENT_TIME_AHEAD_MS, MAX_EVENT_TIME_MS
from spark_consumer.source.shared.late_rows import LATE_ONLY, LateRule
from spark_consumer.source.shared.option_names import warn_unknown_options

SOURCE_NAME = "slackwater-kafka"
# The source's Kafka clients' names: the planner's (planner_client.py) under it, and the readers'
# (their logger is slackwater.librdkafka.source.reader).
SOURCE_CLIENT = "source"
READER_CLIENT = f"{SOURCE_CLIENT}.reader"
# Which of the source's clients a refusal's one line is about: the driver's or an
# executor's (their settings, files and network may differ).
PLANNER = "planner (driver)"
READER = "reader (executor)"
# The default withWatermark delay D: so large that the synthetic row (V + D) alone sets
# Spark's watermark (real rows give newest - D, far below V).
WATERMARK_DELAY_DAYS = 36_500
WATERMARK_DELAY_MS = WATERMARK_DELAY_DAYS * 86_400_000
# Where the schema tells with_valve_watermark the D the source plans with.
WATERMARK_DELAY_METADATA = "slackwater.watermarkDelayMs"
EVENT_TIME = "event_time"
LATE = "late"
# Markers for partitions the broker does not list, kept until the partition appears.
MAX_HELD_MARKERS = 1_000
# How long a reader (or the planner, waiting for progress) goes without what it waits for
# before it asks the broker whether those records are gone.
GONE_CHECK_S = 2.0
# The progress topic's retention.ms when the source creates it (option progressRetention):
# a restart needs at most the last batch's records, and copes with none (source.md).
PROGRESS_RETENTION_MS = 7 * 86_400_000

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

SCHEMA = StructType(
    [
        *KAFKA_SCHEMA.fields,
        StructField(EVENT_TIME, TimestampType()),
        StructField(LATE, BooleanType()),
    ]
)
# The same columns as the readers' Arrow batches carry them: Spark's own conversion,
# so the two schemas cannot disagree.
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")

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


class SourceError(RuntimeError):
    """The source cannot plan or read a batch; the message says what and where."""

    def __init__(self, message: object = "", *args: object) -> None:
        # Many quote librdkafka's words, which may quote a setting: through the one filter.
        super().__init__(kafka_logging.redact(str(message)), *args)


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
    # Event times further ahead of the batch's planning clock are unreadable; None: off.
    max_event_time_ahead_ms: int | None = MAX_EVENT_TIME_AHEAD_MS
    # Spark's Kafka source's option: records gone from under the read position (retention,
    # a re-created topic) stop the query (True) or are counted and skipped (False).
    fail_on_data_loss: bool = True
    progress_retention_ms: int = PROGRESS_RETENTION_MS
    # How a batch's ranges are grouped into tasks (tasks_for): about this many tasks, and
    # more when they would hold more records each than max_records_per_task.
    tasks_per_batch: int = 8
    max_records_per_task: int = 200_000
    # A bounded run (run_ends.py): "latest", or {topic: {partition: offset}} as JSON
    # (-1: the log end at the run's start); None: unbounded.
    ending_offsets: str | None = None
    # Watermark alignment (Flink's maxAllowedWatermarkDrift, FLIP-182/217): no records are
    # planned for a partition this far ahead of the slowest (watermark_alignment.py); None: off.
    max_watermark_drift_ms: int | None = None

    @classmethod
    def parse(cls, options: dict[str, str]) -> SourceOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        warn_unknown_options(options)  # at a query's start, in Spark's planner process
        kafka_config = {
            key[len("kafka.") :]: value
            for key, value in options.items()
            if key.lower().startswith("kafka.") and key.lower() != "kafka.bootstrap.servers"
        }
        return cls(
            **_subscription_options(lowered),
            **_watermark_options(lowered),
            control_topic=lowered.get("controltopic") or None,
            event_time_field=lowered.get("eventtimefield") or None,
            kafka_config=kafka_config,
            progress_timeout_s=float(lowered.get("progresstimeoutms", "120000")) / 1000,
            request_timeout_s=float(lowered.get("requesttimeoutms", "30000")) / 1000,
            read_timeout_s=float(lowered.get("readtimeoutms", "60000")) / 1000,
            max_records_per_arrow_batch=int(lowered.get("maxrecordsperarrowbatch", "50000")),
            late_output=lowered.get("lateoutput") or None,
            progress_topic_name=lowered.get("progresstopic") or None,
            **_production_options(lowered),
            **_task_options(lowered),
        )

    @property
    def max_planned_watermark_ms(self) -> int:
        """The highest V a synthetic row can carry (V + D must stay a Spark timestamp):
        the planned form of MAX_WATERMARK, after which every window has ended."""
        return MAX_EVENT_TIME_MS - self.watermark_delay_ms

    def client_config(self) -> dict[str, Any]:
        """The readers' clients' settings (reader_clients pools them by these)."""
        return kafka_clients.client_settings(
            READER_CLIENT, self.bootstrap_servers, self.kafka_config
        )

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

    def tasks_for(self, records: int) -> int:
        """How many tasks a batch of ``records`` is planned in (logged in its offset)."""
        return max(self.tasks_per_batch, -(-records // self.max_records_per_task))

    def refused(
        self, error: Any, action: str, group: str | None = None, by: str = PLANNER
    ) -> SourceError | None:
        """The error to end the query with if the broker refused ``action`` ("read topic
        orders") or the consumer's ``group`` for lack of an ACL: one line naming the
        client (``by``: PLANNER or READER) and the principal, as the query cannot mend it
        by retrying. None for any other error."""
        line = kafka_logging.authorization_problem(error, action, self.kafka_config, group)
        return None if line is None else SourceError(f"{by}: {line}")

    def not_authenticated(self, failure: Any, by: str) -> SourceError:
        """A failed authentication (refused credentials, a certificate refused or not
        verified) as the one line that ends the query: the client and the principal or
        the certificate problem, never a secret."""
        return SourceError(
            f"{by}: {kafka_logging.authentication_problem(failure, self.kafka_config)}"
        )

    def not_refused(self, client: str, by: str, answered: bool) -> None:
        """Ends the task or the plan if librdkafka reported a refusal of ``client`` (to
        its error callback, served by the consume call just made) and that call brought
        nothing (not ``answered``): credentials or a certificate refused, or the
        broker's not verified (a password rotated, a keytab or CA file missing on this
        machine), which waiting for readTimeoutMs or progressTimeoutMs would only hide.
        One that came with records is history (the broker answered), as the planner's
        admin client takes it; librdkafka reports it again at its next attempt."""
        failure = kafka_logging.take_authentication_failure(client)
        if failure is not None and not answered:
            raise self.not_authenticated(failure, by)

    def not_made(self, error: Any, by: str) -> SourceError:
        """A client librdkafka would not make of these settings (a CA file or keystore
        missing on this machine) as the one line that ends the query."""
        return SourceError(f"{by}: {kafka_logging.settings_problem(error, self.kafka_config)}")

    def subscribes(self, topic: str) -> bool:
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def _subscription_options(lowered: dict[str, str]) -> dict[str, Any]:
    """What to read, from where: as Spark's Kafka source spells it."""
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
    max_per_trigger = lowered.get("maxoffsetspertrigger")
    if max_per_trigger is not None and (not max_per_trigger.isdigit() or int(max_per_trigger) < 1):
        raise SourceError(
            f"option 'maxOffsetsPerTrigger' must be a positive integer: {max_per_trigger!r}"
        )
    return {
        "bootstrap_servers": bootstrap,
        "topics": topics,
        "topic_pattern": pattern,
        "starting_offsets": starting,
        "max_offsets_per_trigger": int(max_per_trigger) if max_per_trigger else None,
        "ending_offsets": _ending_offsets(lowered.get("endingoffsets"), topics, pattern),
    }


def _ending_offsets(text: str | None, topics: tuple[str, ...], pattern: str | None) -> str | None:
    """``endingOffsets`` as Spark's Kafka source spells it: ``latest``, or a JSON object
    of topics to partitions to offsets, -1 for the log end (a partition not named ends
    at its log end too); kept in one spelling (a restart compares it), once checked. A
    topic the query does not subscribe is refused: a misspelt name would otherwise end
    that topic's partitions at their log ends, in silence."""
    if text is None or not text.strip():
        return None
    if text.strip().lower() == "latest":
        return "latest"
    named = ending_by_partition(text)
    if named is None:
        raise SourceError(
            "option 'endingOffsets' must be latest or a JSON object such as "
            f'{{"orders":{{"0":23,"1":-1}}}} (offsets at least -1): {text[:200]!r}'
        )
    strangers = sorted(
        {
            t
            for t, _ in named
            if (t not in topics if pattern is None else not re.fullmatch(pattern, t))
        }
    )
    if strangers:
        raise SourceError(
            f"option 'endingOffsets' names topic(s) {', '.join(strangers)}, which the query "
            "does not subscribe"
        )
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def ending_by_partition(text: str) -> dict[TopicPartitionKey, int] | None:
    """The offsets a JSON ``endingOffsets`` names, by (topic, partition); None if it is
    not one (``latest`` names none)."""
    if text == "latest":
        return {}
    try:
        parsed = json.loads(text)
        named = {
            (str(topic), int(partition)): offset
            for topic, partitions in parsed.items()
            for partition, offset in partitions.items()
        }
    except (ValueError, AttributeError, TypeError):
        return None
    if not all(type(o) is int and o >= -1 and p >= 0 for (_, p), o in named.items()):
        return None
    return named


def same_ends(was: str | None, now: str | None) -> bool:
    """Whether two ``endingOffsets`` name the same ends: a partition at -1 ends at its log
    end as one not named does, and ``latest`` names none (docs/source.md, "Scheduled and
    bounded runs"); None (no ending) is only itself."""
    if was is None or now is None:
        return was == now
    named_was, named_now = ending_by_partition(was), ending_by_partition(now)
    if named_was is None or named_now is None:
        return was == now
    return {k: o for k, o in named_was.items() if o != -1} == {
        k: o for k, o in named_now.items() if o != -1
    }


def _watermark_options(lowered: dict[str, str]) -> dict[str, Any]:
    """How the watermark is made and handed to Spark, and how late rows are judged."""
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
    idle_timeout_ms = _duration_or_off(lowered.get("consumeridletimeout"), "consumerIdleTimeout")
    if idle_timeout_ms is not None and idle_timeout_ms < 1:
        raise SourceError("option 'consumerIdleTimeout' must be positive (or off)")
    return {
        "max_out_of_orderness_ms": out_of_orderness_ms,
        "watermark_delay_ms": delay_ms,
        "late_rule": late_rule,
        "consumer_idle_timeout_ms": idle_timeout_ms,
        "max_watermark_drift_ms": _duration_or_off(
            lowered.get("maxwatermarkdrift"), "maxWatermarkDrift"
        ),
    }


def _duration_or_off(value: str | None, name: str) -> int | None:
    """The option ``name`` given ``value``: ``off`` (or absent: None) or a duration
    (never negative)."""
    try:
        return parse_optional_duration_ms(value)
    except ValueError as error:
        raise SourceError(f"option {name!r}: {error} (or off)") from None


def _task_options(lowered: dict[str, str]) -> dict[str, Any]:
    """tasksPerBatch (default: the planner's cores, Spark's default parallelism in local
    mode; read_stream and consume pass Spark's own) and maxRecordsPerTask."""
    values = {
        "tasks_per_batch": lowered.get("tasksperbatch", str(os.cpu_count() or 1)),
        "max_records_per_task": lowered.get("maxrecordspertask", "200000"),
    }
    names = {"tasks_per_batch": "tasksPerBatch", "max_records_per_task": "maxRecordsPerTask"}
    for key, value in values.items():
        if not value.strip().isdigit() or int(value) < 1:
            raise SourceError(f"option {names[key]!r} must be a positive integer: {value!r}")
    return {key: int(value) for key, value in values.items()}


def _production_options(lowered: dict[str, str]) -> dict[str, Any]:
    """The options for what production brings: far-future event times, data loss, the
    progress topic's retention (source.md, "What production brings")."""
    try:
        ahead_ms = parse_optional_duration_ms(
            lowered.get("maxeventtimeahead", str(MAX_EVENT_TIME_AHEAD_MS))
        )
    except ValueError as error:
        raise SourceError(f"option 'maxEventTimeAhead': {error} (or off)") from None
    fail_on_data_loss = lowered.get("failondataloss", "true").strip().lower()
    if fail_on_data_loss not in ("true", "false"):
        raise SourceError(f"option 'failOnDataLoss' must be true or false: {fail_on_data_loss!r}")
    try:
        retention_ms = parse_duration_ms(
            lowered.get("progressretention", str(PROGRESS_RETENTION_MS))
        )
    except ValueError as error:
        raise SourceError(f"option 'progressRetention': {error}") from None
    if retention_ms < 60_000:
        raise SourceError(f"option 'progressRetention' must be at least 1m: {retention_ms} ms")
    return {
        "max_event_time_ahead_ms": ahead_ms,
        "fail_on_data_loss": fail_on_data_loss == "true",
        "progress_retention_ms": retention_ms,
    }


def channel(topic: str, partition: int | str) -> str:
    """A valve channel: one partition of one subscribed topic, named as the control
    topic's keys name it."""
    return partition_key(topic, int(partition))
