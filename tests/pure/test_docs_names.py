"""Every file, class and function named in the docs exists.

The docs name our code in inline code spans (`` `spark_consumer/valve.py` ``,
`` `emitter.service` ``, `` `MarkerAligner` ``, `` `not_answered()` ``); a rename that
forgets a page leaves it pointing at nothing. Each span of README.md and docs/*.md that
looks like a name of ours is checked against the repository:

* a path under one of our folders (``slackwater/``, ``emitter/``, ``tests/``, ...) must
  exist; ``path/module.Name`` must be a module defining ``Name``;
* a dotted name starting with one of our packages (``spark_consumer.source.planner``,
  ``bench.pipeline_bench``) must resolve to a module file or package, and what follows
  the module (``emitter.config.ControlConfig``, ``...Class.method``) must be defined in
  it;
* a module's file name alone (``run_ends.py``) must be a file of ours, and a name given
  by its module's last part (``kafka_clients.refresh_leaders``, ``markers.partition_key``)
  must be defined in a module of that name;
* a CamelCase name (``MarkerAligner``), ``Class.attribute``, ``a_function()``, a private
  name (``_encode_partitions``), a test's name (``test_...``) and a duration constant
  (``GONE_CHECK_S``) must be defined somewhere in our code (or be an alert of
  deploy/prometheus/alerts.yml), unless it is one of ``EXTERNAL``: Flink's, Spark's,
  Kafka's, confluent-kafka's, pydantic's, Prometheus's or Python's.

Spans with spaces, ``=``, URLs, flags, templates (``<topic>``, ``*``) and lower-case
dotted names that are not ours (Kafka settings, Spark options) are not names of ours.
The journals (performance.md, decisions.md) tell history, which may name what was
removed since: there only paths and dotted names of our packages are checked, and a path
that is gone must say so right after it ("(since removed)", "(since renamed ...)") or
name the commit it is read at ("from e3eeae9").
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Folders of ours that a path in the docs may start with.
OUR_FOLDERS = ("slackwater", "emitter", "spark_consumer", "demo", "tests", "bench", "examples")
OUR_PATH_ROOTS = (*OUR_FOLDERS, "deploy")
# History: only paths and dotted names are checked, and a path that is gone must say so.
JOURNALS = frozenset({"performance.md", "decisions.md"})
GONE_SAID = re.compile(r"^\W{0,3}(since (removed|renamed|moved|split)|(at|from) [0-9a-f]{7,40}\b)")
# Dotted names of ours that are not modules: loggers, topics, an entry-point group.
NOT_MODULES = ("slackwater.librdkafka", "slackwater.control", "slackwater.commands")

# Names the docs take from outside: Flink, Spark, Kafka, confluent-kafka, pydantic,
# Prometheus, Python. Only genuinely external names belong here.
EXTERNAL = frozenset(
    {
        # Apache Flink
        "KafkaSource",
        "KafkaSourceEnumerator",
        "WatermarksWithIdleness",
        # Apache Spark, pyspark
        "KafkaMicroBatchStream",
        "KafkaOffsetReader",
        "StreamingQuery",
        "SupportsTriggerAvailableNow",
        "exception",  # StreamingQuery.exception()
        "explain",  # DataFrame.explain()
        # Apache Kafka
        "StandardAuthorizer",
        # Python
        "BrokenPipeError",
        "ConnectionResetError",
        "EOFError",
        "KeyError",
        "ValueError",
    }
)

SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CALL = re.compile(rf"^({IDENT}(?:\.{IDENT})*)\(.*\)$")
DOTTED = re.compile(rf"^{IDENT}(?:\.{IDENT})+$")
CAMEL = re.compile(r"^_?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
CLASS_ATTR = re.compile(rf"^(_?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)\.({IDENT})$")
SNAKE = re.compile(r"^_?[a-z][a-z0-9_]*$")
TEST_NAME = re.compile(r"^test_[a-z0-9_]+$")
PRIVATE = re.compile(r"^_[a-z][a-z0-9_]*$")
BARE_FILE = re.compile(r"^[a-z_][a-z0-9_]*\.py$")
LOWER_CAMEL = re.compile(r"^[a-z]+[A-Z]")
DURATION = re.compile(r"^[A-Z][A-Z0-9_]*_(S|MS)$")
PATH = re.compile(r"^[A-Za-z0-9_.\-/]+$")


@dataclass
class Module:
    """What a module of ours defines (top-level names, each class's attributes), and the
    names it imports (which a dotted name may reach through it: a package's face)."""

    names: set[str] = field(default_factory=set)
    classes: dict[str, set[str]] = field(default_factory=dict)
    imported: set[str] = field(default_factory=set)


def _targets(node: ast.AST) -> set[str]:
    """The names an assignment binds (``a = ``, ``a: int = ``, ``a, b = ``)."""
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _class_attributes(cls: ast.ClassDef) -> set[str]:
    """A class's methods, class-level assignments, and ``self.x`` set in its methods."""
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        found |= _targets(node)
    for inner in ast.walk(cls):
        if (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.ctx, ast.Store)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "self"
        ):
            found.add(inner.attr)
    return found


@cache
def module(path: Path) -> Module:
    """What one module (a ``.py`` file, or a package's ``__init__.py``) defines."""
    tree = ast.parse(path.read_text(), str(path))
    found = Module()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found.names.add(node.name)
            found.classes[node.name] = _class_attributes(node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            found.names |= _targets(node)
        if isinstance(node, ast.Assign) and "__all__" in _targets(node):
            found.names |= {
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return found


@cache
def definitions() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """Every name our code defines (classes and functions at any depth, top-level and
    class-level assignments), and every class's attributes (merged by class name)."""
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    for folder in OUR_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            names |= module(path).names
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, set()).update(_class_attributes(node))
    alerts = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text()
    names |= set(re.findall(r"^\s*- alert: (\w+)", alerts, re.MULTILINE))
    return frozenset(names), {name: frozenset(attrs) for name, attrs in classes.items()}


@cache
def module_files() -> dict[str, tuple[Path, ...]]:
    """Our modules by their last part (``kafka_clients``, ``broker``); packages are left
    out (``tests/spark``, ``tests/kafka`` would take Spark's and Kafka's settings)."""
    found: dict[str, list[Path]] = {}
    for folder in OUR_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "__init__.py":
                found.setdefault(path.stem, []).append(path)
    return {stem: tuple(paths) for stem, paths in found.items()}


def _module_file(parts: list[str]) -> Path | None:
    """The file of a dotted module name of ours, or None."""
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _defined_in(path: Path, attrs: list[str]) -> bool:
    """Whether ``name`` or ``Class.attribute`` is defined in a module (a package's
    submodule counts as a name of the package)."""
    found = module(path)
    if not attrs:
        return True
    if len(attrs) == 1:
        sub = path.parent / attrs[0]
        return attrs[0] in found.names | found.imported or (
            path.name == "__init__.py" and (sub.with_suffix(".py").is_file() or sub.is_dir())
        )
    if len(attrs) == 2:
        return attrs[1] in found.classes.get(attrs[0], set())
    return False


def check_dotted(name: str) -> str | None:
    """A dotted name starting with one of our packages: the longest prefix that is a
    module, then what follows defined in it."""
    parts = name.split(".")
    if parts[0] not in OUR_FOLDERS or name.startswith(NOT_MODULES):
        return None
    for cut in range(len(parts), 0, -1):
        path = _module_file(parts[:cut])
        if path is not None:
            if _defined_in(path, parts[cut:]):
                return None
            return f"`{name}`: {'.'.join(parts[cut:])} is not defined in {'.'.join(parts[:cut])}"
    return f"`{name}`: no such module"


def check_path(name: str) -> str | None:
    """A path under one of our folders: it exists; or ``dir/module.Name`` names a module
    that defines ``Name``."""
    if not name.startswith(tuple(f"{root}/" for root in OUR_PATH_ROOTS)):
        return None
    path = name.split("::", maxsplit=1)[0]
    path = re.sub(r":\d+(-\d+)?$", "", path)
    if (ROOT / path).exists():
        return None
    head, _, tail = path.rpartition("/")
    stem, dot, attr = tail.partition(".")
    if dot and (ROOT / head / f"{stem}.py").is_file() and "." not in attr:
        if _defined_in(ROOT / head / f"{stem}.py", attr.split(".")):
            return None
        return f"`{name}`: {attr} is not defined in {head}/{stem}.py"
    return f"`{name}`: no such file or folder"


def check_file_name(name: str) -> str | None:
    """A module's file name alone: some module of ours has it."""
    if name.removesuffix(".py") in module_files() and any(
        p.name == name for p in module_files()[name.removesuffix(".py")]
    ):
        return None
    return f"`{name}`: no such file in our packages"


def check_relative(name: str) -> str | None:
    """``module.name`` (or ``module.Class.attribute``) by the module's last part: a module
    of that name defines it, at its top or in one of its classes (``planner.partitions()``:
    the planner's method). Not one of ours (a Kafka setting, a column's method): None."""
    parts = name.split(".")
    if len(parts) > 3 or LOWER_CAMEL.match(parts[-1]):
        return None
    if parts[0] not in module_files():
        # A constant or a class after a lower-case name is code (Kafka's and Spark's
        # settings are lower case throughout): the module it names is gone.
        code = len(parts) == 2 and re.match(r"^[A-Z][A-Za-z0-9]*_|^[A-Z][a-z]", parts[1])
        return f"`{name}`: no module {parts[0]}" if code else None
    for path in module_files()[parts[0]]:
        in_a_class = len(parts) == 2 and any(
            parts[1] in attrs for attrs in module(path).classes.values()
        )
        if in_a_class or _defined_in(path, parts[1:]):
            return None
    return f"`{name}`: {'.'.join(parts[1:])} is not defined in any module {parts[0]}"


def check_name(name: str) -> str | None:
    """A name of ours that is not a path nor a module: defined somewhere in our code."""
    names, classes = definitions()
    call = CALL.match(name)
    if call:
        name = call.group(1)
        if SNAKE.match(name):
            return None if name in names or name in EXTERNAL else f"`{name}()` is not defined"
    class_attr = CLASS_ATTR.match(name)
    if class_attr:
        cls, attr = class_attr.groups()
        if cls in EXTERNAL:
            return None
        if cls not in classes:
            return f"`{name}`: no class {cls}"
        return None if attr in classes[cls] else f"`{name}`: {cls} has no {attr}"
    if CAMEL.match(name) or TEST_NAME.match(name) or DURATION.match(name) or PRIVATE.match(name):
        if name in EXTERNAL or name in names:
            return None
        return f"`{name}` is not defined"
    return None


def check_span(span: str, *, journal: bool) -> str | None:
    """One inline code span: a problem, or None (fine, or not a name of ours)."""
    name = span.strip().rstrip(".,:;")
    if not name or any(c.isspace() for c in span.strip()) or "://" in name:
        return None
    if name.startswith(("-", "/", "~", ".")) or any(c in name for c in "=<>*{}[]$|'\"@,"):
        return None
    if "/" in name:
        return check_path(name) if PATH.match(name) else None
    call = CALL.match(name)
    dotted = call.group(1) if call else name
    if DOTTED.match(dotted) and dotted.split(".")[0] in OUR_FOLDERS:
        return check_dotted(dotted)
    if journal:
        return None
    if BARE_FILE.match(name):
        return check_file_name(name)
    if DOTTED.match(dotted) and not CLASS_ATTR.match(dotted):
        return check_relative(dotted)
    return check_name(name)


def _without_fences(text: str) -> list[str]:
    """The page's lines, those inside fenced code blocks blanked (line numbers kept)."""
    lines = text.split("\n")
    inside = False
    for number, line in enumerate(lines):
        if FENCE.match(line):
            inside = not inside
            lines[number] = ""
        elif inside:
            lines[number] = ""
    return lines


def problems(text: str, *, journal: bool) -> list[str]:
    """Every name of ours a Markdown page gets wrong, as ``line: problem``."""
    body = "\n".join(_without_fences(text))
    found = []
    for match in SPAN.finditer(body):
        problem = check_span(match.group(1), journal=journal)
        if problem and journal and GONE_SAID.match(body[match.end() : match.end() + 40]):
            problem = None
        if problem:
            found.append(f"{body.count(chr(10), 0, match.start()) + 1}: {problem}")
    return found


DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_name_a_doc_gives_exists(doc: Path) -> None:
    wrong = problems(doc.read_text(), journal=doc.name in JOURNALS)
    assert not wrong, "\n".join(f"{doc.relative_to(ROOT)}:{w}" for w in wrong)


def test_the_check_finds_names_that_do_not_exist() -> None:
    page = (
        "The `NoSuchClassAnywhere` in `spark_consumer/nothing.py` is read by\n"
        "`emitter.service.no_such_function` and `no_such_helper()`, not by\n"
        "`MalformedControlRecord` nor `maxOffsetsPerTrigger`, `log.retention.ms` or `--verbose`.\n"
        "```\n`InsideAFence`\n```\n"
    )
    found = problems(page, journal=False)
    assert any("NoSuchClassAnywhere" in p and p.startswith("1:") for p in found), found
    assert any("spark_consumer/nothing.py" in p for p in found), found
    assert any("no_such_function" in p and p.startswith("2:") for p in found), found
    assert any("no_such_helper" in p for p in found), found
    assert len(found) == 4, found


def test_a_journal_may_name_a_path_removed_since_if_it_says_so() -> None:
    page = "`spark_consumer/nothing.py` (since removed) and `spark_consumer/gone.py`.\n"
    assert problems(page, journal=True) == ["1: `spark_consumer/gone.py`: no such file or folder"]
