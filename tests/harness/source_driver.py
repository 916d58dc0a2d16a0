"""The slackwater source's stream reader driven as Spark drives it, in the test's process.

Spark's micro-batch loop, one step at a time and nothing else: ``latestOffset(start)``,
the offset through JSON (as Spark's offset log keeps it), ``partitions(start, end)``, every
partition read (the executors' ``read``), then the next ``latestOffset`` from ``end``.
A restart is a new reader from the last offset, as Spark restarts from its checkpoint.
The production cases of the source (issue 21: tests/kafka/test_reader_ranges.py,
test_progress_collector.py, test_control_reader.py and the others named after the module
they test) need a window this loop makes certain: a topic deleted between planning and
reading, records deleted before a restart, a marker written while the planner waits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from spark_consumer.source.driver.planner import SlackwaterStreamReader
from spark_consumer.source.shared.options import SourceOptions
from spark_consumer.source.wire.offset import SourceOffset


def options(bootstrap: str, topics: str, control: str | None, **more: str) -> dict[str, str]:
    """The DataSource options of a test's source (progressTimeoutMs short by default)."""
    given = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topics,
        "maxOutOfOrderness": "1s",
        "progressTimeoutMs": "20000",
        **more,
    }
    if control is not None:
        given["controlTopic"] = control
    return given


@dataclass
class Driven:
    """One query's planner and readers; ``offset`` is the last batch's end (its start)."""

    reader: SlackwaterStreamReader
    offset: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, given: dict[str, str], reader_class: type = SlackwaterStreamReader) -> Driven:
        reader = reader_class(SourceOptions.parse(given))
        return cls(reader, _logged(reader.initialOffset()))

    @classmethod
    def restart(
        cls,
        given: dict[str, str],
        offset: dict[str, Any],
        reader_class: type = SlackwaterStreamReader,
    ) -> Driven:
        """A new process on the same checkpoint: nothing but the offset survives."""
        return cls(reader_class(SourceOptions.parse(given)), offset)

    def plan(self) -> dict[str, Any]:
        """The next batch's end offset (``offset`` itself when there is no new batch),
        within the read limit Spark would pass (maxOffsetsPerTrigger, or all)."""
        return _logged(self.reader.latestOffset(self.offset, self.reader.getDefaultReadLimit()))

    def run(self, end: dict[str, Any]) -> list[dict[str, Any]]:
        """Reads every partition of the batch ``offset -> end``; ``end`` is then the start."""
        rows = [
            row for part in self.reader.partitions(self.offset, end) for row in self._read(part)
        ]
        self.offset = end
        self.rows += rows
        return rows

    def step(self) -> list[dict[str, Any]]:
        """One trigger: a plan, and its batch read if it made one."""
        end = self.plan()
        if end == self.offset:
            return []
        return self.run(end)

    def statuses(self) -> dict[str, str]:
        return SourceOffset.decode(self.offset).statuses()

    def counter(self, name: str) -> int:
        return int(self.offset["counters"].get(name, 0))

    def stop(self) -> None:
        self.reader.stop()

    def _read(self, part: Any) -> Iterator[dict[str, Any]]:
        """Rows with ``timestamp`` and ``event_time`` in epoch ms (the synthetic row's time
        may be past what a Python datetime holds)."""
        import pyarrow as pa

        for batch in self.reader.read(part):
            columns = {
                name: pa.compute.divide(batch.column(name).cast(pa.int64()), 1000)
                if name in ("timestamp", "event_time")
                else batch.column(name)
                for name in batch.schema.names
            }
            yield from pa.table(columns).to_pylist()


def _logged(offset: dict[str, Any]) -> dict[str, Any]:
    """The offset as Spark hands it back: through its JSON log."""
    result: dict[str, Any] = json.loads(json.dumps(offset))
    return result


def real(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The data rows (not the synthetic row, whose topic is null)."""
    return [row for row in rows if row["topic"] is not None]
