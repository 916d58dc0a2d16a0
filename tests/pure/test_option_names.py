"""An option the source does not know is one warning line naming the nearest it knows
(issue 43, item 4; docs/source.md, "Options the source does not know"). The names are
held to what the parser reads, by reading the parser."""

from __future__ import annotations

import ast
import importlib.machinery
import logging
import re
import sys
from pathlib import Path

import pytest

from spark_consumer.source.shared import option_names
from spark_consumer.source.shared.option_names import (
    KNOWN_OPTIONS,
    SPARKS_OWN,
    nearest_name,
    unknown_option_lines,
)
from spark_consumer.source.shared.options import SourceOptions

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "spark_consumer" / "source"
BASE = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "orders"}


def _read_by_the_parser() -> set[str]:
    """Every name the source reads of its lowered options (``lowered.get("...")`` or
    ``lowered["..."]``), anywhere in the source."""
    found: set[str] = set()
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "lowered"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.add(str(node.args[0].value))
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "lowered"
                and isinstance(node.slice, ast.Constant)
            ):
                found.add(str(node.slice.value))
    return found


def test_every_option_the_parser_reads_is_known_and_every_known_one_is_read() -> None:
    read = _read_by_the_parser()
    assert {"maxwatermarkdrift", "subscribe", "kafka.bootstrap.servers"} <= read
    assert all(name == name.lower() for name in read)  # what the parser looks up
    read_by_name = {name for name in read if not name.startswith("kafka.")}
    assert read_by_name == {name.lower() for name in KNOWN_OPTIONS}
    assert len({name.lower() for name in KNOWN_OPTIONS}) == len(KNOWN_OPTIONS)


def test_every_option_read_stream_gives_the_source_is_one_it_knows() -> None:
    """``read_stream`` (and ``slackwater consume``, through it) never makes the line: the
    option names its dicts give, read from stream.py."""
    tree = ast.parse((SOURCE / "stream.py").read_text())
    given = {
        key.value
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef)
        and function.name in ("stream_options", "task_options")
        for node in ast.walk(function)
        if isinstance(node, ast.Dict)
        for key in node.keys
        if isinstance(key, ast.Constant) and isinstance(key.value, str)
    }
    assert {"subscribe", "maxOutOfOrderness", "tasksPerBatch", "endingOffsets"} <= given
    assert unknown_option_lines(given) == []


def test_the_names_are_spelt_as_the_parsers_errors_and_the_docs_spell_them() -> None:
    """One spelling: the parser's errors (``option 'maxOffsetsPerTrigger' must ...``) and
    docs/source.md's spans spell each known name as the list does."""
    by_lower = {name.lower(): name for name in KNOWN_OPTIONS}
    in_errors = set(
        re.findall(r"option '([A-Za-z.]+)'", (SOURCE / "shared" / "options.py").read_text())
    )
    in_docs = set(re.findall(r"`([A-Za-z]+)`", (ROOT / "docs" / "source.md").read_text()))
    named = {n for n in in_errors | in_docs if n.lower() in by_lower}
    assert {"maxWatermarkDrift", "maxOffsetsPerTrigger", "tasksPerBatch"} <= named
    assert {n for n in named if by_lower[n.lower()] != n} == set()
    assert in_errors - named == {"kafka.bootstrap.servers"}


@pytest.mark.parametrize(
    ("typed", "nearest"),
    [
        ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
        ("maxoffsetpertrigger", "maxOffsetsPerTrigger"),  # as Spark hands it over
        ("startingOffset", "startingOffsets"),
        ("subscribePatern", "subscribePattern"),
        ("maxWatermarkDrfit", "maxWatermarkDrift"),
        ("eventTimeFeild", "eventTimeField"),
    ],
)
def test_a_misspelt_option_is_one_line_with_the_nearest_known_name(
    typed: str, nearest: str
) -> None:
    assert nearest_name(typed) == nearest
    assert unknown_option_lines([*BASE, typed]) == [
        f"option '{typed}' is not one the source knows, ignored (nearest known name: '{nearest}')"
    ]


@pytest.mark.parametrize(
    "name",
    [
        "maxwatermarkdrift",
        "MAXWATERMARKDRIFT",
        "MaxWatermarkDrift",
        "kafka.anything",
        "KAFKA.Anything.Else",
        "path",  # Spark's own, from load(path)
        *KNOWN_OPTIONS,
        *(name.lower() for name in KNOWN_OPTIONS),
        *SPARKS_OWN,
    ],
)
def test_a_known_name_in_any_case_kafka_settings_and_sparks_own_keys_are_no_warning(
    name: str,
) -> None:
    assert unknown_option_lines([*BASE, name]) == []


def test_a_name_near_none_says_so_and_each_unknown_option_has_its_line() -> None:
    assert nearest_name("colour") is None
    assert unknown_option_lines(["subscribe", "colour", "startingOffset", "kafka.acks"]) == [
        "option 'colour' is not one the source knows, ignored (no near name)",
        "option 'startingOffset' is not one the source knows, ignored "
        "(nearest known name: 'startingOffsets')",
    ]


def test_parsing_warns_only_in_sparks_planner_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark parses a query's options when ``load()`` asks the schema and again in its
    planner process when the query starts; tests parse them again and again. The line
    is said at the start alone (the Spark test sees it reach the job's stderr)."""
    caplog.set_level(logging.WARNING, logger=option_names.log.name)
    given = {**BASE, "maxOffsetPerTrigger": "10", "maxwatermarkdrift": "5s"}
    assert SourceOptions.parse(given).max_offsets_per_trigger is None  # ignored, as it says
    assert caplog.messages == []
    planner = importlib.machinery.ModuleSpec(option_names._PLANNER_MAIN, None)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", planner, raising=False)
    assert SourceOptions.parse(given).max_watermark_drift_ms == 5_000
    assert caplog.messages == [
        "option 'maxOffsetPerTrigger' is not one the source knows, ignored "
        "(nearest known name: 'maxOffsetsPerTrigger')"
    ]
