"""Every metric of the slackwater source, read at scrape time from the queries' progress.

The source's planning runs in a Python process of Spark's own, not in the job's; what it
decided is in the offset it returned, which Spark reports in each query's progress. So
the job's process exports it from there: exact (the same state a restart restores),
cumulative across restarts (the counters travel in the checkpointed offset), with no
second channel from the planner. Listed in docs/metrics.md.

    serve_source_metrics(lambda: [query], port=9464)   # GET /metrics
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pyspark.sql.streaming.query import StreamingQuery

from slackwater.http_server import MetricsServer
from slackwater.markers import MarkerStatus
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.source.wire.offset_error import OffsetFormatError
from spark_consumer.valve import WatermarkStatus

PREFIX = "slackwater_source_"

Queries = Callable[[], list[StreamingQuery]]


def source_offsets(query: StreamingQuery) -> list[SourceOffset]:
    """The last planned offset of every slackwater source in the query."""
    return offsets_in(query.lastProgress)


def offsets_in(progress: Any) -> list[SourceOffset]:
    """The planned offset of every slackwater source in one progress report."""
    if not progress:
        return []
    offsets = []
    for source in progress["sources"] or []:
        end = source["endOffset"]
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                continue
        if isinstance(end, dict) and "aligner" in end and "watermark" in end:
            with contextlib.suppress(OffsetFormatError):
                offsets.append(SourceOffset.decode(end))
    return offsets


def partitions_of(offset: SourceOffset) -> dict[str, tuple[str, int]]:
    """{"topic:partition": (its status at the source, its watermark ms)} in an offset."""
    watermarks = offset.channel_watermarks()
    return {
        channel: (status, watermarks.get(channel, 0))
        for channel, status in offset.statuses().items()
    }


# The gauges of each query: name, help, labels after "query" (in the order of /metrics).
_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "up": ("1 while the streaming query runs without failure.", ()),
    "valve_watermark_ms": (
        "The valve's output watermark planned last (ms since the epoch); Spark applies "
        "it from the next batch on.",
        (),
    ),
    "valve_status": ("1 for the valve's output status, 0 for the others.", ("status",)),
    "partition_status": (
        "1 for the partition's status at the source, 0 for the others.",
        ("topic", "partition", "status"),
    ),
    "partition_watermark_ms": (
        "Newest event time read on the partition minus the max out-of-orderness.",
        ("topic", "partition"),
    ),
    "markers_pending": ("Markers waiting for the read position to reach their offset.", ()),
    "progress_wait_seconds": ("How long the last planning waited for the readers' progress.", ()),
    "markers_held": (
        "Markers for partitions the broker does not list, held until they appear.",
        (),
    ),
    "alignment_partitions_held": (
        "Partitions the last batch planned no records for: more than maxWatermarkDrift "
        "ahead of the slowest partition the valve waits for (absent with the option off).",
        (),
    ),
    "alignment_furthest_ahead_ms": (
        "How far the watermark of the partition furthest ahead, among those the valve waits "
        "for that have records to read, is above the slowest one the valve waits for (absent with "
        "maxWatermarkDrift off).",
        (),
    ),
}


class SourceCollector(Collector):
    """Metric families built per scrape from each query's last planned offset."""

    def __init__(self, queries: Queries) -> None:
        self._queries = queries

    def collect(self) -> Iterator[Metric]:
        gauges = {
            name: GaugeMetricFamily(PREFIX + name, help_text, labels=["query", *labels])
            for name, (help_text, labels) in _GAUGES.items()
        }
        counters = {
            name: CounterMetricFamily(PREFIX + name, help_text, labels=["query"])
            for name, help_text in _COUNTERS.items()
        }
        rejected = CounterMetricFamily(
            PREFIX + "markers_rejected",
            "Markers ignored (stale epoch, after FINISHED, topic not read), by reason.",
            labels=["query", "reason"],
        )
        for query in self._queries():
            name = query.name or str(query.id)
            running = query.isActive and query.exception() is None
            gauges["up"].add_metric([name], 1.0 if running else 0.0)
            for offset in source_offsets(query):
                _add_offset(offset, name, gauges)
                aligner_counters = offset.aligner["counters"]
                values = {**offset.counters, **aligner_counters}
                for key, family in counters.items():
                    family.add_metric([name], float(values.get(key, 0)))
                for reason, count in aligner_counters["markers_rejected"].items():
                    rejected.add_metric([name, reason], float(count))
        yield from gauges.values()
        yield from counters.values()
        yield rejected


def _add_offset(offset: SourceOffset, name: str, gauges: dict[str, GaugeMetricFamily]) -> None:
    """One source's gauges, from its last planned offset."""
    gauges["valve_watermark_ms"].add_metric([name], float(offset.watermark))
    for candidate in WatermarkStatus:
        gauges["valve_status"].add_metric(
            [name, candidate.value], float(candidate.value == offset.status)
        )
    for channel, (partition_state, channel_watermark) in partitions_of(offset).items():
        topic, _, partition = channel.rpartition(":")
        for marker_status in MarkerStatus:
            gauges["partition_status"].add_metric(
                [name, topic, partition, marker_status.value],
                float(marker_status.value == partition_state),
            )
        gauges["partition_watermark_ms"].add_metric(
            [name, topic, partition], float(channel_watermark)
        )
    pending = sum(len(row[-1]) for row in offset.aligner["partitions"])
    gauges["markers_pending"].add_metric([name], pending)
    gauges["progress_wait_seconds"].add_metric([name], offset.progress_wait_ms / 1000)
    gauges["markers_held"].add_metric([name], len(offset.held))
    if offset.alignment:  # maxWatermarkDrift on
        gauges["alignment_partitions_held"].add_metric([name], offset.alignment["held"])
        furthest = offset.alignment.get("furthest_ahead_ms")
        if furthest is not None:
            gauges["alignment_furthest_ahead_ms"].add_metric([name], float(furthest))


# Counters kept in the offset (the source's own and the aligner's), cumulative across
# restarts of the query.
_COUNTERS = {
    "records": "Records read (each range once, replays not counted twice).",
    "records_late": "Records whose event time was below the watermark Spark applied.",
    "records_unreadable": "Records without a readable event time (event_time null, late).",
    "records_dropped": "Records written to the late output (option lateOutput): dropped by "
    "the job's aggregation, or unreadable.",
    "markers_read": "Markers read from the control topic.",
    "markers_applied": "Markers applied to the valve.",
    "markers_superseded": "IDLE markers contradicted by data at or after their offset.",
    "control_malformed": "Control records skipped as malformed.",
    "control_tombstones": "Null-valued control records (compaction's deletions), skipped.",
    "markers_held_dropped": "Markers for unlisted partitions dropped: the held list was full.",
    "records_after_finished": "Records read on a FINISHED partition (a protocol violation).",
    "data_reactivations": "IDLE partitions made ACTIVE again by data (data beats markers).",
    "records_lost": "Records gone before they were read (retention, a deleted, re-created or "
    "truncated log; planned, or only seen in a log end), skipped with failOnDataLoss=false.",
    "offsets_went_back": "Partitions read again from their earliest offset because their log "
    "is a new one (topic re-created, or truncated below the read position), "
    "failOnDataLoss=false.",
    "partitions_deleted": "Partitions gone from the broker (topic deleted, or re-created with "
    "fewer partitions): they count as FINISHED.",
    "partitions_ended": "Partitions a bounded run (endingOffsets) read to their ends: they "
    "count as FINISHED.",
    "control_went_back": "Times the control topic ended before the query's position "
    "(re-created): read again from its start.",
    "partitions_after_finished": "Partitions that appeared after every partition had FINISHED "
    "(their records are data after FINISHED).",
    "progress_lost": "Ranges of the last batch whose progress was found gone at a restart "
    "(progress topic retention, or the topic deleted or re-created): read as unknown, which "
    "can only hold the watermark back.",
    "progress_malformed": "Records on the progress topic under a wanted key that are not "
    "progress records, skipped.",
}


def source_registry(queries: Queries) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SourceCollector(queries))
    return registry


def serve_source_metrics(queries: Queries, port: int, host: str = "0.0.0.0") -> MetricsServer:
    """``/metrics`` for the slackwater sources of the given queries, in a thread."""
    return MetricsServer(host, port, source_registry(queries), {}).start()
