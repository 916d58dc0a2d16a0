"""`slackwater demo --duration 40s`: the main job on the Apache Kafka it starts itself."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from demo.producer_script import (
    FINISHED_PARTITION,
    LAG_ROUNDS,
    LAGGING,
    MAX_JITTER_MS,
    PARTITIONS,
    QUIET,
    ROUND_MS,
    Script,
)
from spark_consumer.consume.job import committed_rows
from tests.harness.factories import run_cli

ALWAYS = [p for p in range(PARTITIONS) if p not in (QUIET, FINISHED_PARTITION)]


def test_the_script_writes_every_round_on_six_partitions_and_p3_lag_rounds_late() -> None:
    """What makes plain Spark's loss certain (demo/live_demo.py): p0-p4 and p6 write one
    record in every round, and p3's record of a round carries an event time at least
    LAG_ROUNDS rounds of ROUND_MS older than the round, however unevenly rounds come."""
    duration_s = 40.0
    script = Script(duration_s)
    gaps = random.Random(1)
    stamp_ms, elapsed_s = 1_700_000_000_000, 0.0
    stamps: list[int] = []
    lagging: list[int] = []
    while elapsed_s < duration_s:
        records = script.round(elapsed_s, stamp_ms)
        stamps.append(stamp_ms)
        written = [partition for partition, _ in records]
        assert sorted(set(written)) == sorted(written)  # at most one record a partition
        assert set(ALWAYS) <= set(written)
        for partition, event_ms in records:
            if partition == LAGGING:
                lagging.append(event_ms)
            else:
                assert stamp_ms - MAX_JITTER_MS < event_ms <= stamp_ms
        # A round every ROUND_MS, or later on a busy machine (a stall now and then).
        gap_ms = ROUND_MS + gaps.choice([0, 0, 0, 7, 400, 3_000])
        stamp_ms += gap_ms
        elapsed_s += gap_ms / 1000
    assert len(lagging) == len(stamps)
    for round_index, event_ms in enumerate(lagging):
        # Stamped LAG_ROUNDS rounds before: the stamp of that round when there was one,
        # else as if the rounds before the first had come every ROUND_MS.
        held = round_index - LAG_ROUNDS
        stamp = stamps[held] if held >= 0 else stamps[0] + held * ROUND_MS
        assert stamp - MAX_JITTER_MS < event_ms <= stamp
        assert stamps[round_index] - stamp >= LAG_ROUNDS * ROUND_MS


@pytest.mark.integration
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
    # the lagging partition's records as late, on any machine (demo/live_demo.py says
    # why); slackwater dropped none (above), and counted each of them in its window.
    lost = re.search(
        r"plain Spark lost\s+(\d+) records, (\d+) of them p3's "
        r"\(Spark's Kafka source, --compare\)",
        summary,
    )
    assert lost is not None, summary[-3000:]
    assert int(lost.group(2)) > 0
    assert int(lost.group(1)) >= int(lost.group(2))
