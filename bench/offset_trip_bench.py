"""The trip of one offset through the source: the functions of ours it visits, and the files.

    .venv/bin/python -m bench.offset_trip_bench [--partitions 4]

On Apache Kafka (one KRaft node), through the source's face only (``SlackwaterKafkaSource``,
so the same script runs on any commit): a topic of ``--partitions`` partitions with records
on each, a control topic, a first plan and its batch read. Then the trip is recorded, call
by call (``sys.setprofile``), as Spark makes it for one batch in steady state:

    latestOffset(start) -> end       the plan (collects the last batch's progress)
    partitions(start, end)           the tasks
    read(task), every task           on an executor (here, in this process)
    latestOffset(end)                the next plan, which reads the progress back

A stop is a function of ours (``slackwater/``, ``spark_consumer/``) entered on the way; the
table counts the distinct stops, the files they are in, and for each file how many distinct
calls enter it from another file (a room of loose helpers entered again and again shows
there). Not a timing: the numbers are the same on a busy machine.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from pyspark.sql.streaming.datasource import ReadAllAvailable

from bench.topics import create_led, produce_waiting
from slackwater.kafka_broker import KafkaBroker
from spark_consumer.source import SlackwaterKafkaSource

OURS = ("slackwater", "spark_consumer")


class Trip:
    """The calls of ours made while it records: each callee, and who called it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stops: set[tuple[str, str]] = set()
        self.crossings: set[tuple[str, str, str, str]] = set()

    def _ours(self, frame: FrameType | None) -> tuple[str, str] | None:
        if frame is None:
            return None
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(self.root):
            return None
        relative = path.relative_to(self.root)
        if relative.parts[0] not in OURS:
            return None
        return str(relative), frame.f_code.co_qualname

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = self._ours(frame)
        if callee is None:
            return
        self.stops.add(callee)
        caller = self._ours(frame.f_back)
        if caller is not None and caller[0] != callee[0]:
            self.crossings.add((*caller, *callee))

    def __enter__(self) -> Trip:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def report(self) -> None:
        files = Counter(path for path, _ in self.stops)
        entered = Counter(callee_path for _, _, callee_path, _ in self.crossings)
        print(f"stops (functions of ours entered): {len(self.stops)}")
        print(f"files: {len(files)}")
        print(
            f"calls from one file into another (distinct caller -> callee): {len(self.crossings)}"
        )
        print(f"{'file':<52} {'functions':>9} {'entered':>7}")
        for path, count in sorted(files.items(), key=lambda item: (-entered[item[0]], item[0])):
            print(f"{path:<52} {count:>9} {entered[path]:>7}")


def _source(bootstrap: str, topic: str, control: str) -> Any:
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "controlTopic": control,
        "maxOutOfOrderness": "1s",
    }
    source = SlackwaterKafkaSource(options)
    return source.streamReader(source.schema())


def _write(bootstrap: str, topic: str, partitions: int, round_number: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for i in range(3):
            value = f'{{"n": {round_number * 3 + i}}}'.encode()
            produce_waiting(producer, topic, value=value, partition=partition)
    producer.flush(30)


def _batch(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> None:
    for task in reader.partitions(start, end):
        for _ in reader.read(task):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    root = Path.cwd().resolve()
    with KafkaBroker(settings={"log.retention.ms": "-1"}) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        [topic], _ = create_led(admin, "trip", args.partitions)
        [control], _ = create_led(admin, f"trip-ctl-{uuid.uuid4().hex[:4]}", 1)
        reader = _source(bootstrap, topic, control)
        first = reader.initialOffset()
        _write(bootstrap, topic, args.partitions, 0)
        start = reader.latestOffset(first, ReadAllAvailable())
        _batch(reader, first, start)  # the first batch: clients and state built
        _write(bootstrap, topic, args.partitions, 1)
        with Trip(root) as trip:
            end = reader.latestOffset(start, ReadAllAvailable())
            _batch(reader, start, end)
            reader.latestOffset(end, ReadAllAvailable())
        reader.stop()
    trip.report()


if __name__ == "__main__":
    main()
