"""Three floors, every import pointing down (docs/architecture.md).

``slackwater`` (ground) imports none of the others; ``emitter`` and ``spark_consumer``
(middle) import ``slackwater`` only, never each other; ``demo`` (top) may import all.
Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

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
            "import sys, spark_consumer.source.wire.splits, "
            "spark_consumer.source.executor.readers; "
            "print(sorted(m for m in ('prometheus_client', 'slackwater.http_server') "
            "if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.strip() == "[]"


# The source's rooms by role (docs/architecture.md), one folder each: the face (what a
# job imports, and the DataSource Spark loads), ``shared`` (loaded on both sides:
# options, event time, late rows), ``wire`` (what travels between the driver and the
# executors: the offset Spark logs, the tasks, the progress records), ``driver`` (Spark's
# planner process) and ``executor`` (the Python workers that read a task). Each imports
# only the folders listed for it, anywhere in a module, but for ``read``: Spark's entry on
# an executor, which imports the executors' room there.
SOURCE = ROOT / "spark_consumer" / "source"
FACE = {"__init__", "stream", "metrics"}
FOLDERS = {
    "shared": {"shared"},
    "wire": {"shared", "wire"},
    "driver": {"shared", "wire", "driver"},
    "executor": {"shared", "wire", "executor"},
    "face": {"face", "shared", "wire", "driver"},
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


def _source_modules() -> dict[str, Path]:
    """Every module of the source by its dotted name (a package by its folder's)."""
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _folder(module: str) -> str | None:
    """The room a module of the source sits in: its folder, or the face."""
    inside = module.removeprefix("spark_consumer.source").lstrip(".").split(".")
    if inside == [""] or (len(inside) == 1 and inside[0] in FACE):
        return "face"
    return inside[0] if inside[0] in FOLDERS and inside[0] != "face" else None


def _source_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the source that a module imports, anywhere in it but ``read``."""
    tree = ast.parse(path.read_text())
    in_read = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "read"
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in in_read:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {name for name in found if name in modules}


def test_every_module_of_the_source_sits_in_a_room_by_role() -> None:
    modules = _source_modules()
    assert {m for m in modules if _folder(m) is None} == set()
    assert {_folder(m) for m in modules} == set(FOLDERS)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_each_room_imports_only_the_rooms_it_may(folder: str) -> None:
    """Rooms both sides load (shared, wire) import no driver or executor room; the driver
    and the executors never import each other (the driver's ``read`` aside)."""
    modules = _source_modules()
    wrong = {
        f"{path.relative_to(ROOT)} imports {imported}"
        for module, path in modules.items()
        if _folder(module) == folder
        for imported in _source_imports(path, modules)
        if _folder(imported) not in FOLDERS[folder]
    }
    assert not wrong, sorted(wrong)


def _longest_chain(graph: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The floors of the import graph (its longest chain), or a circle found on the way."""
    floors: dict[str, int] = {}
    visiting: list[str] = []

    def floor(module: str) -> int:
        if module in visiting:
            raise AssertionError(f"import circle: {[*visiting[visiting.index(module) :], module]}")
        if module not in floors:
            visiting.append(module)
            floors[module] = 1 + max((floor(n) for n in graph[module]), default=0)
            visiting.pop()
        return floors[module]

    return max((floor(m) for m in graph), default=0), sorted(floors)


def test_the_sources_imports_make_no_circle_and_fewer_floors_than_before_the_rooms() -> None:
    """Issue 40: 2 circles and 9 floors in the flat room; none and 8 since."""
    modules = _source_modules()
    graph = {m: _source_imports(p, modules) - {m} for m, p in modules.items()}
    floors, _ = _longest_chain(graph)
    assert floors <= 8


def test_the_circle_check_finds_a_circle() -> None:
    with pytest.raises(AssertionError, match="import circle"):
        _longest_chain({"a": {"b"}, "b": {"a"}})


def test_the_planner_loads_none_of_the_executors_rooms() -> None:
    import subprocess
    import sys

    rooms = sorted(m for m in _source_modules() if _folder(m) == "executor")
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, spark_consumer.source, spark_consumer.source.driver.planner; "
            f"print(sorted(m for m in {rooms!r} if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_room_check_sees_an_import_outside_read_and_not_inside(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from spark_consumer.source.executor import readers\n"
        "def read():\n    from spark_consumer.source.executor import arrow_rows\n"
    )
    assert _source_imports(module, _source_modules()) == {"spark_consumer.source.executor.readers"}


def test_the_spark_facing_class_keeps_only_what_spark_calls() -> None:
    from spark_consumer.source.driver.planner import SlackwaterStreamReader

    public = {
        name
        for name, value in vars(SlackwaterStreamReader).items()
        if callable(value) and not name.startswith("_")
    }
    assert public == SPARKS_CALLS


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def too_big(path: Path) -> list[str]:
    """About 500 lines a module, 60 a function, 300 a class: a room that grows past them
    holds a second job (issues 30 and 40)."""
    text = path.read_text()
    found = []
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    if text.count("\n") > 500:
        found.append(f"{name}: {text.count(chr(10))} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = 300 if isinstance(node, ast.ClassDef) else 60
            if length > limit:
                found.append(f"{name}: {node.name} is {length} lines")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_the_products_rooms_stay_small(package: str) -> None:
    found = [line for path in sorted((ROOT / package).rglob("*.py")) for line in too_big(path)]
    assert not found, found


def test_the_size_check_finds_a_long_function_and_a_long_class(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    module.write_text(f"def f():\n{body}\nclass C:\n" + "    y = 1\n" * 300)
    assert too_big(module) == ["m.py: f is 62 lines", "m.py: C is 301 lines"]


# The tests mirror the product: one folder by what a test starts, the harness apart.
TESTS = ROOT / "tests"
TEST_FOLDERS = {"pure", "kafka", "spark", "cluster"}


def test_every_test_sits_in_a_folder_by_what_it_starts() -> None:
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == []
    assert {p.parent.name for p in TESTS.rglob("test_*.py")} == TEST_FOLDERS
    assert not list((TESTS / "harness").glob("test_*.py"))


def test_the_run_order_names_every_folder_and_only_files_there_are() -> None:
    """make test's two processes start with the longest files (tests/conftest.py): a
    file renamed would fall back to its folder's place, and a new folder would run first."""
    from tests.conftest import FOLDER_ORDER, LONGEST_FILES

    assert set(FOLDER_ORDER) == TEST_FOLDERS
    # (pytest-xdist would otherwise start the groups with the most tests.)
    assert "--dist loadfile --no-loadscope-reorder" in (ROOT / "Makefile").read_text()
    there = {path.name for path in TESTS.rglob("test_*.py")}
    assert not LONGEST_FILES - there, sorted(LONGEST_FILES - there)


def test_make_tests_processes_take_a_file_whole_and_the_cluster_folder_whole() -> None:
    """tests/conftest.py's scheduler: one unit per file, one for every cluster file."""
    from tests.conftest import pytest_xdist_make_scheduler

    class Config:  # what the scheduler reads of pytest's, for make test's options
        option = SimpleNamespace(loadscopereorder=False, maxschedchunk=None)

        def getvalue(self, name: str) -> object:
            return {"dist": "loadfile", "tx": ["2*popen"]}.get(name)

    scheduler = pytest_xdist_make_scheduler(Config(), None)  # type: ignore[arg-type]
    scopes = {
        node: scheduler._split_scope(node)
        for node in (
            "tests/cluster/test_kafka_cluster.py::test_a",
            "tests/cluster/test_cluster_faults.py::test_b[True]",
            "tests/spark/test_demo.py::test_c",
            "tests/spark/test_demo.py::test_d",
            "tests/pure/test_valve.py::test_e",
        )
    }
    assert list(scopes.values()) == [
        "tests/cluster/",
        "tests/cluster/",
        "tests/spark/test_demo.py",
        "tests/spark/test_demo.py",
        "tests/pure/test_valve.py",
    ]


def test_no_test_imports_another_test() -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported(path)
        if name.startswith("tests.") and name.split(".")[-1].startswith("test_")
    } | {
        f"{path.relative_to(ROOT)} imports {node.module}.{alias.name}"
        for path in sorted(TESTS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests")
        for alias in node.names
        if alias.name.startswith("test_")
    }
    assert not wrong, sorted(wrong)


def test_pure_tests_start_nothing() -> None:
    """A pure test asks for no broker, cluster, secured node nor Spark session."""
    started = {"broker", "cluster", "secured", "spark", "admin", "new_topic", "emitters"}
    wrong = {
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} takes {sorted(taken)}"
        for path in sorted((TESTS / "pure").glob("test_*.py"))
        for node in _functions(ast.parse(path.read_text()))
        if (taken := {a.arg for a in node.args.args} & started)
    }
    assert not wrong, sorted(wrong)


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


# Rule 5 (kafka_evidence.known_offset) and the one door of ListOffsets answers
# (slackwater/list_offsets.py, which applies it): an offset is told from librdkafka's
# logical ones (-1, -2, -1001) by kafka_evidence alone, never by a comparison written
# where the offset is read (issue 41).
SENTINEL_HOMES = {"kafka_evidence.py", "list_offsets.py"}
LOGICAL_OFFSETS = {"OFFSET_INVALID", "OFFSET_END", "OFFSET_BEGINNING", "OFFSET_STORED"}
# Names that hold an offset: any with "offset" in it, these, and *_end, *_start,
# *_position (a partition's number or a leader's id is none of them).
OFFSET_NAMES = {"log_end", "log_start", "position", "end", "start", "low", "high", "committed"}
_FLIPPED = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}


def _holds_an_offset(node: ast.expr) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value  # offsets[key]
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    if not isinstance(name, str):
        return False
    name = name.lower().lstrip("_")
    return (
        "offset" in name or name in OFFSET_NAMES or name.endswith(("_end", "_start", "_position"))
    )


def _int_constant(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _int_constant(node.operand)
        return None if value is None else -value
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _a_sentinel_test(op: ast.cmpop, other: ast.expr) -> bool:
    """``offset <op> other`` tells a logical offset from a real one: against a negative
    constant (or a set of them, or a LOGICAL_OFFSETS name), or splitting at 0 (>= 0,
    < 0). ``== 0`` or ``> 0`` asks of a real offset (an empty log, records deleted)."""
    if isinstance(op, ast.In | ast.NotIn) and isinstance(other, ast.Tuple | ast.List | ast.Set):
        return any(_a_sentinel_test(ast.Eq(), element) for element in other.elts)
    if (getattr(other, "attr", None) or getattr(other, "id", None)) in LOGICAL_OFFSETS:
        return True
    value = _int_constant(other)
    return value is not None and (value < 0 or (value == 0 and isinstance(op, ast.GtE | ast.Lt)))


def offsets_judged_by_hand(path: Path) -> list[str]:
    """Where a module tells an offset from a sentinel itself: a comparison of an offset
    with one, or librdkafka's -1001; and (outside list_offsets.py) ListOffsets sent
    without the door: ``<admin>.list_offsets`` or the binding's private method."""
    found: list[ast.AST] = []
    door = path.name in SENTINEL_HOMES
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                flipped = _FLIPPED.get(type(op), type(op))()
                if (_holds_an_offset(left) and _a_sentinel_test(op, right)) or (
                    _holds_an_offset(right) and _a_sentinel_test(flipped, left)
                ):
                    found.append(node)
        elif door:
            continue
        elif isinstance(node, ast.expr) and _int_constant(node) == -1001:
            found.append(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            sent_by = ast.unparse(node.func.value).lower()
            if node.func.attr == "list_offsets" and "admin" in sent_by:
                found.append(node)
        elif getattr(node, "id", None) == "_AdminClientImpl":
            found.append(node)
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    by_line: dict[int, str] = {}  # the first finding of a line (a -1001 in a comparison)
    for node in sorted(found, key=lambda n: (n.lineno, n.col_offset)):  # type: ignore[attr-defined]
        by_line.setdefault(node.lineno, f"{name}:{node.lineno} {ast.unparse(node)}")  # type: ignore[attr-defined]
    return list(by_line.values())


def test_offsets_are_told_from_sentinels_by_kafka_evidence_alone() -> None:
    found = [
        line
        for package in ("slackwater", "emitter", "spark_consumer")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "kafka_evidence.py"
        for line in offsets_judged_by_hand(path)
    ]
    assert not found, found


def test_the_sentinel_guard_finds_each_hand_written_judgment(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "ok = tp.offset >= 0\n"
        "if committed_offset < 0: pass\n"
        "x = 0 <= log_end\n"
        "y = position == -1\n"
        "z = end in (-1, -1001)\n"
        "w = offsets[key] != OFFSET_INVALID\n"
        "v = -1001\n"
        "admin.list_offsets(request)\n"
        "self._admin.list_offsets(request)\n"
        "_AdminClientImpl.list_offsets\n"
        # Not judgments: a real offset asked of, a partition, a leader, the door's
        # wrapper, a logical offset passed as a request.
        "a = log_end == 0 or log_start > 0 or tp.partition < 0 or p.leader >= 0\n"
        "b = kafka.list_offsets(partitions, 'latest')\n"
        "positions.setdefault(partition, OFFSET_BEGINNING)\n"
    )
    assert [line.split(" ", 1)[0] for line in offsets_judged_by_hand(module)] == [
        f"m.py:{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
    ]


# The test of a module is found from its name: tests/<folder>/test_<module>.py. A module
# whose behaviour is tested through another door (a subcommand, the face, a job) says
# where here; a module added without either fails below.
TESTED_IN = {
    "slackwater/cli.py": ["kafka/test_cli_flags.py"],
    "slackwater/cli_types.py": ["kafka/test_cli_flags.py", "pure/test_config.py"],
    "slackwater/broker_command.py": ["kafka/test_kafka_broker.py", "cluster/test_kafka_cluster.py"],
    "slackwater/settings.py": ["pure/test_config.py", "pure/test_consumer_config.py"],
    "slackwater/lifecycle.py": ["pure/test_kafka_logging.py"],
    "emitter/service.py": ["kafka/test_emitter_integration.py", "spark/test_real_broker.py"],
    "emitter/startup.py": ["kafka/test_emitter_integration.py"],
    "emitter/publisher.py": ["kafka/test_emitter_integration.py"],
    "emitter/group_tracker.py": ["kafka/test_emitter_integration.py"],
    "emitter/status_view.py": ["kafka/test_emitter_integration.py"],
    "emitter/terms.py": ["kafka/test_election.py", "kafka/test_emitter_integration.py"],
    "emitter/snapshot.py": ["kafka/test_election.py", "kafka/test_emitter_integration.py"],
    "emitter/metrics.py": ["pure/test_metrics_render.py"],
    "emitter/control_topic_repair.py": ["kafka/test_control_topic_lost.py"],
    "emitter/commands.py": ["kafka/test_cli_flags.py", "pure/test_kafka_secrets.py"],
    "spark_consumer/consume/job.py": ["spark/test_consume_job.py"],
    "spark_consumer/consume/commands.py": ["spark/test_consume_command.py"],
    "spark_consumer/consume/metrics.py": ["spark/test_consume_command.py"],
    "spark_consumer/source/stream.py": ["spark/test_source.py", "spark/test_source_connect.py"],
    "spark_consumer/source/metrics.py": ["spark/test_source.py"],
    "spark_consumer/source/driver/plan_answers.py": ["pure/test_plan.py"],
    "spark_consumer/source/driver/batch_ends.py": [
        "pure/test_watermark_alignment.py",
        "pure/test_plan.py",
    ],
    "spark_consumer/source/driver/progress_topic.py": ["kafka/test_progress_collector.py"],
    "spark_consumer/source/executor/reader_clients.py": ["kafka/test_readers.py"],
    "spark_consumer/source/wire/offset_error.py": [
        "kafka/test_offset.py",
        "kafka/test_offset_v1.py",
    ],
    "spark_consumer/source/wire/progress.py": ["kafka/test_readers.py", "pure/test_plan.py"],
    "spark_consumer/source/wire/splits.py": ["kafka/test_readers.py", "kafka/test_offset.py"],
    "demo/live_demo.py": ["spark/test_demo.py"],
    "demo/producer_script.py": ["spark/test_demo.py"],
    "demo/chart.py": ["spark/test_demo.py"],
    "demo/commands.py": ["spark/test_demo.py"],
}


def test_the_test_of_a_module_is_found_from_its_name() -> None:
    named = {path.stem.removeprefix("test_") for path in TESTS.rglob("test_*.py")}
    unfound = sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
        and path.stem not in named
        and str(path.relative_to(ROOT)) not in TESTED_IN
    )
    assert unfound == []
    named_twice = sorted(
        module for module in TESTED_IN if Path(module).stem in named or not (ROOT / module).exists()
    )
    assert named_twice == [], "a module with a test of its name, or gone, is listed"
    assert all((TESTS / test).exists() for tests in TESTED_IN.values() for test in tests)


def test_an_installed_copy_holds_every_module() -> None:
    """``pip install .`` (the Dockerfile, ``--py-files``) takes the packages that
    pyproject.toml finds: every folder of the product with a module in it."""
    import tomllib

    from setuptools import find_namespace_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = found["packages"]["find"]["include"]
    installed = set(find_namespace_packages(where=str(ROOT), include=include))
    with_modules = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert with_modules - installed == set()
    assert "spark_consumer.consume.resources" in installed  # its log4j2 settings, no code


def test_a_test_reruns_only_when_sparks_python_worker_missed_its_ten_seconds() -> None:
    """Every other failure fails the run (docs/decisions.md, "Spark's 10 s for its
    Python worker"): ``--reruns`` comes with ``--only-rerun`` naming that one message."""
    import shlex
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    words = shlex.split(options["ini_options"]["addopts"])
    reruns = [word for word in words if word.startswith("--reruns")]
    only = [word.split("=", 1)[1] for word in words if word.startswith("--only-rerun")]
    assert reruns == ["--reruns=1"]
    assert only == ["Python worker failed to connect back"]
