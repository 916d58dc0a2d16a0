"""The consumer's configuration: one frozen model for flags, YAML and SLACKWATER_* variables."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from slackwater.markers import TOPIC_NAME_PATTERN as _TOPIC
from slackwater.settings import (
    DurationMs,
    KafkaSettings,
    parse_duration_ms,
    parse_optional_duration_ms,
)
from spark_consumer.source.shared.event_time import MAX_EVENT_TIME_AHEAD_MS

_FIELD = re.compile(r"^[A-Za-z0-9_.\-]+$")
# What --agg takes: <function>:<JSON field>.
AGGREGATIONS = ("sum", "min", "max", "avg", "approx_distinct")


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


class ConsumerConfig(KafkaSettings):
    """Settings of ``slackwater consume`` (:mod:`spark_consumer.consume.job`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(min_length=1)
    topics: Annotated[
        tuple[Annotated[str, Field(pattern=_TOPIC)], ...], BeforeValidator(_as_list)
    ] = ()
    topic_pattern: str | None = None
    control_topic: Annotated[str, Field(pattern=_TOPIC)]
    window_ms: DurationMs | None = None
    slide_ms: DurationMs | None = None
    session_gap_ms: DurationMs | None = None
    aggregations: Annotated[tuple[str, ...], BeforeValidator(_as_list)] = ()
    max_out_of_orderness_ms: Annotated[int, BeforeValidator(parse_duration_ms), Field(ge=0)]
    event_time_field: str | None = None
    key_field: str | None = None
    output: str = Field(min_length=1)
    output_format: Literal["json", "parquet"] = "json"
    late_output: str | None = None
    checkpoint: str = Field(min_length=1)
    trigger_ms: DurationMs = 1_000
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    state_store: Literal["rocksdb", "hdfs"] = "rocksdb"
    consumer_idle_timeout_ms: Annotated[int | None, BeforeValidator(parse_optional_duration_ms)] = (
        None
    )
    # What production brings (docs/source.md): the source's options of the same names.
    fail_on_data_loss: bool = True
    max_event_time_ahead_ms: Annotated[int | None, BeforeValidator(parse_optional_duration_ms)] = (
        MAX_EVENT_TIME_AHEAD_MS
    )
    # A batch's size, and watermark alignment (docs/source.md): the source's
    # maxOffsetsPerTrigger and maxWatermarkDrift.
    max_offsets_per_trigger: int | None = Field(default=None, ge=1)
    max_watermark_drift_ms: Annotated[int | None, BeforeValidator(parse_optional_duration_ms)] = (
        None
    )
    compare: bool = False
    # A one-off backfill that ends: every partition read to the log end seen at the start,
    # FINISHED there, every window written (the source's endingOffsets=latest under
    # trigger(availableNow=True)).
    backfill: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=9465, ge=0, le=65535)
    # kafka_config, kafka_config_file: KafkaSettings'.

    @model_validator(mode="after")
    def _consistent(self) -> ConsumerConfig:
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("topics: give topics or a topic_pattern, not both or neither")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as error:
                raise ValueError(f"topic_pattern: not a regex: {error}") from None
        if self.control_topic in self.topics:
            raise ValueError("control_topic: must differ from the data topics")
        if (self.window_ms is None) == (self.session_gap_ms is None):
            raise ValueError("window_ms: give a window or a session_gap, not both or neither")
        if self.slide_ms is not None and self.window_ms is None:
            raise ValueError("slide_ms: a session window has no slide")
        if self.slide_ms is not None and self.window_ms and self.slide_ms > self.window_ms:
            raise ValueError("slide_ms: must not exceed window_ms")
        for name in ("event_time_field", "key_field"):
            value = getattr(self, name)
            if value is not None and not _FIELD.match(value):
                raise ValueError(f"{name}: a JSON field name like 'ts' or 'user.id'")
        for aggregation in self.aggregations:
            function, _, field = aggregation.partition(":")
            if function not in AGGREGATIONS or not _FIELD.match(field):
                raise ValueError(
                    f"aggregations: {aggregation!r} is not <function>:<field> with a function "
                    f"of {', '.join(AGGREGATIONS)}"
                )
        return self

    @property
    def effective_late_output(self) -> str:
        """Dropped and unreadable records go here: nothing is dropped silently."""
        return self.late_output or self.output.rstrip("/") + "-late"
