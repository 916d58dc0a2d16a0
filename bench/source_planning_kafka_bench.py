"""Milliseconds of the source's whole planning (``latestOffset``) on Apache Kafka, per
batch, by partitions: the Kafka requests included.

    .venv/bin/python -m bench.source_planning_kafka_bench [--partitions 1000 10000]
        [--request-partitions 250 100000]

Topics of 1,000 partitions each on the launcher's single-node Kafka. Each round
writes one record to every partition, then what the readers of the previous batch
would have written to the progress topic (one record per task, as ``read`` does:
simulated here, since the reader tasks are Spark's part), then times one
``latestOffset``: the metadata request and ListOffsets round, the wait for and the read
of every range's progress, the markers, the valve, the offset's JSON. The first round
(no previous batch, nothing to wait for) is not counted. Median and max of --rounds.
Each size is measured once per ``--request-partitions``, the partitions per ListOffsets
request (``planner_client.REQUEST_PARTITIONS``; 100000: one request for all), in one run, so
that their ratio holds on a machine busy with other work.

``--phases``: where the median plan's time goes, step by step (semantics.md §6's
invoking chain), each step timed around its call in every counted round: the Kafka
requests (``observe``: metadata and ListOffsets), the readers' progress (``collect``:
the wait, the read and decode of the progress records, a PartitionBatch per partition),
following partitions, the markers, the aligner, the offset (``make_offset``, the
aligner's snapshot in it, and the version 2 columns ``returned`` encodes), the rest.

Also the offset's size as Spark logs it (pyspark's ``json.dumps`` of it), per partition,
beside what Spark's own Kafka source logs for the same end offsets: its
``KafkaSourceOffset``, ``{"topic":{"partition":offset,...}}`` in compact JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable

from bench.topics import create_led
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.driver import planner as planner_module
from spark_consumer.source.driver import planner_client, topic_partitions
from spark_consumer.source.driver.control_reader import ControlReader
from spark_consumer.source.driver.plan import PlanMemory
from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.driver.progress_collector import ProgressCollector
from spark_consumer.source.shared.options import SourceOptions
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.source.wire.progress import Progress
from spark_consumer.source.wire.splits import SyntheticPartition, TaskPartition


def _write_records(producer: Producer, topics: list[str], per_topic: int, round_: int) -> None:
    now_ms = 1_700_000_000_000 + round_ * 1_000
    for topic in topics:
        for partition in range(per_topic):
            producer.produce(topic, value=b"{}", partition=partition, timestamp=now_ms)
    assert producer.flush(120) == 0


def _write_progress(
    producer: Producer,
    reader: SlackwaterStreamReader,
    start: dict[str, object],
    end: dict[str, object],
) -> None:
    """What each reader task of the batch (start, end] writes when it finishes."""
    for split in reader.partitions(start, end):
        if isinstance(split, SyntheticPartition):  # its task reports Spark's batch id
            synthetic = Progress(0, None, -1, 0, 0, batch_id=1)
            producer.produce(
                reader.options.progress_topic, key=split.progress_key, value=synthetic.encode()
            )
            continue
        assert isinstance(split, TaskPartition)
        key = split.progress_key()
        progress = [
            Progress(
                records=finish - begin,
                max_event_time_ms=1_700_000_000_000,
                max_offset=finish - 1,
                late=0,
                unreadable=0,
            )
            for _, _, begin, finish in split.ranges
        ]
        value = split.encode_progress(progress, None)
        producer.produce(reader.options.progress_topic, key=key, value=value)
    assert producer.flush(120) == 0


# The steps --phases times: (what owns it, the name of the call, the step's name).
STEPS: list[tuple[Any, str, str]] = [
    (planner_client.PlannerClient, "observe", "Kafka requests"),
    (ProgressCollector, "collect", "progress"),
    (topic_partitions, "follow", "follow partitions"),
    (ControlReader, "read", "markers"),
    (MarkerAligner, "advance", "aligner"),
    (planner_module, "make_offset", "offset"),
    (PlanMemory, "returned", "offset"),
]


@contextlib.contextmanager
def timed_steps(spent: dict[str, float]) -> Iterator[None]:
    """Each step's milliseconds added into ``spent`` while inside (the calls restored)."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in STEPS]

    def timing(call: Callable[..., Any], step: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[step] += (time.perf_counter() - started) * 1000

        return timed

    for (owner, name, step), (_, _, call) in zip(STEPS, originals, strict=True):
        setattr(owner, name, timing(call, step))
    try:
        yield
    finally:
        for owner, name, call in originals:
            setattr(owner, name, call)


def measure(
    bootstrap: str, partitions: int, rounds: int, phases: list[dict[str, float]] | None = None
) -> tuple[float, float, int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics, per_topic = create_led(admin, "plan", partitions)
    [control], _ = create_led(admin, "plan-ctl", 1)
    reader = SlackwaterStreamReader(
        SourceOptions.parse(
            {
                "kafka.bootstrap.servers": bootstrap,
                "subscribe": ",".join(topics),
                "controlTopic": control,
            }
        )
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    start = reader.initialOffset()
    timings: list[float] = []
    offset_bytes = sparks_bytes = 0
    for round_ in range(rounds + 1):
        _write_records(producer, topics, per_topic, round_)
        spent: dict[str, float] = defaultdict(float)
        with timed_steps(spent) if phases is not None else contextlib.nullcontext():
            started = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            elapsed_ms = (time.perf_counter() - started) * 1000
        if round_ > 0:
            timings.append(elapsed_ms)
            if phases is not None:
                phases.append({**spent, "rest": elapsed_ms - sum(spent.values())})
        offset_bytes = len(json.dumps(end))
        sparks_bytes = len(json.dumps(SourceOffset.decode(end).data, separators=(",", ":")))
        _write_progress(producer, reader, start, end)
        start = json.loads(json.dumps(end))  # Spark hands the offset back from its log
    reader.stop()
    admin.delete_topics([*topics, control, reader.options.progress_topic])
    return statistics.median(timings), max(timings), offset_bytes, sparks_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--request-partitions", type=int, nargs="+", default=[planner_client.REQUEST_PARTITIONS]
    )
    parser.add_argument("--phases", action="store_true", help="where each plan's time goes")
    args = parser.parse_args()
    print(
        f"{'partitions':>10} {'per request':>11} {'median ms':>10} {'max ms':>8} {'offset KiB':>11}"
        f" {'B/partition':>12} {'Spark Kafka B/p':>16} {'ratio':>6}",
        flush=True,
    )
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        for partitions in args.partitions:
            for per_request in args.request_partitions:
                planner_client.REQUEST_PARTITIONS = per_request
                phases: list[dict[str, float]] | None = [] if args.phases else None
                median_ms, max_ms, size, sparks = measure(
                    broker.bootstrap_servers, partitions, args.rounds, phases
                )
                print(
                    f"{partitions:>10,} {per_request:>11,} {median_ms:>10.1f} {max_ms:>8.1f}"
                    f" {size / 1024:>11.0f}"
                    f" {size / partitions:>12.1f} {sparks / partitions:>16.1f}"
                    f" {size / sparks:>6.2f}",
                    flush=True,
                )
                if phases:
                    _print_phases(phases)


def _print_phases(phases: list[dict[str, float]]) -> None:
    """Each step's median ms over the counted rounds."""
    steps = list(dict.fromkeys([*(step for _, _, step in STEPS), "rest"]))
    for step in steps:
        median_ms = statistics.median(p.get(step, 0.0) for p in phases)
        print(f"{'':>10} {step:>24} {median_ms:>8.1f} ms", flush=True)


if __name__ == "__main__":
    main()
