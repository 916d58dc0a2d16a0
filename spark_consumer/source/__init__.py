"""The slackwater source for Spark Structured Streaming: Kafka records, with the valve's
watermark (Flink's StatusWatermarkValve over the emitter's markers) handed to Spark as
its own. Its face: what a job imports.

Inside, one file per job: ``stream`` (the DataSource and ``read_stream``), ``options``,
``planner`` (the driver's offsets and plan), ``offset`` (the checkpointed offset),
``splits`` (a batch's tasks), ``readers`` (the executors' reading), ``reader_clients``,
``progress`` (what readers report to the planner), ``event_time``, ``late_rows``,
``metrics``. The valve and the aligner beside it (``spark_consumer.valve``,
``spark_consumer.alignment``) are the pure core; ``spark_consumer.consume`` is an
application on top.
"""

from spark_consumer.source.metrics import serve_source_metrics
from spark_consumer.source.options import SOURCE_NAME, SourceError
from spark_consumer.source.stream import SlackwaterKafkaSource, read_stream, with_valve_watermark

__all__ = [
    "SOURCE_NAME",
    "SlackwaterKafkaSource",
    "SourceError",
    "read_stream",
    "serve_source_metrics",
    "with_valve_watermark",
]
