"""The examples in examples/, each run as a user would run it, with exact expected output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from slackwater.kafka_broker import KafkaBroker
from slackwater.markers import MarkerStatus
from spark_consumer.source.wire.offset import SourceOffset
from tests.conftest import TopicFactory
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import frozen, kill_inside_a_batch, wait_while_running
from tests.harness.spark_checkpoint import (
    batch_ids,
    next_watermark_ms,
    planned_batch,
    ran_with_watermark,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FINISHED = MarkerStatus.FINISHED


# As `spark-submit --conf ...` would set it: Spark's default of 200 shuffle partitions
# makes every batch of a stateful example 200 tasks, slow on a 2-core machine.
SUBMIT_ARGS = "--conf spark.sql.shuffle.partitions=4 pyspark-shell"


def _start(script: str, log: Path, *arguments: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *arguments],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL takes Spark's JVM too
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS},
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


def _in_flight(checkpoint: Path, after: int) -> int | None:
    """A batch after ``after`` that Spark has planned (offsets/N) but not committed
    (no commits/N), whose plan moves the watermark: the watermark planned into its
    synthetic row is above the one Spark applies while it runs. None if there is none."""
    planned = batch_ids(checkpoint, "offsets")
    newest = max(planned, default=-1)
    if newest <= after or newest in batch_ids(checkpoint, "commits"):
        return None
    batch = planned_batch(checkpoint, newest)
    return newest if batch.slackwater_offset()["watermark"] > batch.watermark_ms else None


def _caught_up(checkpoint: Path, write: Writer) -> bool:
    """The job has committed every batch it planned, and planned every record written."""
    newest = max(batch_ids(checkpoint, "offsets"), default=-1)
    if newest < 0 or newest not in batch_ids(checkpoint, "commits"):
        return False
    planned = SourceOffset.decode(planned_batch(checkpoint, newest).slackwater_offset()).data[
        write.topic
    ]
    return bool(planned == {str(p): end for p, end in write.log_end.items()})


def _kill_between_the_logs(
    process: subprocess.Popen[bytes],
    checkpoint: Path,
    log: Path,
    write: Writer,
    *,
    pay: Callable[[int], None],
    seconds: Iterator[int],
) -> int:
    """Pays the next second each time the job has caught up with what was written;
    when a batch is in flight (``_in_flight``), stops the job in its tracks (every
    thread of its processes) and looks again: if the batch is still planned and not
    committed, the job dies there, SIGKILL. Returns that batch."""
    after = max(batch_ids(checkpoint, "offsets"))
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the job stopped committing batches"
        if _caught_up(checkpoint, write):
            second = next(seconds, None)
            assert second is not None, "no batch was ever caught between its two logs"
            pay(second)
        elif _in_flight(checkpoint, after) is not None:
            with frozen(process) as stopped:
                caught = _in_flight(checkpoint, after) if stopped else None
                if caught is not None:
                    os.killpg(process.pid, signal.SIGKILL)
                    return caught
        time.sleep(0.005)  # between two looks at the checkpoint


@pytest.mark.integration
# Two Spark starts and a wait for a batch caught between the offset and commit logs: on
# a machine busy with other work, longer than the suite's 300 s.
@pytest.mark.timeout(1800)
def test_windowed_sum_is_exact_and_once_across_a_sigkill_and_restart(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """The driver is killed between Spark's offset log and its commit log for a batch:
    the restart replays that batch from the logged plan (the same synthetic row) and
    the output stays exact, each window once."""
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    expected: dict[tuple[int, str], float] = {}
    payments: Counter[tuple[int, str]] = Counter()
    paid: list[int] = []

    def pay(second: int) -> None:
        paid.append(second)
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
        wait_while_running(
            lambda: len(_committed_rows(spark, output)) >= 2, 600, "first windows", first, log
        )
        caught = _kill_between_the_logs(
            first, checkpoint, log, write, pay=pay, seconds=iter(range(25, 50))
        )
    finally:
        _kill_group(first)
    # It died between the two logs: batch `caught` is planned, not committed.
    assert (checkpoint / "offsets" / str(caught)).is_file()
    assert not (checkpoint / "commits" / str(caught)).exists()
    plan = planned_batch(checkpoint, caught)
    synthetic_row_ms = int(plan.slackwater_offset()["watermark"])
    assert synthetic_row_ms > plan.watermark_ms
    for later in range(paid[-1] + 1, 60):
        pay(later)
    second_run = _start("windowed_sum.py", log, *arguments)
    try:
        write.marker(0, FINISHED)
        write.marker(1, FINISHED)
        # A batch ran with Spark's watermark past the last window (FINISHED) and
        # committed: every window is out and no state is left, the output is final.
        wait_while_running(
            lambda: ran_with_watermark(checkpoint, BASE_MS + 60_000),
            180,
            "a batch past every window",
            second_run,
            log,
        )
        # The restart ran batch `caught` again from the logged plan, not a new one: the
        # offset log is as the first run wrote it, and the watermark Spark took from the
        # replayed batch's rows is the one the first run planned into its synthetic row.
        assert planned_batch(checkpoint, caught).text == plan.text
        assert next_watermark_ms(checkpoint, caught) == synthetic_row_ms
        assert planned_batch(checkpoint, caught + 1).watermark_ms == synthetic_row_ms
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


@pytest.mark.integration
def test_windowed_sum_on_a_local_cluster_of_two_executor_processes(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Readers in two executor JVMs with their own Python workers: progress reaches the
    driver through Kafka, nothing through a local path."""
    topic, control = new_topic(partitions=4), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    expected: dict[tuple[int, str], float] = {}
    for second in range(0, 30):
        for partition in range(4):
            account = f"acct-{partition}"
            value = json.dumps({"ts": BASE_MS + second * 1000, "account": account, "amount": 1.5})
            write.producer.produce(topic, value=value.encode(), partition=partition)
            key = (second // 10 * 10, account)
            expected[key] = expected.get(key, 0.0) + 1.5
            write.log_end[partition] = write.log_end.get(partition, 0) + 1
    assert write.producer.flush(10) == 0
    for partition in range(4):
        write.marker(partition, FINISHED)
    output, log = tmp_path / "out", tmp_path / "example.log"
    process = _start(
        "windowed_sum.py", log,
        "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
        "--control-topic", control, "--output", str(output),
        "--checkpoint", str(tmp_path / "ckpt"), "--master", "local-cluster[2,1,1024]",
    )  # fmt: skip
    try:
        wait_while_running(
            lambda: len(_committed_rows(spark, output)) >= len(expected),
            240,
            "every window",
            process,
            log,
        )
        rows = _committed_rows(spark, output)
        assert len(rows) == len(expected)  # each window once
        assert {(_seconds(r["window_start"]), r["account"]): r["total"] for r in rows} == expected
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        _kill_group(process)


def _memory_query(frame: DataFrame, tmp: Path, name: str) -> StreamingQuery:
    return (
        frame.writeStream.outputMode("append")
        .format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp / f"ckpt-{name}"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _state_rows(query: StreamingQuery, operator: str) -> int:
    """Rows in the state of the query's operator named ``operator`` (last progress)."""
    progress = query.lastProgress
    assert progress is not None
    counts = [
        s["numRowsTotal"] for s in progress["stateOperators"] if s["operatorName"] == operator
    ]
    assert len(counts) == 1, progress["stateOperators"]
    return int(counts[0])


def _settle(query: StreamingQuery) -> None:
    query.processAllAvailable()
    assert query.exception() is None, query.exception()


@pytest.mark.integration
def test_session_windows_close_while_a_partition_is_quiet(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    from examples.session_window import sessions

    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)

    def click(partition: int, user: str, *seconds: int) -> None:
        for second in seconds:
            value = json.dumps({"ts": BASE_MS + second * 1000, "user": user})
            write.producer.produce(topic, value=value.encode(), partition=partition)
            write.log_end[partition] = write.log_end.get(partition, 0) + 1
        assert write.producer.flush(10) == 0

    click(0, "ann", 0, 2, 4, 20, 21)  # two sessions: [0, 9) and [20, 26)
    click(1, "bob", 1, 3)  # one session [1, 8), then p1 is quiet
    name = f"s_{topic[2:]}"
    query = _memory_query(
        sessions(spark, broker.bootstrap_servers, topic, control, "5 seconds"), tmp_path, name
    )
    try:
        _settle(query)
        assert spark.sql(f"select * from {name}").count() == 0  # p1 (bob, 3 s) holds it at 2 s
        write.marker(1, MarkerStatus.IDLE)
        _settle(query)
        rows = {
            (r["user"], _seconds(r["session_start"]), _seconds(r["session_end"]), r["clicks"])
            for r in spark.sql(f"select * from {name}").collect()
        }
        # The valve is at ann's 21 - 1 = 20 s: sessions ending by then are out, once.
        assert rows == {("ann", 0, 9, 3), ("bob", 1, 8, 2)}
        assert spark.sql(f"select * from {name}").count() == 2
    finally:
        query.stop()


@pytest.mark.integration
def test_join_emits_unpaid_orders_while_the_payments_topic_is_quiet(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    from examples.join_two_topics import orders_with_payments

    orders, payments = new_topic(partitions=1), new_topic(partitions=1)
    control = new_topic(partitions=1, prefix="ctl")
    order_writer = Writer(broker.bootstrap_servers, orders, control)
    payment_writer = Writer(broker.bootstrap_servers, payments, control)

    def send(writer: Writer, topic: str, second: int, **fields: object) -> None:
        value = json.dumps({"ts": BASE_MS + second * 1000, **fields})
        writer.producer.produce(topic, value=value.encode(), partition=0)
        writer.log_end[0] = writer.log_end.get(0, 0) + 1
        assert writer.producer.flush(10) == 0

    send(order_writer, orders, 0, order="o1", amount=10.0)
    send(order_writer, orders, 2, order="o2", amount=20.0)
    send(payment_writer, payments, 3, order="o1")  # o2 is never paid
    for second in range(4, 40, 4):
        send(order_writer, orders, second, order=f"x{second}", amount=1.0)
    name = f"j_{orders[2:]}"
    frame = orders_with_payments(spark, broker.bootstrap_servers, orders, payments, control)
    query = _memory_query(frame, tmp_path, name)
    try:
        _settle(query)
        paid = {r["order_id"] for r in spark.sql(f"select * from {name}").collect()}
        assert paid == {"o1"}  # matched at once; o2 waits: payments hold the valve at 2 s
        payment_writer.marker(0, MarkerStatus.IDLE)  # the payments topic goes quiet
        _settle(query)
        rows = {
            (r["order_id"], r["paid_at"] is None)
            for r in spark.sql(f"select * from {name}").collect()
        }
        # Valve at 36 - 1 = 35 s: orders up to 24 s are past their 10 s, unpaid ones out.
        assert ("o1", False) in rows and ("o2", True) in rows
        assert {order for order, unpaid in rows if unpaid} == {
            "o2",
            "x4",
            "x8",
            "x12",
            "x16",
            "x20",
            "x24",
        }
        assert spark.sql(f"select * from {name}").count() == len(rows)  # each once
    finally:
        query.stop()


@pytest.mark.integration
def test_deduplicated_counts_drop_every_second_copy_and_forget_keys_past_the_window(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    from examples.deduplicate import unique_counts

    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for second in range(0, 30):
        partition = second % 2
        value = json.dumps({"ts": BASE_MS + second * 1000, "id": f"e{second}"}).encode()
        copies = 2 if second % 3 == 0 else 1  # a retrying producer wrote some twice
        for _ in range(copies):
            write.producer.produce(topic, value=value, partition=partition)
            write.log_end[partition] = write.log_end.get(partition, 0) + 1
    assert write.producer.flush(10) == 0
    name = f"d_{topic[2:]}"
    query = _memory_query(
        unique_counts(spark, broker.bootstrap_servers, topic, control, dedup_window="5s"),
        tmp_path,
        name,
    )
    try:
        _settle(query)
        # V = min(28 s on p0, 29 s on p1) - 1 s out-of-orderness = 27 s: windows up to
        # 20 s are out, and a key lives until V passes its event time + 5 s, so only the
        # events from 22 s on (8 of them, give or take the boundary) are still kept.
        rows = {
            _seconds(r["window_start"]): r["events"]
            for r in spark.sql(f"select * from {name}").collect()
        }
        assert rows == {0: 10, 10: 10}
        dedup_state = _state_rows(query, "dedupeWithinWatermark")
        assert 7 <= dedup_state <= 9, dedup_state
        write.marker(0, FINISHED)
        write.marker(1, FINISHED)
        _settle(query)
        rows = {
            _seconds(r["window_start"]): r["events"]
            for r in spark.sql(f"select * from {name}").collect()
        }
        assert rows == {0: 10, 10: 10, 20: 10}  # 40 records, 30 distinct events
        assert spark.sql(f"select * from {name}").count() == 3
        assert _state_rows(query, "dedupeWithinWatermark") == 0
    finally:
        query.stop()


def _backfill_rows(spark: SparkSession, output: Path) -> list[tuple[int, int, int]]:
    """(window start s, end s, records) of every row the file sink committed, in order:
    a window written twice shows twice."""
    if not (output / "_spark_metadata").exists():
        return []
    schema = "window_start timestamp, window_end timestamp, records long"
    rows = spark.read.schema(schema).json(str(output)).collect()
    return sorted(
        (_seconds(r["window_start"]), _seconds(r["window_end"]), r["records"]) for r in rows
    )


def _run_backfill(log: Path, *arguments: str) -> str:
    """One run of examples/backfill.py to its end; the line it printed last."""
    process = _start("backfill.py", log, *arguments)
    try:
        assert process.wait(600) == 0, log.read_text()[-3000:]
    finally:
        _kill_group(process)
    # (splitlines: Spark's progress bar ends in a carriage return, not a newline)
    return [line for line in log.read_text().splitlines() if line.startswith("backfill:")][-1]


def _iso(second: int) -> str:
    """Spark's progress spelling of BASE_MS + ``second``."""
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp((BASE_MS + second * 1000) / 1000, UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _backfill_records(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> tuple[Writer, tuple[str, ...]]:
    """p0 and p1 busy (seconds 0-39), p2 quiet since second 5 (IDLE), p3 ended at second
    7 (FINISHED); the example's arguments for them, 20 records a batch."""
    topic, control = new_topic(partitions=4), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for second in range(0, 40):
        write.data(second % 2, second)
    write.data(2, 2, 5)
    write.marker(2, MarkerStatus.IDLE)
    write.data(3, 1, 4, 7)
    write.marker(3, FINISHED)
    arguments = (
        "--bootstrap-servers", broker.bootstrap_servers, "--topic", topic,
        "--control-topic", control, "--output", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "ckpt"), "--max-offsets-per-trigger", "20",
    )  # fmt: skip
    return write, arguments


@pytest.mark.integration
@pytest.mark.timeout(1200)  # three Spark starts, on a machine busy with other work
def test_backfill_runs_on_one_checkpoint_each_window_once_across_a_sigkill(
    spark: SparkSession, broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    """Scheduled runs: p0 and p1 busy, p2 quiet since second 5 (IDLE), p3 ended at
    second 7 (FINISHED). The first run is SIGKILLed while a batch it planned is not
    committed; run again, it plays that batch again and reads on to its own ends. Each
    run writes the windows the busy partitions' newest records close (their watermark
    less 1 s), none held by p2 or p3, and the next run the rest, each window once."""
    write, arguments = _backfill_records(broker, new_topic, tmp_path)
    output, log = tmp_path / "out", tmp_path / "backfill.log"
    killed = _start("backfill.py", log, *arguments)
    try:
        kill_inside_a_batch(killed, tmp_path / "ckpt", log)
    finally:
        _kill_group(killed)
    # The valve: min(p0's 38 s, p1's 39 s) - 1 s = 37 s; [30, 40) waits for the next run.
    assert _run_backfill(log, *arguments).endswith(f"Spark's watermark is {_iso(37)}")
    first = [(0, 10, 10 + 2 + 3), (10, 20, 10), (20, 30, 10)]
    assert _backfill_rows(spark, output) == first
    for second in range(40, 80):  # an hour later: more records, p2 and p3 still quiet
        write.data(second % 2, second)
    assert _run_backfill(log, *arguments) == (
        f"backfill: the run wrote 4 windows; Spark's watermark is {_iso(77)}"
    )
    later = [(start, start + 10, 10) for start in range(30, 70, 10)]
    assert _backfill_rows(spark, output) == first + later  # each window once
