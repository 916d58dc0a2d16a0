"""Where set-up put the Java parts fetched from Maven Central (semantics.md §7).

`make` runs `mvn dependency:copy-dependencies` on `deploy/jars/pom.xml` once, into
`.jars/<module>/` at the repository root; nothing is downloaded at run time.
`SLACKWATER_JARS_DIR` points elsewhere (an installed package, a container image).
"""

from __future__ import annotations

import os
from pathlib import Path

KAFKA_BROKER = "kafka-broker"
SPARK_KAFKA = "spark-kafka"


class MissingJarsError(RuntimeError):
    """The fetched jars are not where set-up puts them."""


def jars_root() -> Path:
    configured = os.environ.get("SLACKWATER_JARS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".jars"


def jar_files(module: str) -> list[Path]:
    """The jars of one module of deploy/jars/pom.xml, sorted; one clear error if absent."""
    folder = jars_root() / module
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise MissingJarsError(
            f"no jars in {folder}: run 'make jars' (mvn -q -f deploy/jars/pom.xml "
            "dependency:copy-dependencies) once, or set SLACKWATER_JARS_DIR"
        )
    return jars


def fetched_jar_files(module: str) -> list[Path]:
    """The module's jars if set-up fetched them, else none (for optional parts)."""
    try:
        return jar_files(module)
    except MissingJarsError:
        return []
