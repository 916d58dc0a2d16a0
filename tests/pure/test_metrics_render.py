"""The emitter's per-partition series, written directly for speed
(`render_partition_families`), are byte for byte what prometheus_client's encoders
write for the same families, in the text format and in OpenMetrics."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector

from emitter.metrics import (
    PARTITION_HELP,
    PREFIX,
    PartitionRow,
    Snapshot,
    render_partition_families,
    render_topic_families,
)
from slackwater.markers import MarkerStatus
from tests.harness.factories import samples


def _snapshot(group: str | None) -> Snapshot:
    rows = [
        PartitionRow("orders", 0, MarkerStatus.ACTIVE, 12, 0.5, 3, 1.25),
        PartitionRow("orders", 1, MarkerStatus.IDLE, 1_000_000_000_000, 30.0, 0, 0.0),
        PartitionRow("orders.v2_x-y", 17, MarkerStatus.FINISHED, None, 0.0, None, None),
        PartitionRow("t", 3, MarkerStatus.ACTIVE, 0, 1e-05, 7, None),
    ]
    return Snapshot(group=group, partitions=rows)


def partition_families(snap: Snapshot) -> list[GaugeMetricFamily]:
    """The same series as prometheus_client's families: the reference."""

    def family(name: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, PARTITION_HELP[name], labels=labels)

    status = family("partition_status", ["topic", "partition", "status"])
    log_end = family("partition_log_end_offset", ["topic", "partition"])
    still = family("partition_still_seconds", ["topic", "partition"])
    lag_offsets = family("group_lag_offsets", ["group", "topic", "partition"])
    lag_seconds = family("group_lag_seconds", ["group", "topic", "partition"])
    for row in snap.partitions:
        key = [row.topic, str(row.partition)]
        for candidate in MarkerStatus:
            status.add_metric([*key, candidate.value], 1.0 if candidate is row.status else 0.0)
        if row.log_end_offset is not None:
            log_end.add_metric(key, row.log_end_offset)
            still.add_metric(key, row.still_seconds)
        if snap.group is not None and row.lag_offsets is not None:
            lag_offsets.add_metric([snap.group, *key], row.lag_offsets)
        if snap.group is not None and row.lag_seconds is not None:
            lag_seconds.add_metric([snap.group, *key], row.lag_seconds)
    return [status, log_end, still, lag_offsets, lag_seconds]


class _Reference(Collector):
    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self):  # type: ignore[no-untyped-def]
        yield from partition_families(self.snap)


def test_the_direct_rendering_equals_the_encoders() -> None:
    for group in ("orders-consumers", 'we"ird\\group\nname', None):
        snap = _snapshot(group)
        registry = CollectorRegistry()
        registry.register(_Reference(snap))
        text = generate_latest(registry).decode()
        assert render_partition_families(snap) == text
        openmetrics = openmetrics_latest(registry).decode()  # type: ignore[no-untyped-call]
        assert openmetrics.endswith("# EOF\n")
        assert render_partition_families(snap) == openmetrics[: -len("# EOF\n")]


offsets = st.integers(0, 2**62)
seconds = st.floats(0, 1e12, allow_nan=False) | st.sampled_from([0.0, 999_999.9, 1e6, 1e-05])


@settings(max_examples=300, deadline=None)
@given(offsets, seconds, offsets, seconds)
def test_every_value_is_written_as_the_encoders_write_it(
    log_end: int, still_s: float, lag: int, lag_s: float
) -> None:
    snap = Snapshot(
        group="g",
        partitions=[PartitionRow("t", 0, MarkerStatus.IDLE, log_end, still_s, lag, lag_s)],
    )
    registry = CollectorRegistry()
    registry.register(_Reference(snap))
    assert render_partition_families(snap) == generate_latest(registry).decode()


def test_per_topic_aggregates_replace_the_per_partition_series() -> None:
    text = render_topic_families(_snapshot("orders-consumers"))
    assert "partition=" not in text
    values = samples(text)
    name = "slackwater_emitter_topic_partitions"
    assert values[f'{name}{{status="ACTIVE",topic="orders"}}'] == 1
    assert values[f'{name}{{status="IDLE",topic="orders"}}'] == 1
    assert values[f'{name}{{status="FINISHED",topic="orders"}}'] == 0
    assert values[f'{name}{{status="FINISHED",topic="orders.v2_x-y"}}'] == 1
    assert values[f'{name}{{status="ACTIVE",topic="t"}}'] == 1
    lag = "slackwater_emitter_topic_group_lag_offsets"
    assert values[f'{lag}{{group="orders-consumers",topic="orders"}}'] == 3 + 0
    assert values[f'{lag}{{group="orders-consumers",topic="t"}}'] == 7
    worst = "slackwater_emitter_topic_group_lag_seconds_max"
    assert values[f'{worst}{{group="orders-consumers",topic="orders"}}'] == 1.25
