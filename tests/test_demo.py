"""`slackwater demo` (what `make demo` runs) end to end on its own embedded broker."""

from __future__ import annotations

import subprocess
import sys


def test_demo_tells_the_whole_story_and_exits_zero() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "emitter.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    phases = result.stdout.split("\n== ")
    assert len(phases) == 7  # preamble + six phases
    by_phase = {chunk.split(":")[0]: chunk for chunk in phases[1:]}
    # FLINK-38477: a FINISHED partition beside an IDLE one never yields MAX_WATERMARK ...
    for name in ("phase 1", "phase 2", "phase 3", "phase 4", "phase 5"):
        assert "MAX_WATERMARK" not in by_phase[name].split("\n", 1)[1], name
    # ... and windows keep closing while p3 is IDLE and p2 FINISHED.
    assert "p3 -> IDLE" in by_phase["phase 2"]
    assert "valve emits watermark" in by_phase["phase 2"].split("p3 -> IDLE", 1)[1]
    assert "p2 -> FINISHED" in by_phase["phase 3"]
    assert "valve emits watermark" in by_phase["phase 3"].split("p2 -> FINISHED", 1)[1]
    assert "valve emits status IDLE" in by_phase["phase 4"]
    assert "valve emits status ACTIVE" in by_phase["phase 5"]
    last = by_phase["phase 6"]
    assert last.index("valve emits watermark MAX_WATERMARK") < last.index(
        "valve emits status FINISHED"
    )
    assert "final valve status FINISHED, watermark MAX_WATERMARK" in result.stdout
