"""docs/source.md's table "Every event, and failOnDataLoss" and the tests agree: every
test a row names exists, and each row has a test run with failOnDataLoss true and false
(its two columns), so no cell of the table is a claim without a test (issue 41)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE_HEADING = "## Every event, and failOnDataLoss"


def _rows() -> list[tuple[str, list[str]]]:
    text = (ROOT / "docs" / "source.md").read_text()
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("Event", "---"):
            rows.append((cells[0], re.findall(r"`(test_\w+)`", cells[3])))
    return rows


def _tests() -> dict[str, ast.FunctionDef]:
    found = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[node.name] = node
    return found


def _runs_with_both_values(test: ast.FunctionDef) -> bool:
    """Parametrized over fail_on_data_loss with True and False."""
    for decorator in test.decorator_list:
        if not (
            isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize")
        ):
            continue
        name, values = decorator.args[0], decorator.args[1]
        if isinstance(name, ast.Constant) and name.value == "fail_on_data_loss":
            return {ast.literal_eval(v) for v in getattr(values, "elts", [])} == {True, False}
    return False


def test_the_table_has_every_event_the_issue_names() -> None:
    events = " ".join(event.lower() for event, _ in _rows())
    for event in (
        "retention",
        "planned batch",
        "seen only in a log end",
        "every record read",
        "re-created shorter",
        "re-created longer",
        "fewer partitions",
        "more partitions",
        "unclean leader election",
        "a leader change answering low",
    ):
        assert event in events, event


def test_every_cell_is_a_test_run_with_both_values() -> None:
    tests = _tests()
    for event, named in _rows():
        assert named, f"{event}: no test named"
        missing = [name for name in named if name not in tests]
        assert not missing, f"{event}: {missing} not found under tests/"
        assert any(_runs_with_both_values(tests[name]) for name in named), (
            f"{event}: no test of {named} runs with failOnDataLoss true and false"
        )


def test_the_check_finds_a_test_run_with_one_value_only() -> None:
    one = ast.parse(
        "@pytest.mark.parametrize('fail_on_data_loss', [True])\ndef test_x(): pass"
    ).body[0]
    both = ast.parse(
        "@pytest.mark.parametrize('fail_on_data_loss', [True, False])\ndef test_y(): pass"
    ).body[0]
    assert isinstance(one, ast.FunctionDef) and isinstance(both, ast.FunctionDef)
    assert not _runs_with_both_values(one)
    assert _runs_with_both_values(both)
