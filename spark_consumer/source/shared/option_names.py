"""The names of the source's options as docs/source.md spells them, and the one warning
line for an option the source does not know (issue 43, item 4).

Spark's own Kafka source takes an option it does not know without a word, so a user who
typed ``maxOffsetPerTrigger`` ran without a limit and never learnt why. The source
neither refuses it (docs/decisions.md, "Issue 43, item 4") nor keeps quiet: one line per
such option, with the nearest name it knows.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Iterable

# Every option SourceOptions.parse reads, in its documented spelling (tests/pure/
# test_option_names.py reads the parser to hold the two together). ``kafka.*`` goes to
# the Kafka clients, which judge it themselves.
KNOWN_OPTIONS = (
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "maxOffsetsPerTrigger",
    "endingOffsets",
    "controlTopic",
    "maxOutOfOrderness",
    "eventTimeField",
    "maxEventTimeAhead",
    "failOnDataLoss",
    "watermarkDelay",
    "consumerIdleTimeout",
    "maxWatermarkDrift",
    "lateOutput",
    "lateRule",
    "progressTopic",
    "progressRetention",
    "progressTimeoutMs",
    "requestTimeoutMs",
    "readTimeoutMs",
    "maxRecordsPerArrowBatch",
    "tasksPerBatch",
    "maxRecordsPerTask",
)
KAFKA_PREFIX = "kafka."
# Keys Spark adds to a Python data source's options by itself: ``load(path)``'s path.
SPARKS_OWN = ("path",)
# How alike (difflib's ratio, on lower-case names) a known name must be to be named.
NEAR_RATIO = 0.6
# The process Spark runs a query's stream reader in (planner_process.RUNNER, which a
# module both sides load may not import): a query's start parses its options there once.
_PLANNER_MAIN = "pyspark.sql.streaming.python_streaming_source_runner"

log = logging.getLogger("spark_consumer.source.driver.planner").getChild("options")

_KNOWN_LOWER = tuple(name.lower() for name in KNOWN_OPTIONS)
_BY_LOWER = {name.lower(): name for name in (*KNOWN_OPTIONS, *SPARKS_OWN)}


def nearest_name(typed: str) -> str | None:
    """The known option nearest to ``typed`` in its documented spelling, or None when
    none is near (Spark hands the source its options' names in lower case)."""
    near = difflib.get_close_matches(typed.lower(), _KNOWN_LOWER, n=1, cutoff=NEAR_RATIO)
    return _BY_LOWER[near[0]] if near else None


def unknown_option_lines(names: Iterable[str]) -> list[str]:
    """One line for each option name the source does not know (in any case), with the
    nearest it knows; none for ``kafka.*`` or a key Spark adds itself."""
    lines = []
    for typed in sorted(names):
        lowered = typed.lower()
        if lowered in _BY_LOWER or lowered.startswith(KAFKA_PREFIX):
            continue
        near = nearest_name(typed)
        hint = "no near name" if near is None else f"nearest known name: '{near}'"
        lines.append(f"option '{typed}' is not one the source knows, ignored ({hint})")
    return lines


def warn_unknown_options(names: Iterable[str]) -> None:
    """The lines of ``unknown_option_lines`` as warnings, in Spark's planner process
    only: there a query's start parses its options once, and its stderr reaches the
    job's. Spark parses them also in daemon workers on the driver (the schema at
    ``load()``, the read's plan at the start), and tests parse them again and again."""
    if not _in_planner_process():
        return
    for line in unknown_option_lines(names):
        log.warning("%s", line)


def _in_planner_process() -> bool:
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == _PLANNER_MAIN
