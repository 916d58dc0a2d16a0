"""Every metric the emitter exports, in one place (listed in docs/metrics.md).

Counters and the histogram are updated as things happen. Per-partition values
(up to tens of thousands of series) are not pushed into labelled gauges on
every poll; a collector reads them from the emitter's state when Prometheus
scrapes, as kminion's exporter does, so a poll costs nothing for metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from slackwater.markers import MarkerStatus

if TYPE_CHECKING:
    from emitter.control_topic_watch import ControlTopicFindings

PREFIX = "slackwater_emitter_"

# The *_created series double the output and no dashboard of ours reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    status: MarkerStatus
    log_end_offset: int | None
    still_seconds: float
    lag_offsets: int | None
    lag_seconds: float | None


@dataclass(frozen=True)
class Snapshot:
    """What the collector exports at scrape time; the service builds it under its lock."""

    group: str | None = None
    partitions: list[PartitionRow] = field(default_factory=list)
    missing_topics: list[str] = field(default_factory=list)
    partitions_without_owner: int | None = None
    members_without_partitions: int | None = None
    group_members: int | None = None
    unlisted_partitions: int = 0
    unlisted_partitions_dropped: int = 0
    watched_partitions: int = 0


class SnapshotSource(Protocol):
    """The service's snapshot; ``rows=False`` leaves out the per-partition rows (the
    registry's gauges need only counts: one scrape builds the rows once)."""

    def __call__(self, rows: bool = True) -> Snapshot: ...


class EmitterMetrics:
    # The control topic's health, registered by the emitter's first check of it
    # (control_topic_repair.py): a standby that never checked exports none.
    control_topic: ControlTopicMetrics | None = None

    def __init__(self, snapshot: SnapshotSource, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._snapshot = snapshot
        r = self.registry
        self.broker_up = Gauge(
            PREFIX + "broker_up",
            "1 if the last poll reached the broker (metadata answered), else 0.",
            registry=r,
        )
        self.info = Info(
            PREFIX + "build", "Emitter identity: id, epoch, control topic.", registry=r
        )
        self.epoch = Gauge(PREFIX + "epoch", "This emitter's generation (fencing).", registry=r)
        self.fenced = Gauge(
            PREFIX + "fenced",
            "1 if a newer emitter wrote to the control topic and this one stopped publishing.",
            registry=r,
        )
        self._role_metrics(r)
        self.markers_published = Counter(
            PREFIX + "markers_published",
            "Markers acknowledged by the broker, by status.",
            ["status"],
            registry=r,
        )
        self.marker_publish_failures = Counter(
            PREFIX + "marker_publish_failures",
            "Markers the broker did not acknowledge (proposed again next poll).",
            registry=r,
        )
        self.poll_duration = Histogram(
            PREFIX + "poll_duration_seconds",
            "Wall time of one poll of the broker.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.poll_errors = Counter(
            PREFIX + "poll_errors",
            "Failed Admin API requests, by request kind.",
            ["request"],
            registry=r,
        )
        self.control_records_malformed = Counter(
            PREFIX + "control_records_malformed",
            "Control-topic records skipped because they are not valid markers or requests.",
            registry=r,
        )
        self.control_records_tombstones = Counter(
            PREFIX + "control_records_tombstones",
            "Null-valued control records (compaction's deletions) skipped, not malformed.",
            registry=r,
        )
        self.finish_requests = Counter(
            PREFIX + "finish_requests", "Finish requests read from the control topic.", registry=r
        )
        for status in MarkerStatus:
            self.markers_published.labels(status.value)
        for request in ("metadata", "list_offsets", "group_offsets", "describe_group"):
            self.poll_errors.labels(request)
        r.register(_StateCollector(snapshot))

    def _role_metrics(self, r: CollectorRegistry) -> None:
        # The role among the emitters on one control topic (election.py).
        self.active = Gauge(
            PREFIX + "active",
            "1 while this emitter is the active one of its control topic (it owns the "
            "election topic's partition 0 and is not fenced) and publishes; 0 on a standby.",
            registry=r,
        )
        self.role_since = Gauge(
            PREFIX + "role_since_timestamp_seconds",
            "When this emitter took its current role (active or standby), Unix seconds.",
            registry=r,
        )
        self.takeovers = Counter(
            PREFIX + "takeovers",
            "Times this emitter became the active one and claimed an epoch.",
            registry=r,
        )

    def partition_text(self) -> str:
        """The per-partition series for ``/metrics``, written directly (served after
        the registry's, see render_partition_families)."""
        return render_partition_families(self._snapshot())

    def topic_text(self) -> str:
        """Per-topic aggregates instead, for ``--metrics-per-partition=false``."""
        return render_topic_families(self._snapshot())


class ControlTopicMetrics:
    """The control topic's health: the watch's findings (control_topic_watch.py), set by
    the emitter's keeper (control_topic_repair.py) and read at scrape time, and the
    keeper's repairs."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.findings: ControlTopicFindings | None = None
        self.repairs = Counter(
            PREFIX + "control_topic_repairs",
            "Times the control topic, lost or made again, was written again whole (a new "
            "epoch claim and every partition's current marker).",
            registry=registry,
        )
        registry.register(_ControlTopicCollector(self))


class _ControlTopicCollector(Collector):
    """The control topic's gauges, from the watch's last findings at scrape time: what
    the broker has not told (yet) has no sample, never a 0 that would mean something."""

    def __init__(self, metrics: ControlTopicMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        findings = self._metrics.findings
        values: tuple[bool | int | None, ...] = (None, None, None, None)
        if findings is not None:
            values = (
                findings.present,
                findings.partitions,
                findings.compacted,
                findings.retention_ms,
            )
        for (name, help_text), value in zip(CONTROL_TOPIC_GAUGES, values, strict=True):
            family = GaugeMetricFamily(PREFIX + name, help_text)
            if value is not None:
                family.add_metric([], float(value))
            yield family
        yield CounterMetricFamily(
            PREFIX + "control_topic_recreations",
            "Times the control topic was found gone (the broker said so twice in a row) or "
            "made again under its name (a new topic id): the emitter's memory lost.",
            value=0 if findings is None else findings.recreations,
        )


# The control topic's gauges and their help texts, in _ControlTopicCollector's order.
CONTROL_TOPIC_GAUGES = (
    (
        "control_topic_present",
        "1 while the broker describes the control topic, 0 once it said twice that the "
        "topic does not exist; no sample before the first answer.",
    ),
    ("control_topic_partitions", "Partitions of the control topic (slackwater writes to 0)."),
    (
        "control_topic_compacted",
        "1 if the control topic's cleanup.policy includes compact (every partition's last "
        "marker kept), else 0.",
    ),
    ("control_topic_retention_ms", "The control topic's retention.ms (-1: kept for ever)."),
)


class _StateCollector(Collector):
    def __init__(self, snapshot: SnapshotSource) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot(rows=False)
        yield from _partition_counts(snap)
        yield _missing_topics(snap)
        yield from _group_families(snap)


def _partition_counts(snap: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        PREFIX + "watched_partitions",
        "Partitions of the watched topics being tracked.",
        value=snap.watched_partitions,
    )
    yield GaugeMetricFamily(
        PREFIX + "unlisted_partitions",
        "Partitions of watched topics named by control records but not listed by the "
        "broker: held aside, never marked, taken back if the partition appears.",
        value=snap.unlisted_partitions,
    )
    yield CounterMetricFamily(
        PREFIX + "unlisted_partitions_dropped",
        "Unlisted partitions dropped because the held set was full (1,000).",
        value=snap.unlisted_partitions_dropped,
    )


def _missing_topics(snap: Snapshot) -> Metric:
    missing = GaugeMetricFamily(
        PREFIX + "topic_missing",
        "1 for a watched topic that does not exist (yet); retried every poll.",
        labels=["topic"],
    )
    for topic in snap.missing_topics:
        missing.add_metric([topic], 1.0)
    return missing


def _group_families(snap: Snapshot) -> Iterator[Metric]:
    """The group's ownership and size: one sample each, labelled by the group, when the
    emitter watches a group and its description was read."""
    for name, help_text, value in (
        (
            "partitions_without_owner",
            "Watched partitions that no member of the group is assigned.",
            snap.partitions_without_owner,
        ),
        (
            "group_members_without_partitions",
            "Group members assigned none of the watched partitions.",
            snap.members_without_partitions,
        ),
        (
            "group_members",
            "Members of the watched group, as the group coordinator describes it.",
            snap.group_members,
        ),
    ):
        family = GaugeMetricFamily(PREFIX + name, help_text, labels=["group"])
        if snap.group is not None and value is not None:
            family.add_metric([snap.group], value)
        yield family


# The per-partition families' help texts (render_partition_families writes them).
PARTITION_HELP = {
    "partition_status": "1 for the partition's current status (ACTIVE, IDLE or FINISHED), "
    "0 for the others.",
    "partition_log_end_offset": "Log end offset of the partition.",
    "partition_still_seconds": "Seconds the log end has not moved, counted over successful "
    "polls only.",
    "group_lag_offsets": "Log end minus the group's committed offset.",
    "group_lag_seconds": "Estimated seconds since the log end passed the committed offset "
    "(interpolated on the log end timeline).",
}


def render_partition_families(snap: Snapshot) -> str:
    """The per-partition families as exposition text, written directly.

    At 10,000 partitions they are 70,000 samples, and prometheus_client's encoder spent
    390 ms (text) and 645 ms (OpenMetrics) on them, label validation and escaping per
    sample; these are gauges whose lines are the same in both formats, so they are
    written here in one pass, identical to what the encoder writes (a test compares).
    """
    group = None if snap.group is None else _escape(snap.group)
    status_lines, log_end_lines, still_lines, lag_lines, lag_s_lines = [], [], [], [], []
    for row in snap.partitions:
        # Label names in sorted order, as the encoders write them.
        partition, topic = f'partition="{row.partition}"', f'topic="{_escape(row.topic)}"'
        where = f"{partition},{topic}"
        for candidate in MarkerStatus:
            value = "1.0" if candidate is row.status else "0.0"
            status_lines.append(
                f'{PREFIX}partition_status{{{partition},status="{candidate.value}",{topic}}} '
                f"{value}\n"
            )
        if row.log_end_offset is not None:
            log_end_lines.append(
                f"{PREFIX}partition_log_end_offset{{{where}}} {_number(row.log_end_offset)}\n"
            )
            still_lines.append(
                f"{PREFIX}partition_still_seconds{{{where}}} {_number(row.still_seconds)}\n"
            )
        if group is not None and row.lag_offsets is not None:
            lag_lines.append(
                f'{PREFIX}group_lag_offsets{{group="{group}",{where}}} {_number(row.lag_offsets)}\n'
            )
        if group is not None and row.lag_seconds is not None:
            lag_s_lines.append(
                f'{PREFIX}group_lag_seconds{{group="{group}",{where}}} {_number(row.lag_seconds)}\n'
            )
    parts = []
    for name, lines in (
        ("partition_status", status_lines),
        ("partition_log_end_offset", log_end_lines),
        ("partition_still_seconds", still_lines),
        ("group_lag_offsets", lag_lines),
        ("group_lag_seconds", lag_s_lines),
    ):
        help_text = _escape_help(PARTITION_HELP[name])
        parts.append(f"# HELP {PREFIX}{name} {help_text}\n# TYPE {PREFIX}{name} gauge\n")
        parts.extend(lines)
    return "".join(parts)


def _number(value: float) -> str:
    """A sample value exactly as the encoders write it (floatToGoString), the common case
    without its call: a non-negative number under a million is Python's float repr."""
    if 0 <= value < 1_000_000:
        return repr(float(value))
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def render_topic_families(snap: Snapshot) -> str:
    """Per topic: partitions by status, and the group's lag summed (offsets) and at its
    worst (seconds): a few series per topic instead of seven per partition."""
    by_status: dict[tuple[str, str], int] = {}
    lag_offsets: dict[str, float] = {}
    lag_seconds: dict[str, float] = {}
    for row in snap.partitions:
        key = (row.topic, row.status.value)
        by_status[key] = by_status.get(key, 0) + 1
        if row.lag_offsets is not None:
            lag_offsets[row.topic] = lag_offsets.get(row.topic, 0) + row.lag_offsets
        if row.lag_seconds is not None:
            lag_seconds[row.topic] = max(lag_seconds.get(row.topic, 0.0), row.lag_seconds)
    topics = sorted({row.topic for row in snap.partitions})
    lines = [
        f"# HELP {PREFIX}topic_partitions Partitions of the topic by status.\n"
        f"# TYPE {PREFIX}topic_partitions gauge\n"
    ]
    for topic in topics:
        for status in MarkerStatus:
            count = by_status.get((topic, status.value), 0)
            lines.append(
                f'{PREFIX}topic_partitions{{status="{status.value}",topic="{_escape(topic)}"}} '
                f"{_number(count)}\n"
            )
    if snap.group is not None:
        group = _escape(snap.group)
        for name, values, help_text in (
            ("topic_group_lag_offsets", lag_offsets, "The group's lag summed over the topic."),
            ("topic_group_lag_seconds_max", lag_seconds, "The group's worst lag in the topic."),
        ):
            lines.append(f"# HELP {PREFIX}{name} {help_text}\n# TYPE {PREFIX}{name} gauge\n")
            for topic in sorted(values):
                lines.append(
                    f'{PREFIX}{name}{{group="{group}",topic="{_escape(topic)}"}} '
                    f"{_number(values[topic])}\n"
                )
    return "".join(lines)
