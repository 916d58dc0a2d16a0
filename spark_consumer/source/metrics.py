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
from spark_consumer.source.offset import OffsetFormatError, SourceOffset
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


class SourceCollector(Collector):
    """Metric families built per scrape from each query's last planned offset."""

    def __init__(self, queries: Queries) -> None:
        self._queries = queries

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            PREFIX + "up", "1 while the streaming query runs without failure.", labels=["query"]
        )
        watermark = GaugeMetricFamily(
            PREFIX + "valve_watermark_ms",
            "The valve's output watermark planned last (ms since the epoch); Spark applies "
            "it from the next batch on.",
            labels=["query"],
        )
        status = GaugeMetricFamily(
            PREFIX + "valve_status",
            "1 for the valve's output status, 0 for the others.",
            labels=["query", "status"],
        )
        partition_status = GaugeMetricFamily(
            PREFIX + "partition_status",
            "1 for the partition's status at the source, 0 for the others.",
            labels=["query", "topic", "partition", "status"],
        )
        partition_watermark = GaugeMetricFamily(
            PREFIX + "partition_watermark_ms",
            "Newest event time read on the partition minus the max out-of-orderness.",
            labels=["query", "topic", "partition"],
        )
        pending = GaugeMetricFamily(
            PREFIX + "markers_pending",
            "Markers waiting for the read position to reach their offset.",
            labels=["query"],
        )
        held = GaugeMetricFamily(
            PREFIX + "markers_held",
            "Markers for partitions the broker does not list, held until they appear.",
            labels=["query"],
        )
        progress_wait = GaugeMetricFamily(
            PREFIX + "progress_wait_seconds",
            "How long the last planning waited for the readers' progress.",
            labels=["query"],
        )
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
            up.add_metric([name], 1.0 if query.isActive and query.exception() is None else 0.0)
            for offset in source_offsets(query):
                self._add(
                    offset,
                    name,
                    watermark=watermark,
                    status=status,
                    partition_status=partition_status,
                    partition_watermark=partition_watermark,
                )
                aligner = offset.aligner
                pending.add_metric([name], sum(len(row[-1]) for row in aligner["partitions"]))
                progress_wait.add_metric([name], offset.progress_wait_ms / 1000)
                held.add_metric([name], len(offset.held))
                values = {**offset.counters, **aligner["counters"]}
                for key, family in counters.items():
                    family.add_metric([name], float(values.get(key, 0)))
                for reason, count in aligner["counters"]["markers_rejected"].items():
                    rejected.add_metric([name, reason], float(count))
        yield from (up, watermark, status, partition_status, partition_watermark, pending)
        yield progress_wait
        yield held
        yield from counters.values()
        yield rejected

    @staticmethod
    def _add(
        offset: SourceOffset,
        name: str,
        *,
        watermark: GaugeMetricFamily,
        status: GaugeMetricFamily,
        partition_status: GaugeMetricFamily,
        partition_watermark: GaugeMetricFamily,
    ) -> None:
        watermark.add_metric([name], float(offset.watermark))
        for candidate in WatermarkStatus:
            status.add_metric([name, candidate.value], float(candidate.value == offset.status))
        for channel, (partition_state, channel_watermark) in partitions_of(offset).items():
            topic, _, partition = channel.rpartition(":")
            for marker_status in MarkerStatus:
                partition_status.add_metric(
                    [name, topic, partition, marker_status.value],
                    float(marker_status.value == partition_state),
                )
            partition_watermark.add_metric([name, topic, partition], float(channel_watermark))


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
    "records_lost": "Records gone before they were read (retention, a deleted topic), skipped "
    "with failOnDataLoss=false.",
    "offsets_went_back": "Partitions read again from their earliest offset because their log "
    "end went below the read position (re-created topic), failOnDataLoss=false.",
    "partitions_deleted": "Partitions gone from the broker (topic deleted, or re-created with "
    "fewer partitions): they count as FINISHED.",
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
