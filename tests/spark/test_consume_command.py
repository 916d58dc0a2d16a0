"""`slackwater consume` as a process: exactly once across four SIGKILLs while data keeps
arriving, its metrics, and a broker it cannot reach."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slackwater.kafka_broker import KafkaBroker, free_port
from slackwater.markers import MarkerStatus
from spark_consumer.consume.commands import failure_line
from spark_consumer.consume.job import committed_rows
from tests.conftest import TopicFactory
from tests.harness.factories import (
    SLACKWATER,
    ResettingEndpoint,
    deploy_metric_names,
    scrape_metrics,
)
from tests.harness.kafka_writer import BASE_MS, Writer
from tests.harness.process import wait_while_running
from tests.harness.source_jobs import iso_ms, late_output_rows
from tests.harness.spark_checkpoint import ran_with_watermark

KILLS = 4
UNREACHABLE_FAILURES = 50  # connections the source's clients failed before SIGTERM
LATE_EVERY = 10  # every 10th second, one record 12 s in the past on p0


def _consume(
    bootstrap: str, topic: str, control: str, tmp: Path, *, log: Path, metrics_port: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *SLACKWATER, "consume",
            "--bootstrap-servers", bootstrap, "--topic", topic, "--control-topic", control,
            "--window", "5s", "--max-out-of-orderness", "1s", "--trigger", "300ms",
            "--output", str(tmp / "out"), "--checkpoint", str(tmp / "checkpoint"),
            "--metrics-port", str(metrics_port),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


@dataclass
class Written:
    seconds: int = 0  # event seconds written: one record per partition each
    late: list[float] = field(default_factory=list)  # event times of the past records


def _write_until(write: Writer, stop: threading.Event, written: Written) -> None:
    """One record per partition per event second, 0.4 s apart, in whole 5-second
    windows, until ``stop``: data keeps arriving through every kill."""
    for second in range(400):
        write.data(0, second, key="k0")
        write.data(1, second, key="k1")
        if second >= 20 and second % LATE_EVERY == 0:
            write.data(0, second - 12 + 0.5, key="k0")
            written.late.append(second - 12 + 0.5)
        written.seconds = second + 1
        if written.seconds % 5 == 0 and stop.is_set():
            return
        time.sleep(0.4)


def _run_and_kill(
    kills: int, launch: Callable[[], subprocess.Popen[bytes]], output: Path, log: Path
) -> None:
    """Starts the job and SIGKILLs its process group ``kills`` times, each time shortly
    after it committed new output (so inside a later batch, at a random point)."""
    rng = random.Random(7)
    for kill in range(kills):
        before = len(committed_rows(output))
        process = launch()
        try:
            wait_while_running(
                lambda: len(committed_rows(output)) > before,  # noqa: B023
                600,  # a Spark start and a batch on a machine busy with other work
                f"output before kill {kill + 1}",
                process,
                log,
            )
            time.sleep(rng.uniform(0.2, 1.5))
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


# Five Spark starts: on a machine busy with other work, longer than the suite's 300 s.
@pytest.mark.timeout(1800)
def test_four_sigkills_while_data_arrives_lose_and_duplicate_nothing(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    bootstrap = broker.bootstrap_servers
    write = Writer(bootstrap, topic, control)
    log = tmp_path / "consumer.log"
    stop, written = threading.Event(), Written()
    writer = threading.Thread(target=_write_until, args=(write, stop, written), daemon=True)
    writer.start()
    _run_and_kill(
        KILLS,
        lambda: _consume(bootstrap, topic, control, tmp_path, log=log, metrics_port=free_port()),
        tmp_path / "out",
        log,
    )
    stop.set()
    writer.join(60)
    assert not writer.is_alive()
    late_seconds = written.late
    metrics_port = free_port()
    final = _consume(bootstrap, topic, control, tmp_path, log=log, metrics_port=metrics_port)
    try:
        write.marker(0, MarkerStatus.FINISHED)
        write.marker(1, MarkerStatus.FINISHED)
        windows_expected = 2 * (written.seconds // 5)
        # A batch ran with Spark's watermark past the last window (FINISHED) and
        # committed: every window is out and no state is left, the output is final (a
        # window written twice would be there).
        wait_while_running(
            lambda: ran_with_watermark(
                tmp_path / "checkpoint" / "windows", BASE_MS + written.seconds * 1000
            ),
            180,
            "a batch past every window",
            final,
            log,
        )
        rows = committed_rows(tmp_path / "out")
        where = Counter((r["window_start"], r["key"]) for r in rows)
        assert all(n == 1 for n in where.values()), where  # each window and key once
        assert len(rows) == windows_expected
        late_output = late_output_rows(tmp_path / "out-late")
        late_offsets = [(r["partition"], r["offset"]) for r in late_output]
        assert len(late_offsets) == len(set(late_offsets))  # no late row twice
        # Each record is in exactly one place: its window's count or the late output.
        counted_late = len(late_seconds) - len(late_output)
        assert sum(int(r["count"]) for r in rows) == 2 * written.seconds + counted_late
        for row in rows:
            start_s = (iso_ms(str(row["window_start"])) - BASE_MS) / 1000
            in_window_late = [s for s in late_seconds if start_s <= s < start_s + 5]
            if row["key"] == "k1" or not in_window_late:
                assert row["count"] == 5, row
            else:
                assert 5 <= row["count"] <= 5 + len(in_window_late), row
        assert {r["reason"] for r in late_output} <= {"late"}
        _check_metrics(metrics_port, dropped=len(late_output))
        final.terminate()  # SIGTERM to the driver alone, as a supervisor would
        assert final.wait(60) == 0
    finally:
        if final.poll() is None:
            os.killpg(final.pid, signal.SIGKILL)


def _check_metrics(port: int, *, dropped: int) -> None:
    metrics = scrape_metrics(f"http://127.0.0.1:{port}/metrics")
    query = 'query="slackwater_windows"'
    assert metrics[f"slackwater_source_up{{{query}}}"] == 1
    assert metrics[f'slackwater_source_valve_status{{{query},status="FINISHED"}}'] == 1
    assert metrics[f"slackwater_source_records_dropped_total{{{query}}}"] == dropped
    assert metrics["slackwater_consume_windows_emitted_total"] >= 1
    # Every consumer series the Grafana dashboard and the alert rules query exists.
    exported = {name.split("{")[0] for name in metrics}
    wanted = {
        name
        for name in deploy_metric_names()
        if name.startswith(("slackwater_source_", "slackwater_consume_"))
    }
    assert wanted and wanted <= exported, wanted - exported


def test_an_unreachable_broker_is_a_few_clear_lines_and_sigterm_exits_0(tmp_path: Path) -> None:
    log = tmp_path / "consume.log"
    with ResettingEndpoint() as broker:
        process = _consume(broker.address, "t", "c", tmp_path, log=log, metrics_port=free_port())
        try:
            # The JVM started and the source could not plan (it said so), while the
            # clients kept failing to connect.
            wait_while_running(
                lambda: (
                    f"cannot reach Kafka at {broker.address}" in log.read_text()
                    and broker.resets >= UNREACHABLE_FAILURES
                ),
                180,
                "the source's line and failed connections",
                process,
                log,
            )
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert "Traceback" not in text
    assert len(text.splitlines()) <= 8, text
    assert any(line.endswith("consume: SIGTERM: stopping") for line in text.splitlines()), text


# Spark's reports of a failed query (StreamingQueryException's text), as consume meets
# them: the first line, then a Python worker's traceback or the JVM's causes.
_LOST_TASK = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due "
    "to stage failure: Task 0 in stage 0.0 failed 1 times, most recent failure: Lost task "
    "0.0 in stage 0.0 (TID 0) (localhost executor driver): "
    "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
    "thrown from the Python worker: Traceback (most recent call last):"
)
_FRAMES = '  File "/job/udf.py", line 3, in parse\n    return json.loads(value)\n'


@pytest.mark.parametrize(
    ("report", "line"),
    [
        (
            f"{_LOST_TASK}\n{_FRAMES}spark_consumer.source.shared.options.SourceError: not "
            "authorized as 'job' to read topic orders (partition 0): Broker: Topic "
            "authorization failed\n SQLSTATE: 38000",
            "not authorized as 'job' to read topic orders (partition 0): Broker: Topic "
            "authorization failed",
        ),
        (
            f"{_LOST_TASK}\n{_FRAMES}json.decoder.JSONDecodeError: Expecting value: line 1"
            "\n SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner(x.scala:1)",
            "a Python worker failed: json.decoder.JSONDecodeError: Expecting value: line 1",
        ),
        (
            "[STREAM_FAILED] Query [id = 1] terminated with exception: [TASK_WRITE_FAILED] "
            "Task failed while writing rows to file:/out.\n\tat org.apache.spark.X(X.scala:1)"
            "\nCaused by: java.io.IOException: Mkdirs failed\n\tat org.apache.hadoop.Y(Y.java:2)"
            "\nCaused by: java.io.IOException: No space left on device",
            "[STREAM_FAILED] Query [id = 1] terminated with exception: [TASK_WRITE_FAILED] "
            "Task failed while writing rows to file:/out. (Caused by: java.io.IOException: "
            "No space left on device)",
        ),
        ("[STREAM_FAILED] Query [id = 1] terminated", "[STREAM_FAILED] Query [id = 1] terminated"),
    ],
    ids=["the source's reason", "a python worker's error", "the deepest cause", "spark's line"],
)
def test_a_failed_query_is_said_in_the_line_that_names_its_cause(report: str, line: str) -> None:
    assert failure_line(report) == line
