"""The consumer's configuration: one frozen model for flags, YAML and SLACKWATER_* variables."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from emitter.settings import parse_duration_ms, parse_key_values

DurationMs = Annotated[int, BeforeValidator(parse_duration_ms), Field(gt=0)]
_TOPIC = r"^[a-zA-Z0-9._-]{1,249}$"
_FIELD = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _off_or_duration(value: Any) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    return parse_duration_ms(value)


class ConsumerConfig(BaseModel):
    """Settings of ``slackwater consume`` and of :func:`spark_consumer.pipeline.start`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(min_length=1)
    topic: Annotated[str, Field(pattern=_TOPIC)]
    control_topic: Annotated[str, Field(pattern=_TOPIC)]
    window_ms: DurationMs
    slide_ms: DurationMs | None = None
    max_out_of_orderness_ms: Annotated[int, BeforeValidator(parse_duration_ms), Field(ge=0)]
    event_time_field: str | None = None
    key_field: str | None = None
    output: str = Field(min_length=1)
    output_format: Literal["json", "parquet"] = "json"
    late_output: str | None = None
    checkpoint: str = Field(min_length=1)
    trigger_ms: DurationMs = 1_000
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    consumer_idle_timeout_ms: Annotated[int | None, BeforeValidator(_off_or_duration)] = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=9465, ge=0, le=65535)
    kafka_config: Annotated[dict[str, str], BeforeValidator(parse_key_values)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _consistent(self) -> ConsumerConfig:
        if self.control_topic == self.topic:
            raise ValueError("control_topic: must differ from topic")
        if self.slide_ms is not None and self.slide_ms > self.window_ms:
            raise ValueError("slide_ms: must not exceed window_ms")
        if self.slide_ms is not None and self.window_ms % self.slide_ms:
            raise ValueError("slide_ms: must divide window_ms")
        for name in ("event_time_field", "key_field"):
            value = getattr(self, name)
            if value is not None and not _FIELD.match(value):
                raise ValueError(f"{name}: a JSON field name like 'ts' or 'user.id'")
        return self

    @property
    def effective_slide_ms(self) -> int:
        return self.slide_ms or self.window_ms

    @property
    def effective_late_output(self) -> str:
        """Late and unreadable records go here: nothing is dropped silently."""
        return self.late_output or self.output.rstrip("/") + "-late"
