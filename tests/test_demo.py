"""`slackwater demo --duration 40s`: the main job on its own embedded broker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from spark_consumer.pipeline import load_report_lines


def test_demo_runs_the_main_job_with_no_late_records(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "emitter.cli",
            "demo",
            "--duration",
            "40s",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout
    assert re.search(r"late records\s+0 \(0 expected\)", summary)
    while_idle = re.search(r"while p5 was IDLE\s+(\d+)", summary)
    assert while_idle is not None and int(while_idle.group(1)) >= 1
    markers = re.search(r"markers published\s+(\{.*\})", summary)
    assert markers is not None
    assert "'IDLE': 0" not in markers.group(1) and "'FINISHED': 0" not in markers.group(1)
    windows = load_report_lines(tmp_path / "windows")
    assert windows and all(row["count"] > 0 for row in windows)
    assert not list((tmp_path / "windows-late").glob("batch-*"))
    chart = tmp_path / "slackwater-demo.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"chart                   {chart}" in summary
