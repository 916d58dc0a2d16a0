"""`slackwater demo --duration 40s`: the main job on the Apache Kafka it starts itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_consumer.consume_job import committed_rows
from tests.factories import run_cli

pytestmark = pytest.mark.integration


def test_demo_runs_the_main_job_with_no_late_records_where_plain_spark_loses_some(
    tmp_path: Path,
) -> None:
    result = run_cli(
        "demo", "--duration", "40s", "--output", str(tmp_path), "--compare", timeout_s=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout
    assert re.search(r"late records\s+0 \(0 expected\)", summary)
    while_idle = re.search(r"while p5 was IDLE\s+(\d+)", summary)
    assert while_idle is not None and int(while_idle.group(1)) >= 1
    markers = re.search(r"markers published\s+(\{.*\})", summary)
    assert markers is not None
    assert "'IDLE': 0" not in markers.group(1) and "'FINISHED': 0" not in markers.group(1)
    windows = committed_rows(tmp_path / "windows")
    assert windows and all(row["count"] > 0 for row in windows)
    keys = [(row["window_start"], row["key"]) for row in windows]
    assert len(keys) == len(set(keys))  # each window and key once
    assert not list((tmp_path / "windows-late").glob("*.json"))  # nothing dropped
    chart = tmp_path / "slackwater-demo.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart                   {chart}" in summary
    # --compare: Spark's own Kafka source with withWatermark, on the same input, drops
    # the lagging partition's records as late; slackwater dropped none (above).
    lost = re.search(
        r"plain Spark lost\s+(\d+) records \(Spark's Kafka source, --compare\)", summary
    )
    assert lost is not None and int(lost.group(1)) > 0
