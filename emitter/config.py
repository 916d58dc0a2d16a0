"""The configurations of ``emit`` and of ``finish`` and ``status``: frozen models for flags,
YAML (``emit``'s) and SLACKWATER_* variables."""

from __future__ import annotations

import re
import socket
import uuid
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

from slackwater import kafka_evidence
from slackwater.markers import TOPIC_NAME_PATTERN
from slackwater.settings import DurationMs, KafkaSettings

_TOPIC = re.compile(TOPIC_NAME_PATTERN)
# Kafka's longest topic name (249) less the election topic's suffix (".emitters").
MAX_CONTROL_TOPIC_NAME = 249 - len(".emitters")


def _split_topics(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _default_emitter_id() -> str:
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class EmitterConfig(KafkaSettings):
    """Settings of ``slackwater emit``. Durations take '500ms', '3s', '5m'."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(min_length=1)
    topics: Annotated[list[str], BeforeValidator(_split_topics), Field(min_length=1)]
    control_topic: str
    group: str | None = None
    idle_timeout_ms: DurationMs = 30_000
    poll_interval_ms: DurationMs = 1_000
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    # Per-partition series on /metrics; false keeps per-topic aggregates only (clusters
    # with tens of thousands of partitions).
    metrics_per_partition: bool = True
    # kafka_config, kafka_config_file: KafkaSettings'.
    emitter_id: str = Field(default_factory=_default_emitter_id, min_length=1)
    # A topic missing from this many successful metadata polls in a row counts as
    # deleted (its partitions become FINISHED): kafka_evidence rule 2's count at least
    # (told twice in a row), more only for a cluster whose metadata lags further.
    deleted_topic_polls: int = kafka_evidence.TOLD_IN_A_ROW
    request_timeout_ms: DurationMs = 5_000
    # Topic metadata (partitions added, topics deleted) is re-read this often, at
    # every poll while a watched topic is missing, and after a leader moved.
    metadata_interval_ms: DurationMs = 10_000
    # The emitters' own group (election.py): of all emitters on one control topic, the
    # member it assigns the election topic's partition 0 publishes, the others stand by. Default:
    # slackwater-emitters.<control_topic>.
    election_group: str | None = Field(default=None, min_length=1)
    # How long the group waits for a silent member before another takes over (the
    # classic group protocol's session.timeout.ms; the broker bounds it by its
    # group.min/max.session.timeout.ms, 6 s to 30 min by default).
    session_timeout_ms: DurationMs = 10_000

    @property
    def election_group_name(self) -> str:
        return self.election_group or f"slackwater-emitters.{self.control_topic}"

    @field_validator("topics")
    @classmethod
    def _topic_names(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if not _TOPIC.match(topic):
                raise ValueError(f"not a valid Kafka topic name: {topic!r}")
        if len(set(topics)) != len(topics):
            raise ValueError("a topic is listed twice")
        return topics

    @field_validator("control_topic")
    @classmethod
    def _control_topic_name(cls, topic: str, info: ValidationInfo) -> str:
        if not _TOPIC.match(topic):
            raise ValueError(f"not a valid Kafka topic name: {topic!r}")
        if len(topic) > MAX_CONTROL_TOPIC_NAME:  # its election topic must be a name too
            raise ValueError(
                f"at most {MAX_CONTROL_TOPIC_NAME} characters (the emitters' election topic "
                f"is named <control_topic>.emitters), got {len(topic)}"
            )
        if topic in info.data.get("topics", []):
            raise ValueError("the control topic must not be one of the watched topics")
        return topic

    @field_validator("deleted_topic_polls")
    @classmethod
    def _told_in_a_row(cls, polls: int) -> int:
        if polls < kafka_evidence.TOLD_IN_A_ROW:
            raise ValueError(
                f"at least {kafka_evidence.TOLD_IN_A_ROW}: a topic is believed deleted only "
                f"when told so {kafka_evidence.TOLD_IN_A_ROW} times in a row, got {polls}"
            )
        return polls

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, servers: str) -> str:
        return host_ports(servers)


def host_ports(servers: str) -> str:
    for server in servers.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {servers!r}")
    return servers


class ControlConfig(KafkaSettings):
    """Settings of ``slackwater finish`` and ``status`` (the control topic's, from flags and
    SLACKWATER_* variables: an emitter's own variables serve them in its container)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: Annotated[str, Field(min_length=1), AfterValidator(host_ports)]
    control_topic: Annotated[str, Field(pattern=TOPIC_NAME_PATTERN)]
