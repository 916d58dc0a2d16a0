"""The slackwater source for Spark Structured Streaming: Kafka records, with the valve's
watermark (Flink's StatusWatermarkValve over the emitter's markers) handed to Spark as
its own. Its face: what a job imports.

Inside, one file per job (docs/architecture.md draws them): ``stream`` (the DataSource
and ``read_stream``), ``options``; on the driver ``planner`` (only what Spark calls),
``broker`` (every broker question), ``progress_collector``, ``control_reader``,
``partitions``, ``plan``, ``planner_process`` (a stop's SIGTERM); for both ``offset``
(the checkpointed offset), ``splits`` (a batch's tasks), ``progress`` (what readers
report), ``event_time``, ``late_rows``; on the executors ``readers``,
``reader_ranges``, ``arrow_rows``, ``reader_clients``; and ``metrics``. The valve and the
aligner beside it (``spark_consumer.valve``, ``spark_consumer.alignment``) are the pure
core; ``spark_consumer.consume`` is an application on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_consumer.source.options import SOURCE_NAME, SourceError
from spark_consumer.source.stream import (
    SlackwaterKafkaSource,
    StreamKeywords,
    read_stream,
    stream_options,
    with_valve_watermark,
)

if TYPE_CHECKING:
    from spark_consumer.source.metrics import serve_source_metrics

__all__ = [
    "SOURCE_NAME",
    "SlackwaterKafkaSource",
    "SourceError",
    "StreamKeywords",
    "read_stream",
    "serve_source_metrics",
    "stream_options",
    "with_valve_watermark",
]


def __getattr__(name: str) -> Any:
    """``serve_source_metrics`` on first use: a Spark Python worker, which imports this
    package to read a task, needs neither prometheus_client nor an HTTP server."""
    if name == "serve_source_metrics":
        from spark_consumer.source.metrics import serve_source_metrics

        return serve_source_metrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
