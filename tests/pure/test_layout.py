"""Three floors, every import pointing down (docs/architecture.md).

``slackwater`` (ground) imports none of the others; ``emitter`` and ``spark_consumer``
(middle) import ``slackwater`` only, never each other; ``demo`` (top) may import all.
Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("slackwater", "emitter", "spark_consumer", "demo")
# What each package may import among ours, besides itself.
ALLOWED = {
    "slackwater": set(),
    "emitter": {"slackwater"},
    "spark_consumer": {"slackwater"},
    "demo": {"slackwater", "emitter", "spark_consumer"},
}


def imported(path: Path) -> set[str]:
    """Every module a module imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def our_imports(path: Path) -> set[str]:
    """The top-level packages of ours that a module imports, anywhere in it."""
    return {name.split(".")[0] for name in imported(path)} & set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down(package: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for imported in our_imports(path) - ALLOWED[package] - {package}
    }
    assert not wrong, sorted(wrong)


def test_the_rule_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from spark_consumer.valve import X\n    import emitter.lag\n")
    assert our_imports(module) == {"spark_consumer", "emitter"}


def test_every_subcommand_is_an_entry_point_of_its_own_floor() -> None:
    """The shell finds the subcommands; each lives in the package that owns the job."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    commands = project["project"]["entry-points"]["slackwater.commands"]
    owners = {name: target.split(".")[0] for name, target in commands.items()}
    assert owners == {
        "broker": "slackwater",
        "emit": "emitter",
        "finish": "emitter",
        "status": "emitter",
        "consume": "spark_consumer",
        "demo": "demo",
        "demo-producer": "demo",
    }


# Inside spark_consumer: the pure core (the valve, the aligner), the source, and the
# consume application on top; each room imports only the rooms below it.
ROOMS = {
    "spark_consumer.valve": set(),
    "spark_consumer.alignment": {"spark_consumer.valve"},
    "spark_consumer.source": {"spark_consumer.valve", "spark_consumer.alignment"},
    "spark_consumer.consume": {"spark_consumer.source", "spark_consumer.valve"},
}


def _room(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def _rooms_imported(path: Path) -> set[str]:
    return {room for name in imported(path) if (room := _room(name)) is not None}


@pytest.mark.parametrize("room", ROOMS)
def test_spark_consumers_rooms_import_only_the_rooms_below(room: str) -> None:
    base = ROOT / room.replace(".", "/")
    paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    assert paths and all(path.exists() for path in paths)
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in paths
        for imported in _rooms_imported(path) - ROOMS[room] - {room}
    }
    assert not wrong, sorted(wrong)


def test_every_module_of_spark_consumer_is_in_a_room() -> None:
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for path in (ROOT / "spark_consumer").rglob("*.py")
        if path.name != "__init__.py" or path.parent != ROOT / "spark_consumer"
    }
    assert {module for module in modules if _room(module) is None} == set()


def test_the_source_has_one_face_and_jobs_use_only_it() -> None:
    """Users and the examples import the source from its package."""
    from spark_consumer import source

    assert sorted(source.__all__) == [
        "SOURCE_NAME",
        "SlackwaterKafkaSource",
        "SourceError",
        "StreamKeywords",
        "read_stream",
        "serve_source_metrics",
        "stream_options",
        "with_valve_watermark",
    ]
    assert source.serve_source_metrics.__module__ == "spark_consumer.source.metrics"
    for path in sorted((ROOT / "examples").glob("*.py")):
        deeper = sorted(m for m in imported(path) if m.startswith("spark_consumer.source."))
        assert not deeper, f"{path.name} imports {deeper}"


def test_a_spark_worker_reading_a_task_loads_no_metrics_server() -> None:
    """A Python worker unpickles the source's splits and runs its readers: the face's
    metrics server (prometheus_client, HTTP) is loaded only by whoever asks for it."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, spark_consumer.source.splits, spark_consumer.source.readers; "
            "print(sorted(m for m in ('prometheus_client', 'slackwater.http_server') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.strip() == "[]"


# The source's rooms (docs/architecture.md): the driver's, the executors', and the ones
# both load. The driver never imports the executors' modules, not even for a constant.
SOURCE = ROOT / "spark_consumer" / "source"
EXECUTORS_ROOMS = {
    "spark_consumer.source.readers",
    "spark_consumer.source.reader_ranges",
    "spark_consumer.source.arrow_rows",
    "spark_consumer.source.reader_clients",
}
DRIVERS_ROOMS = {
    "spark_consumer.source.planner",
    "spark_consumer.source.broker",
    "spark_consumer.source.control_reader",
    "spark_consumer.source.progress_collector",
    "spark_consumer.source.partitions",
    "spark_consumer.source.plan",
    "spark_consumer.source.planner_process",
    "spark_consumer.source.gone_back",
    "spark_consumer.source.seen_in",
    "spark_consumer.source.restart_options",
    "spark_consumer.source.run_ends",
}
# What Spark calls on a DataSourceStreamReader: the Spark-facing class has nothing else.
SPARKS_CALLS = {
    "initialOffset",
    "latestOffset",
    "partitions",
    "read",
    "commit",
    "stop",
    "getDefaultReadLimit",
    "prepareForTriggerAvailableNow",  # SupportsTriggerAvailableNow
}


def test_the_planner_loads_none_of_the_executors_rooms() -> None:
    import subprocess
    import sys

    rooms = sorted(EXECUTORS_ROOMS)
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, spark_consumer.source, spark_consumer.source.planner; "
            f"print(sorted(m for m in {rooms!r} if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.strip() == "[]"


@pytest.mark.parametrize("room", sorted(DRIVERS_ROOMS))
def test_no_drivers_room_imports_an_executors_room(room: str) -> None:
    """Not even inside a function, but for ``read``, Spark's entry on an executor."""
    tree = ast.parse((ROOT / (room.replace(".", "/") + ".py")).read_text())
    in_read = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "read"
        for inner in ast.walk(node)
    }
    wrong = {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and id(node) not in in_read
        for name in (node.module, *(f"{node.module}.{alias.name}" for alias in node.names))
        if name in EXECUTORS_ROOMS
    }
    assert not wrong, sorted(wrong)


def test_the_spark_facing_class_keeps_only_what_spark_calls() -> None:
    from spark_consumer.source.planner import SlackwaterStreamReader

    public = {
        name
        for name, value in vars(SlackwaterStreamReader).items()
        if callable(value) and not name.startswith("_")
    }
    assert public == SPARKS_CALLS


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_the_sources_rooms_stay_small() -> None:
    """About 500 lines a module, 60 a function, 300 for the Spark-facing class: a room
    that grows past them holds a second job (issue 30)."""
    too_big = []
    for path in sorted(SOURCE.glob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        if text.count("\n") > 500:
            too_big.append(f"{path.name}: {text.count(chr(10))} lines")
        for function in _functions(tree):
            length = (function.end_lineno or function.lineno) - function.lineno + 1
            if length > 60:
                too_big.append(f"{path.name}: {function.name} is {length} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "SlackwaterStreamReader":
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 300:
                    too_big.append(f"{path.name}: {node.name} is {length} lines")
    assert not too_big, too_big


# Kafka's error codes that a judgment of slackwater.kafka_evidence reads: no other
# module of ours compares them (each judgment is written once, on the ground floor).
JUDGED_CODES = {"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"}


def test_each_kafka_judgment_is_written_once_on_the_ground_floor() -> None:
    judged_elsewhere = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}"
        for package in ("slackwater", "emitter", "spark_consumer")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "kafka_evidence.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in JUDGED_CODES
    }
    assert not judged_elsewhere, sorted(judged_elsewhere)
