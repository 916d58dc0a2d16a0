"""The slackwater source for Spark Structured Streaming: Kafka records, with the valve's
watermark (Flink's StatusWatermarkValve over the emitter's markers) handed to Spark as
its own. Its face: what a job imports.

Inside, rooms by where they run (docs/architecture.md draws them): the face here
(``stream``: the DataSource and ``read_stream``; ``metrics``), ``driver/`` (Spark's
planner process: ``planner``, only what Spark calls, and the rooms it plans with),
``executor/`` (the Python workers that read a task), ``wire/`` (what travels between
them: the offset, the tasks, the progress records) and ``shared/`` (what both load:
options, event time, late rows). The valve and the aligner beside it
(``spark_consumer.valve``, ``spark_consumer.alignment``) are the pure core;
``spark_consumer.consume`` is an application on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_consumer.source.shared.options import SOURCE_NAME, SourceError
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
