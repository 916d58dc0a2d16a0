"""The metrics of ``slackwater consume`` (listed in docs/metrics.md): the source's, read
from the query's progress at scrape time (``slackwater_source_*``), and the job's own
(``slackwater_consume_*``), fed by a Spark query listener."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_consumer.consume.job import windows_emitted
from spark_consumer.source.metrics import Queries, SourceCollector

PREFIX = "slackwater_consume_"


class ConsumeMetrics(StreamingQueryListener):
    """Registered with ``spark.streams.addListener``: each finished micro-batch of the
    window query counts its output rows and its duration."""

    def __init__(self, queries: Queries, query_name: str = "slackwater_windows") -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SourceCollector(queries))
        self._query_name = query_name
        r = self.registry
        self.windows_emitted = Counter(
            PREFIX + "windows_emitted",
            "Window rows written to the output (each closed window and key once).",
            registry=r,
        )
        self.batches = Counter(PREFIX + "batches", "Micro-batches run.", registry=r)
        self.batch_duration = Histogram(
            PREFIX + "batch_duration_seconds",
            "Wall time of a micro-batch, planning included.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )

    def attach(self, spark: SparkSession) -> ConsumeMetrics:
        spark.streams.addListener(self)
        return self

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        if progress.name != self._query_name:
            return
        self.batches.inc()
        self.batch_duration.observe(progress.durationMs.get("triggerExecution", 0) / 1000)
        self.windows_emitted.inc(windows_emitted(progress))

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass
