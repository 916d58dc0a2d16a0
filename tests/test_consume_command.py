"""`slackwater consume` as a process: exactly once across SIGKILL and restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from emitter.kafka_broker import KafkaBroker, free_port
from emitter.markers import MarkerStatus
from spark_consumer.pipeline import load_report_lines
from tests.conftest import TopicFactory
from tests.pipeline_harness import Writer
from tests.process_harness import scrape, wait_while_running
from tests.test_deploy import deploy_metric_names


def _consume(
    broker: KafkaBroker,
    topic: str,
    control: str,
    tmp: Path,
    log: Path,
    *,
    metrics_port: int | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "emitter.cli",
            "consume",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--control-topic",
            control,
            "--window",
            "5s",
            "--max-out-of-orderness",
            "1s",
            "--trigger",
            "300ms",
            "--output",
            str(tmp / "out"),
            "--checkpoint",
            str(tmp / "checkpoint"),
            "--metrics-port",
            str(metrics_port or free_port()),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_sigkill_and_restart_give_every_window_exactly_once(
    broker: KafkaBroker, new_topic: TopicFactory, tmp_path: Path
) -> None:
    topic, control = new_topic(partitions=2), new_topic(partitions=1, prefix="ctl")
    write = Writer(broker.bootstrap_servers, topic, control)
    for partition in (0, 1):
        write.data(partition, *range(0, 10), key=f"k{partition}")
    log = tmp_path / "consumer.log"
    out = tmp_path / "out"
    first = _consume(broker, topic, control, tmp_path, log)
    try:
        wait_while_running(
            lambda: list(out.glob("batch-*")), 120, "a first output batch", first, log
        )
        for second in range(10, 40):
            for partition in (0, 1):
                write.data(partition, second, key=f"k{partition}")
            if second == 20:
                time.sleep(1.0)  # let a batch start, then kill it somewhere inside
                os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    metrics_port = free_port()
    second_run = _consume(broker, topic, control, tmp_path, log, metrics_port=metrics_port)
    try:
        write.marker(0, MarkerStatus.FINISHED)
        write.marker(1, MarkerStatus.FINISHED)
        expected_windows = 2 * 8  # [0, 5) .. [35, 40) for two keys
        wait_while_running(
            lambda: len(load_report_lines(out)) >= expected_windows,
            180,
            "every window",
            second_run,
            log,
        )
        time.sleep(2)  # any duplicate would be written by now
        rows = load_report_lines(out)
        keys = Counter((r["window_start"], r["key"]) for r in rows)
        assert all(n == 1 for n in keys.values()), keys  # exactly once
        assert len(rows) == expected_windows
        assert all(r["count"] == 5 for r in rows)
        assert not list((tmp_path / "out-late").glob("batch-*"))  # nothing late
        metrics = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        assert metrics["slackwater_consumer_up"] == 1
        assert metrics['slackwater_consumer_valve_status{status="FINISHED"}'] == 1
        assert metrics["slackwater_consumer_valve_watermark_ms"] == float(2**63 - 1)
        assert metrics["slackwater_consumer_records_late_total"] == 0
        assert metrics["slackwater_consumer_markers_applied"] == 2
        assert metrics["slackwater_consumer_windows_emitted_total"] >= 1
        # Every consumer series the Grafana dashboard and the alert rules query exists.
        exported = {name.split("{")[0] for name in metrics}
        wanted = {n for n in deploy_metric_names() if n.startswith("slackwater_consumer_")}
        assert wanted and wanted <= exported, wanted - exported
        second_run.terminate()  # SIGTERM to the driver alone, as a supervisor would
        assert second_run.wait(60) == 0
    finally:
        if second_run.poll() is None:
            os.killpg(second_run.pid, signal.SIGKILL)
