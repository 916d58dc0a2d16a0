"""The rows a job's aggregation drops (spark_consumer/source/shared/late_rows.py): Spark's
rule, from its text (a window is over when its end <= the watermark), and one file per range."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_consumer.source.shared.late_rows import DroppedRow, LateRule, write_range


@pytest.mark.parametrize(
    ("rule", "event_ms", "threshold_ms", "dropped"),
    [
        # Tumbling 10 s: the row's one window [0, 10) ends at 10.
        ("window:10s", 3_000, 10_000, True),  # end == watermark: over
        ("window:10s", 3_000, 9_999, False),
        ("window:10s", 10_000, 12_000, False),  # [10, 20) still open
        # Sliding 10 s every 5 s: a row at 7 s is in [0, 10) and [5, 15).
        ("window:10s:5s", 7_000, 10_000, False),  # [5, 15) is open
        ("window:10s:5s", 7_000, 15_000, True),
        # Session gap 3 s: the row's own session [t, t + 3 s).
        ("session:3s", 1_000, 4_000, True),
        ("session:3s", 1_000, 3_999, False),
        # late: below the watermark, as the source's `late` column.
        ("late", 1_000, 1_001, True),
        ("late", 1_000, 1_000, False),
    ],
)
def test_a_row_is_dropped_when_every_window_holding_it_has_ended(
    rule: str, event_ms: int, threshold_ms: int, dropped: bool
) -> None:
    assert LateRule.parse(rule).dropped(event_ms, threshold_ms) is dropped


@pytest.mark.parametrize("bad", ["", "window", "window:0s", "window:5s:10s", "session:x", "late:1"])
def test_a_bad_rule_is_one_error(bad: str) -> None:
    with pytest.raises(ValueError, match="not a late rule"):
        LateRule.parse(bad)


def test_one_file_per_range_and_a_replay_rewrites_the_same_file(tmp_path: Path) -> None:
    rows = [DroppedRow(4, 1_700_000_003_000, "late"), DroppedRow(5, None, "unreadable: x")]

    def write(directory: Path, rows: list[DroppedRow]) -> None:
        write_range(
            str(directory), rows, topic="orders", partition=2, start=0, end=9,
            threshold_ms=1_700_000_012_000,
        )  # fmt: skip

    write(tmp_path, rows)
    first = (tmp_path / "orders-2-0-9.json").read_bytes()
    write(tmp_path, rows)  # a task retry, a batch replay
    assert [p.name for p in tmp_path.iterdir()] == ["orders-2-0-9.json"]
    assert (tmp_path / "orders-2-0-9.json").read_bytes() == first
    lines = [json.loads(line) for line in first.decode().splitlines()]
    assert lines == [
        {"topic": "orders", "partition": 2, "offset": 4, "event_time": "2023-11-14T22:13:23.000Z",
         "reason": "late", "watermark": "2023-11-14T22:13:32.000Z"},
        {"topic": "orders", "partition": 2, "offset": 5, "event_time": None,
         "reason": "unreadable: x", "watermark": "2023-11-14T22:13:32.000Z"},
    ]  # fmt: skip
    write(tmp_path / "none", [])
    assert not (tmp_path / "none").exists()  # nothing dropped, nothing written
