"""The examples in examples/, each run as a user would run it, with exact expected output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from emitter.kafka_broker import KafkaBroker
from emitter.markers import MarkerStatus
from tests.conftest import TopicFactory
from tests.pipeline_harness import BASE_MS, Writer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
FINISHED = MarkerStatus.FINISHED


def _start(script: str, log: Path, *arguments: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *arguments],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL takes Spark's JVM too
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(30)


def _committed_rows(spark: SparkSession, output: Path) -> list[dict[str, object]]:
    """What the file sink committed (its metadata log), as a reader of the output sees it."""
    if not (output / "_spark_metadata").exists():
        return []
    schema = (
        "window_start timestamp, window_end timestamp, account string, total double, payments long"
    )
    return [row.asDict() for row in spark.read.schema(schema).json(str(output)).collect()]


def _wait(
    predicate: object, timeout_s: float, what: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"example exited: {log.read_text()[-3000:]}"
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-3000:]}")


@pytest.mark.integration
def test_windowed_sum_is_exact_and_once_across_a_sigkill_and_restart(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    expected: dict[tuple[int, str], float] = {}
    payments: Counter[tuple[int, str]] = Counter()

    def pay(second: int) -> None:
        for partition, account in ((0, "ann"), (1, "bob")):
            amount = second + 0.5 * partition
            value = json.dumps(
                {"ts": BASE_MS + second * 1000, "account": account, "amount": amount}
            )
            write.producer.produce(topic, value=value.encode(), partition=partition)
            key = (second // 10 * 10, account)
            expected[key] = expected.get(key, 0.0) + amount
            payments[(second // 10 * 10, account)] += 1
        assert write.producer.flush(10) == 0
        for partition in (0, 1):
            write.log_end[partition] = write.log_end.get(partition, 0) + 1

    output, checkpoint, log = tmp_path / "out", tmp_path / "ckpt", tmp_path / "example.log"
    arguments = (
        "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
        "--control-topic", control, "--output", str(output), "--checkpoint", str(checkpoint),
    )  # fmt: skip
    for second in range(0, 25):
        pay(second)
    first = _start("windowed_sum.py", log, *arguments)
    try:
        _wait(lambda: len(_committed_rows(spark, output)) >= 2, 180, "first windows", first, log)
        for second in range(25, 40):
            pay(second)
        time.sleep(1.0)  # let a batch start, then kill the driver somewhere inside
    finally:
        _kill_group(first)
    for second in range(40, 60):
        pay(second)
    second_run = _start("windowed_sum.py", log, *arguments)
    try:
        write.marker(0, FINISHED)
        write.marker(1, FINISHED)
        _wait(
            lambda: len(_committed_rows(spark, output)) >= len(expected),
            180,
            "every window",
            second_run,
            log,
        )
        time.sleep(2)  # a duplicate would be committed by now
        rows = _committed_rows(spark, output)
        seen = Counter((_seconds(r["window_start"]), r["account"]) for r in rows)
        assert all(count == 1 for count in seen.values()), seen  # each window once
        totals = {
            (_seconds(r["window_start"]), r["account"]): (r["total"], r["payments"]) for r in rows
        }
        assert totals == {key: (expected[key], payments[key]) for key in expected}
        second_run.send_signal(signal.SIGTERM)
        assert second_run.wait(60) == 0
    finally:
        _kill_group(second_run)


def _seconds(stamp: object) -> int:
    from datetime import datetime

    if isinstance(stamp, str):
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    else:
        assert isinstance(stamp, datetime)
        parsed = stamp
    return (int(parsed.timestamp() * 1000) - BASE_MS) // 1000
