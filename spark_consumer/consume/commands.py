"""``slackwater consume``: argument parsing, the metrics server, a clean stop."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import TYPE_CHECKING

from slackwater.cli import Commands
from slackwater.cli_types import (
    add_kafka_arguments,
    directory,
    duration,
    ensure_port_free,
    log_level,
    port,
    topic_name,
)
from slackwater.kafka_logging import without_secrets
from slackwater.lifecycle import stop_on_signals
from slackwater.settings import EXIT_CONFIG, ConfigError, config_from_args

if TYPE_CHECKING:
    from spark_consumer.consume.config import ConsumerConfig
    from spark_consumer.consume.job import ConsumeJob


def add_consume_command(commands: Commands, name: str) -> None:
    consume = commands.add_parser(
        name, help="the Spark consumer: data + control topics into event-time windows"
    )
    add_consume_arguments(consume)
    consume.set_defaults(run=run_consume)


def add_consume_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``consume``, in the order ``--help`` lists them."""
    parser.add_argument("--config", metavar="FILE.yaml", help="settings file (YAML)")
    _add_query_arguments(parser)
    _add_policy_arguments(parser)
    parser.add_argument("--metrics-host")
    parser.add_argument("--metrics-port", type=port)
    add_kafka_arguments(parser)
    parser.add_argument("--log-level", type=log_level, default="INFO")
    parser.add_argument(
        "--verbose", action="store_true", help="Spark's own log at INFO (default: errors only)"
    )


def _add_query_arguments(parser: argparse.ArgumentParser) -> None:
    """What is read and how it is aggregated: topics, windows, aggregations, event time,
    where the results go and the streaming query's own settings."""
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT")
    parser.add_argument(
        "--topic",
        dest="topics",
        type=topic_name,
        action="append",
        metavar="T",
        help="a data topic (repeat for more)",
    )
    parser.add_argument("--topic-pattern", metavar="REGEX", help="data topics by regex")
    parser.add_argument("--control-topic", type=topic_name, metavar="C")
    parser.add_argument("--window", dest="window_ms", type=duration, metavar="10s")
    parser.add_argument(
        "--slide", dest="slide_ms", type=duration, metavar="5s", help="sliding windows"
    )
    parser.add_argument(
        "--session-gap",
        dest="session_gap_ms",
        type=duration,
        metavar="30s",
        help="session windows (instead of --window)",
    )
    parser.add_argument(
        "--agg",
        dest="aggregations",
        action="append",
        metavar="FN:FIELD",
        help="sum, min, max, avg or approx_distinct of a JSON field, e.g. sum:amount (repeat)",
    )
    parser.add_argument("--max-out-of-orderness", dest="max_out_of_orderness_ms", metavar="2s")
    parser.add_argument(
        "--event-time-field",
        metavar="F",
        help="JSON field with epoch ms or ISO 8601 (default: Kafka timestamp)",
    )
    parser.add_argument("--key-field", metavar="F", help="JSON field (default: Kafka key)")
    parser.add_argument("--output", type=directory, metavar="PATH")
    parser.add_argument("--output-format", choices=["json", "parquet"])
    parser.add_argument("--late-output", type=directory, metavar="PATH")
    parser.add_argument("--checkpoint", type=directory, metavar="PATH")
    parser.add_argument("--trigger", dest="trigger_ms", type=duration, metavar="1s")
    parser.add_argument("--starting-offsets", choices=["earliest", "latest"])
    parser.add_argument("--state-store", choices=["rocksdb", "hdfs"])


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """How partitions without an emitter, lost records and odd event times are taken,
    and the kinds of run (--compare, --backfill)."""
    parser.add_argument(
        "--consumer-idle-timeout",
        dest="consumer_idle_timeout_ms",
        metavar="off|30s",
        help="without an emitter: a partition with no records this long is IDLE (default off)",
    )
    parser.add_argument(
        "--fail-on-data-loss",
        choices=["true", "false"],
        help="records gone before they were read (retention, a deleted or re-created topic) "
        "stop the query (default true; false: counted, logged, skipped)",
    )
    parser.add_argument(
        "--max-event-time-ahead",
        dest="max_event_time_ahead_ms",
        metavar="off|1h",
        help="event times further ahead of the clock are unreadable (default 1h, as Kafka's "
        "log.message.timestamp.after.max.ms)",
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        dest="max_offsets_per_trigger",
        type=int,
        metavar="N",
        help="at most N records a batch (the source's maxOffsetsPerTrigger; default: all)",
    )
    parser.add_argument(
        "--max-watermark-drift",
        dest="max_watermark_drift_ms",
        metavar="off|5m",
        help="watermark alignment: no records for a partition this far ahead of the slowest "
        "one the valve waits for (default off; docs/source.md)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        default=None,
        help="also run plain Spark (its Kafka source, withWatermark) into <output>-plain-spark",
    )
    parser.add_argument(
        "--backfill",
        action="store_true",
        default=None,
        help="a one-off run that ends: reads every partition to its log end now, counts it "
        "FINISHED there, writes every window and exits (a checkpoint it ran on stays a "
        "backfill's; docs/consumer.md)",
    )


def run_consume(args: argparse.Namespace) -> int:
    from spark_consumer.consume.config import ConsumerConfig

    verbose = bool(args.verbose)
    del args.verbose
    try:
        config = config_from_args(ConsumerConfig, args)
    except ConfigError as error:
        print(f"slackwater consume: {error}", file=sys.stderr)
        return EXIT_CONFIG
    logging.getLogger("py4j").setLevel(logging.INFO if verbose else logging.WARNING)
    problem = _cannot_start(config)
    if problem is not None:
        print(f"slackwater consume: {problem}", file=sys.stderr)
        return 1

    from slackwater.http_server import MetricsServer
    from spark_consumer.consume.job import spark_session, start
    from spark_consumer.consume.metrics import ConsumeMetrics

    stop = stop_on_signals("consume")
    spark = spark_session("slackwater-consume", verbose=verbose)
    job = None
    metrics = ConsumeMetrics(lambda: job.queries() if job is not None else []).attach(spark)
    server = None
    if config.metrics_port is not None:
        server = MetricsServer(
            config.metrics_host, config.metrics_port, metrics.registry, {}
        ).start()
    try:
        job = start(spark, config)
        return _run_until_done(job, config, stop)
    finally:
        if job is not None:
            job.stop()
        try:
            spark.stop()
        except Exception as error:  # the JVM may be going down already
            logging.getLogger(__name__).debug("spark stop: %s", error)
        if server is not None:
            server.stop()


def _cannot_start(config: ConsumerConfig) -> str | None:
    """Why the job cannot start (no usable Java, the metrics port taken), before Spark
    takes its seconds to start; None: it can."""
    from slackwater.java_check import check_java

    problem = check_java()
    if problem is not None:
        return problem
    if config.metrics_port is not None:
        problem = ensure_port_free(config.metrics_host, config.metrics_port)
        if problem is not None:
            return f"metrics port: {problem}"
    return None


def _run_until_done(job: ConsumeJob, config: ConsumerConfig, stop: threading.Event) -> int:
    """Waits for the job's queries (or a stop); the command's exit code."""
    # A backfill's queries end once they have read to their ends; until then, and a
    # streaming job's for good, one that stops (it failed) stops the command.
    running = any if config.backfill else all
    while not stop.is_set() and running(q.isActive for q in job.queries()):
        if any(not q.isActive and q.exception() is not None for q in job.queries()):
            break
        stop.wait(0.5)
    for query in job.queries():
        failure = query.exception()
        if failure is not None:
            line = without_secrets(failure_line(failure), config.kafka_config)
            print(f"slackwater consume: the streaming query failed: {line}", file=sys.stderr)
            return 1
    if config.backfill and any(q.isActive for q in job.queries()):
        # A supervisor (a Kubernetes Job) must not take a stopped backfill for done.
        print(
            "slackwater consume: stopped before the backfill ended; run it again with "
            "--backfill to finish it (it goes on to the same ends)",
            file=sys.stderr,
        )
        return 1
    return 0


_TRACEBACK = "Traceback (most recent call last):"


def failure_line(failure: object) -> str:
    """The line that says why a query failed: the source's own (a SourceError's message,
    which Spark wraps in its report and a Python traceback); else a Python worker's
    exception (the line that ends its traceback); else Spark's first line, with the
    deepest ``Caused by:`` (a sink's disk full, a permission denied) when it has one.
    Spark's own reports, which say the same with stack traces, are --verbose's."""
    lines = str(failure).strip().splitlines()
    for line in lines:
        _, found, reason = line.partition("SourceError: ")
        if found:
            return reason
    if not lines:
        return repr(failure)
    for index, line in enumerate(lines):
        if line.rstrip().endswith(_TRACEBACK):
            raised = next(
                (later for later in lines[index + 1 :] if later and not later[0].isspace()),
                None,
            )
            if raised is not None:
                return f"a Python worker failed: {raised.strip()}"
    causes = [line.strip() for line in lines if line.strip().startswith("Caused by: ")]
    return f"{lines[0]} ({causes[-1]})" if causes else lines[0]
