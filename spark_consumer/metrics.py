"""Every metric the Spark consumer exports, in one place (listed in docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from emitter.markers import MarkerStatus
from spark_consumer.alignment import MarkerAligner
from spark_consumer.pipeline import BatchReport
from spark_consumer.valve import MIN_WATERMARK, WatermarkStatus

PREFIX = "slackwater_consumer_"


class ConsumerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.up = Gauge(PREFIX + "up", "1 while the streaming query runs.", registry=r)
        self.valve_watermark = Gauge(
            PREFIX + "valve_watermark_ms",
            "The valve's output watermark (ms since the epoch).",
            registry=r,
        )
        self.valve_status = Gauge(
            PREFIX + "valve_status",
            "1 for the valve's output status, 0 for the others.",
            ["status"],
            registry=r,
        )
        self.partition_status = Gauge(
            PREFIX + "partition_status",
            "1 for the partition's status at the consumer, 0 for the others.",
            ["partition", "status"],
            registry=r,
        )
        self.partition_watermark = Gauge(
            PREFIX + "partition_watermark_ms",
            "Newest event time read on the partition minus the max out-of-orderness.",
            ["partition"],
            registry=r,
        )
        self.records_read = Counter(PREFIX + "records_read", "Data records read.", registry=r)
        self.records_late = Counter(
            PREFIX + "records_late",
            "Records older than the valve watermark when read (written to the late output).",
            registry=r,
        )
        self.records_dead_lettered = Counter(
            PREFIX + "records_dead_lettered",
            "Records whose event time could not be read (written to the late output).",
            registry=r,
        )
        self.records_after_finished = Gauge(
            PREFIX + "records_after_finished",
            "Records read on a FINISHED partition since the query began (a protocol "
            "violation; still processed).",
            registry=r,
        )
        self.windows_emitted = Counter(
            PREFIX + "windows_emitted", "Window-key rows written to the output.", registry=r
        )
        self.markers_applied = Gauge(
            PREFIX + "markers_applied",
            "Markers applied since the query began (from state).",
            registry=r,
        )
        self.markers_pending = Gauge(
            PREFIX + "markers_pending",
            "Markers waiting for the read position to reach their offset.",
            registry=r,
        )
        self.markers_rejected = Gauge(
            PREFIX + "markers_rejected",
            "Markers ignored (stale epoch, after FINISHED, other topic), since the query began.",
            ["reason"],
            registry=r,
        )
        self.control_records_malformed = Counter(
            PREFIX + "control_records_malformed",
            "Control records skipped as malformed.",
            registry=r,
        )
        self.batch_duration = Histogram(
            PREFIX + "batch_duration_seconds",
            "Wall time of the slackwater part of a micro-batch.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.valve_watermark.set(MIN_WATERMARK)

    def record(self, report: BatchReport, aligner: MarkerAligner) -> None:
        """Called after every micro-batch (a replayed one counts again: counters are
        per process, the state-derived gauges are exact)."""
        self.records_read.inc(report.records)
        self.records_late.inc(report.late)
        self.records_dead_lettered.inc(report.unreadable)
        self.windows_emitted.inc(report.windows_emitted)
        self.control_records_malformed.inc(report.control_malformed)
        self.batch_duration.observe(report.duration_s)
        self.valve_watermark.set(aligner.valve.watermark)
        for valve_status in WatermarkStatus:
            self.valve_status.labels(valve_status.value).set(
                1 if aligner.valve.status is valve_status else 0
            )
        counters = aligner.counters
        self.markers_applied.set(counters.markers_applied)
        self.markers_pending.set(aligner.pending_count)
        for reason, count in counters.markers_rejected.items():
            self.markers_rejected.labels(reason).set(count)
        self.records_after_finished.set(counters.records_after_finished)
        for partition in aligner.partitions:
            for status in MarkerStatus:
                self.partition_status.labels(str(partition), status.value).set(
                    1 if aligner.status_of(partition) is status else 0
                )
            self.partition_watermark.labels(str(partition)).set(
                aligner.valve.channel_watermark(partition)
            )
