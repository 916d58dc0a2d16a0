"""CPU nanoseconds per record of a reader task's own Python work, no broker and no Spark:
``runs()`` over consume calls of 10,000 messages, ``RowBuilder.add_many`` per run and
``flush`` every 50,000 rows (arrow_rows.py), on confluent-kafka ``Message`` objects made
in Python.

    .venv/bin/python -m bench.reader_rows_bench [--repeats 5]

Cases: Kafka timestamps in runs of 625 records (16 partitions, as a backlog reads);
runs of one record (1,000 partitions, a record each); the event time in a JSON field, in
long runs and in runs of one; values that are not JSON (poison). Best of --repeats, CPU
time of this process (``time.process_time``), so that a busy machine moves it less.
Compare two versions by running this in each checkout (docs/performance.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from confluent_kafka import Message

from spark_consumer.source.executor.arrow_rows import RowBuilder, runs
from spark_consumer.source.executor.reader_ranges import Reading

BASE_MS = 1_700_000_000_000
# name: (records, records per run, partitions, value kind)
CASES = {
    "timestamps, runs of 625": (200_000, 625, 16, "bytes"),
    "timestamps, runs of 1": (50_000, 1, 1_000, "bytes"),
    "JSON field, runs of 625": (100_000, 625, 16, "json"),
    "JSON field, runs of 1": (50_000, 1, 1_000, "json"),
    "not JSON, runs of 625": (50_000, 625, 16, "poison"),
}


def _value(kind: str, i: int) -> bytes:
    if kind == "json":
        return b'{"id": %d, "ts": %d, "name": "abcdefghij", "amount": 12.5}' % (i, BASE_MS + i)
    if kind == "poison":
        return b"not json at all %d" % i
    return b"x" * 100


def _calls(records: int, per_run: int, partitions: int, kind: str) -> list[list[Any]]:
    messages = [
        Message(
            topic="t",
            partition=(i // per_run) % partitions,
            offset=i,
            value=_value(kind, i),
            timestamp=(1, BASE_MS + i),
        )
        for i in range(records)
    ]
    return [messages[i : i + 10_000] for i in range(0, records, 10_000)]


def measure(calls: list[list[Any]], field: str | None, partitions: int) -> float:
    ranges = {p: Reading("t", p, 0, 10**12) for p in range(partitions)}
    builder = RowBuilder(field, BASE_MS + 25_000)
    started = time.process_time()
    for call in calls:
        for key, run, _ in runs(call):
            builder.add_many(run, ranges[key[1]])
        if len(builder) >= 50_000:
            builder.flush()
    if len(builder):
        builder.flush()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':28} {'ns/record':>10}")
    for name, (records, per_run, partitions, kind) in CASES.items():
        calls = _calls(records, per_run, partitions, kind)
        field = None if kind == "bytes" else "ts"
        best = min(measure(calls, field, partitions) for _ in range(args.repeats))
        print(f"{name:28} {best / records * 1e9:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
