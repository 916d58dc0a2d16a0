"""``slackwater consume``: argument parsing, the metrics server, a clean stop."""

from __future__ import annotations

import argparse
import logging
import sys

from emitter.cli_types import directory, duration, ensure_port_free, log_level, port, topic_name
from emitter.lifecycle import stop_on_signals
from emitter.settings import ConfigError, config_from_args

EXIT_CONFIG = 2


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.yaml", help="settings file (YAML)")
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT")
    parser.add_argument("--topic", type=topic_name, metavar="T")
    parser.add_argument("--control-topic", type=topic_name, metavar="C")
    parser.add_argument("--window", dest="window_ms", type=duration, metavar="10s")
    parser.add_argument("--slide", dest="slide_ms", type=duration, metavar="10s")
    parser.add_argument("--max-out-of-orderness", dest="max_out_of_orderness_ms", metavar="2s")
    parser.add_argument(
        "--event-time-field",
        metavar="F",
        help="JSON field with epoch ms or ISO 8601 (default: Kafka timestamp)",
    )
    parser.add_argument("--key-field", metavar="F", help="JSON field (default: Kafka key)")
    parser.add_argument("--output", type=directory, metavar="DIR")
    parser.add_argument("--output-format", choices=["json", "parquet"])
    parser.add_argument("--late-output", type=directory, metavar="DIR")
    parser.add_argument("--checkpoint", type=directory, metavar="DIR")
    parser.add_argument("--trigger", dest="trigger_ms", type=duration, metavar="1s")
    parser.add_argument("--starting-offsets", choices=["earliest", "latest"])
    parser.add_argument(
        "--consumer-idle-timeout", dest="consumer_idle_timeout_ms", metavar="off|30s"
    )
    parser.add_argument("--metrics-host")
    parser.add_argument("--metrics-port", type=port)
    parser.add_argument("--kafka-config", action="append", metavar="KEY=VALUE")
    parser.add_argument("--log-level", type=log_level, default="INFO")


def run_consume(args: argparse.Namespace) -> int:
    from spark_consumer.config import ConsumerConfig

    try:
        config = config_from_args(ConsumerConfig, args)
    except ConfigError as error:
        print(f"slackwater consume: {error}", file=sys.stderr)
        return EXIT_CONFIG
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from spark_consumer.java_check import check_java

    problem = check_java()
    if problem is not None:
        print(f"slackwater consume: {problem}", file=sys.stderr)
        return 1

    from emitter.http_server import MetricsServer
    from spark_consumer.metrics import ConsumerMetrics
    from spark_consumer.pipeline import spark_session, start

    metrics = ConsumerMetrics()
    server = None
    if config.metrics_port is not None:
        problem = ensure_port_free(config.metrics_host, config.metrics_port)
        if problem is not None:
            print(f"slackwater consume: metrics port: {problem}", file=sys.stderr)
            return 1
        server = MetricsServer(
            config.metrics_host, config.metrics_port, metrics.registry, {}
        ).start()
    stop = stop_on_signals("spark_consumer")
    spark = spark_session()
    spark.sparkContext.setLogLevel("WARN")
    query = start(spark, config, on_batch=metrics.record)
    metrics.up.set(1)
    try:
        while not stop.is_set() and query.isActive:
            stop.wait(0.5)
        failure = query.exception()
        if failure is not None:
            print(f"slackwater consume: the streaming query failed: {failure}", file=sys.stderr)
            return 1
        return 0
    finally:
        metrics.up.set(0)
        if query.isActive:
            query.stop()
        spark.stop()
        if server is not None:
            server.stop()
