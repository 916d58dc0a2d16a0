"""Seconds from records written to the micro-batch that holds them committed, when every
partition brings a few records: the cost of a batch by partitions, beside Spark's own
Kafka source.

    .venv/bin/python -m bench.small_batches_bench [--partitions 30 300 1000] [--records 1650]

One local[2] SparkSession and Apache Kafka from the launcher. Spark's Kafka source keeps
64 consumers per executor by default (``spark.kafka.consumer.cache.capacity``) and makes
the others again every batch; the session raises the capacity above the largest
partition count, so that it keeps one per partition. Per partition count: a fresh topic
and, for each source in turn, a query on it into the no-op sink (200 ms trigger,
``startingOffsets`` latest), warmed by a first round; then per round the same records in
all (``--records``, spread evenly over the partitions: 1,650 is 5.5 per partition at 300)
are written, and the clock runs until the query's progress reports a batch whose end
offsets hold them all. Median of ``--rounds``.

Planning beside Spark's (issue 33): the same rounds' progress reports give each
source's ``latestOffset`` and whole-trigger (``triggerExecution``) milliseconds, median
over the batches with records. ``--idle-triggers N`` then measures ``latestOffset``
alone on N triggers with no new records (Spark reports each: the session sets
``spark.sql.streaming.noDataProgressEventInterval`` to 0), which is what a source that
cannot finish a batch at 10,000 partitions can still be measured by
(``--idle-only``: those alone, no rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql import DataFrame, SparkSession

from bench.topics import create_led
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.consume.job import spark_session
from spark_consumer.source import read_stream
from spark_consumer.source.wire.offset import SourceOffset

TRIGGER = "200 milliseconds"


def _ends_of(progress: Any, topic: str) -> dict[str, int] | None:
    """The end offsets of the batch a progress report is about, from either source."""
    end = progress["sources"][0]["endOffset"]
    raw = json.loads(end) if isinstance(end, str) else end
    if not isinstance(raw, dict):
        return None
    if "v" in raw:
        return SourceOffset.decode(raw).data.get(topic)
    ends = raw.get(topic)
    return {str(p): int(o) for p, o in ends.items()} if isinstance(ends, dict) else None


@dataclass
class Topic:
    """The topics both sources read (1,000 partitions each at most: KRaft refuses to
    create more in one request), and their log ends as written so far."""

    names: list[str]
    per_topic: int
    producer: Producer
    ends: dict[str, list[int]]

    def write(self, records: int) -> dict[str, dict[str, int]]:
        pairs = [(name, p) for name in self.names for p in range(self.per_topic)]
        for index in range(records):
            name, partition = pairs[index % len(pairs)]
            self.producer.produce(name, value=b'{"ts": 1}', partition=partition)
            self.ends[name][partition] += 1
        assert self.producer.flush(60) == 0
        return {
            name: {str(p): end for p, end in enumerate(ends)} for name, ends in self.ends.items()
        }


def _round(query: Any, topic: Topic, records: int, seen: dict[str, Any]) -> float:
    """Writes one round and returns the seconds until a batch holding it committed;
    every progress report seen meanwhile goes into ``seen``, by its time."""
    wanted = topic.write(records)
    started = time.perf_counter()
    deadline = started + 600
    while time.perf_counter() < deadline:
        progress = _look(query, seen)
        if progress is not None and all(
            _ends_of(progress, name) == ends for name, ends in wanted.items()
        ):
            return time.perf_counter() - started
        time.sleep(0.02)
    raise TimeoutError(f"no batch reached the ends of {topic.names} in 600 s")


def _look(query: Any, seen: dict[str, Any]) -> Any:
    """The query's last progress, kept in ``seen`` (``recentProgress`` would bring every
    report over py4j at every look: megabytes of offsets at 10,000 partitions)."""
    progress = query.lastProgress
    if progress is not None:
        seen.setdefault(progress["timestamp"], progress)
    return progress


@dataclass
class Measured:
    """One source's numbers at one size (None: not measured)."""

    round_s: float | None = None
    latest_offset_ms: float | None = None  # median over batches with records
    trigger_ms: float | None = None  # median triggerExecution over the same batches
    idle_latest_offset_ms: float | None = None  # median over triggers with no records


def _durations(progress: list[Any], key: str, *, with_records: bool) -> list[float]:
    return [
        float(p["durationMs"][key])
        for p in progress
        if key in p.get("durationMs", {}) and (p["numInputRows"] > 0) == with_records
    ]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(
    load: Callable[[], DataFrame], topic: Topic, records: int, rounds: int, idle_triggers: int
) -> Measured:
    query = (
        load()
        .writeStream.format("noop")
        .option("checkpointLocation", tempfile.mkdtemp(prefix="slackwater-small-"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    measured = Measured()
    try:
        while query.lastProgress is None:  # started, with its first offsets planned
            time.sleep(0.05)
        if rounds:
            _round(query, topic, records, {})  # warm-up, not counted
            seen: dict[str, Any] = {}
            measured.round_s = statistics.median(
                [_round(query, topic, records, seen) for _ in range(rounds)]
            )
            progress = list(seen.values())
            measured.latest_offset_ms = _median(
                _durations(progress, "latestOffset", with_records=True)
            )
            measured.trigger_ms = _median(
                _durations(progress, "triggerExecution", with_records=True)
            )
        if idle_triggers:
            idle: dict[str, Any] = {}
            _look(query, {})
            deadline = time.monotonic() + 600
            while len(idle) < idle_triggers + 1:  # (the first may be the last round's)
                assert time.monotonic() < deadline, "idle triggers not reported in 600 s"
                _look(query, idle)
                time.sleep(0.02)
            measured.idle_latest_offset_ms = _median(
                _durations(list(idle.values())[1:], "latestOffset", with_records=False)
            )
    finally:
        query.stop()
    return measured


def _cell(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[30, 300, 1_000])
    parser.add_argument("--records", type=int, default=1_650)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-triggers", type=int, default=0)
    parser.add_argument("--idle-only", action="store_true", help="no rounds: idle triggers")
    parser.add_argument(
        "--without-spark",
        action="store_true",
        help="measure slackwater alone (Spark's source takes minutes a batch at 1,000)",
    )
    args = parser.parse_args()
    rounds = 0 if args.idle_only else args.rounds
    print(
        "| partitions | source | round s | latestOffset ms | trigger ms | idle latestOffset ms |"
        "\n|---:|---|---:|---:|---:|---:|",
        flush=True,
    )
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        bootstrap = broker.bootstrap_servers
        # Read when the executor starts: set before the session's JVM is launched.
        capacity = max(args.partitions) + 64
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.kafka.consumer.cache.capacity={capacity} pyspark-shell"
        )
        spark: SparkSession = spark_session("slackwater-small-batches")
        # Every trigger reported, also one with no new records (idle latestOffset).
        spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for partitions in args.partitions:
            topics, per_topic = create_led(admin, "small", partitions)
            [control], _ = create_led(admin, "small-ctl", 1)
            written = Topic(topics, per_topic, producer, {n: [0] * per_topic for n in topics})

            def ours(topics: list[str] = topics, control: str = control) -> DataFrame:
                return read_stream(
                    spark,
                    bootstrap_servers=bootstrap,
                    topics=topics,
                    control_topic=control,
                    starting_offsets="latest",
                )

            def sparks(topics: list[str] = topics) -> DataFrame:
                return (
                    spark.readStream.format("kafka")
                    .option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", ",".join(topics))
                    .option("startingOffsets", "latest")
                    .load()
                )

            sources = [("slackwater", ours)] + ([] if args.without_spark else [("Spark", sparks)])
            for name, load in sources:
                got = measure(load, written, args.records, rounds, args.idle_triggers)
                print(
                    f"| {partitions:,} | {name} | {_cell(got.round_s, 2)} |"
                    f" {_cell(got.latest_offset_ms)} | {_cell(got.trigger_ms)} |"
                    f" {_cell(got.idle_latest_offset_ms)} |",
                    flush=True,
                )
        spark.stop()


if __name__ == "__main__":
    main()
