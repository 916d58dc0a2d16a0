"""The source's offset: what Spark logs before each batch (``offsets/N``), so that a
replay plans the same batch and a restart continues from it (semantics.md §6).

One frozen type, ``SourceOffset``, in two wire formats: version 2 (since issue 22) and
version 1, read in every shape main wrote (tests/data, offset_v1.py); else one line
(``unreadable``).

Version 1 wrote about 155 bytes per partition (positions twice, rows led by channel
names). Version 2 keeps the batch's summary readable (``watermark``, ``status``, ...),
what the planner knew of Kafka under ``kafka`` (``seen_in``), and the per-partition
state as columns, one set per topic, a value per partition in order. Each column holds
the difference from the value it nearly always equals, left out when all are default:

    column       value                          written as
    partitions   partition numbers              left out when 0..n-1
    end          the batch's end offset         the number (null: not read any more)
    read         end - start of the batch       0 when every range is empty
    status       aligner status per partition   "AAIF-" (one character each)
    valve        valve channel status           left out when equal to "status"
    aligned      valve channel aligned          left out when aligned == ACTIVE
    position     aligner read position          - start (0)
    max_offset   highest record offset read     - (position - 1) (0)
    event        newest event time (ms)         - event_base, the topic's smallest
    watermark    valve channel watermark        - (event - maxOutOfOrderness), or MIN
    epoch        newest emitter epoch seen      - epoch_base, the topic's commonest
    idle_offset  offset of the IDLE applied     - position (null: none)
    last_data    wall ms of the last data       - last_data_base (null: none)
    pending      markers waiting for position   {index: [marker, ...]}

A column whose differences are all one value is written as that value alone. In memory
the state is version 1's (the aligner's ``snapshot()``): the format is this module's.
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slackwater.markers import TopicPartitionKey
from spark_consumer.source.wire import offset_v1
from spark_consumer.source.wire.offset_error import OffsetFormatError
from spark_consumer.valve import MIN_WATERMARK

Offsets = dict[str, dict[str, int]]

# The version this code writes; it reads it and every earlier one (``decode``).
OFFSET_VERSION = 2
_READABLE_VERSIONS = (1, 2)

_STATUS_CHARS = {"ACTIVE": "A", "IDLE": "I", "FINISHED": "F"}
_STATUS_NAMES = {char: name for name, char in _STATUS_CHARS.items()}
_NONE = "-"  # no aligner partition / no valve channel for this partition


def unreadable(version: Any, reason: str | Exception) -> OffsetFormatError:
    """The one line an unreadable offset gives: where (a Python source is told neither the
    checkpoint's path nor the batch's id), its version, why, and what to do. ``reason``:
    why its version is unknown, or what reading an offset of a known version raised."""
    what = "unknown offset"
    if isinstance(reason, Exception):
        named = "" if isinstance(reason, OffsetFormatError) else f"{type(reason).__name__}: "
        what, reason = "offset", f"not an offset this source wrote ({named}{reason})"
    newer = type(version) is int and version > OFFSET_VERSION
    return OffsetFormatError(
        f"{what} version {version!r} in the checkpoint's offset log (the newest file in "
        f"offsets/ under the query's checkpointLocation): {' '.join(reason.split())[:300]}; "
        f"to go on, {'run the newer release that wrote it, or ' if newer else ''}start the "
        "query on a new checkpointLocation with startingOffsets earliest (reads the topics "
        "again) or latest (from their ends); the old one's positions and state are not kept"
    )


@dataclass(frozen=True)
class SourceOffset:
    """One batch's offset: its data ranges (``data_from`` -> ``data``), the positions read
    on the control and progress topics, the watermark planned into its synthetic row, the
    watermark Spark applies while it runs (``late_threshold``: the previous batch's plan),
    and the aligner/valve state after planning (``aligner``, the aligner's snapshot)."""

    data: Offsets
    data_from: Offsets
    control: dict[str, int]
    progress: dict[str, int]
    watermark: int
    late_threshold: int
    status: str
    aligner: dict[str, Any]
    plan_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The query's identity, made with its first offset: its progress keys carry it ("" in
    # an offset written before queries had one).
    query: str = ""
    # The newest event time the batch's records may carry (maxEventTimeAhead past the
    # planning clock), logged so that a replay of the batch judges them the same.
    latest_event_ms: int | None = None
    # The previous batch's threshold and Spark's id of that batch (late_events_watermark);
    # None in an offset planned before readers reported batch ids.
    previous_threshold: int | None = None
    previous_batch_id: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    # How long planning waited for the readers' progress (informational, not compared).
    progress_wait_ms: int = 0
    # Markers (JSON) for partitions the broker does not list yet.
    held: list[dict[str, Any]] = field(default_factory=list)
    # How many tasks the batch's ranges are grouped into (splits.group_ranges),
    # fixed when it is planned: a replay and the next plan make the same tasks whatever the
    # options are then. None (version 1): one task per range.
    tasks: int | None = None
    # The format it was read from (what it is written as is always OFFSET_VERSION).
    version: int = OFFSET_VERSION
    kafka: dict[str, Any] = field(default_factory=dict)  # topic ids, leader epochs
    planned_with: dict[str, Any] = field(default_factory=dict)  # options: restart_options
    # Watermark alignment's holds in this batch (watermark_alignment.Alignment.summary);
    # empty with the option off.
    alignment: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ reading

    @classmethod
    def decode(
        cls, raw: Mapping[str, Any], *, max_event_time_ahead_ms: int | None = None
    ) -> SourceOffset:
        """An offset as Spark hands it back (parsed), of any version, or one line why not."""
        if not isinstance(raw, Mapping):
            raise unreadable(None, f"not a JSON object but {type(raw).__name__}")
        version = raw.get("v")
        if type(version) is not int or version not in _READABLE_VERSIONS:
            raise unreadable(version, "this source reads versions 1 and 2")
        try:
            offset = cls._decode(raw, version, max_event_time_ahead_ms)
            if version == 1:
                offset._state  # noqa: B018 (its version 2 form: every value checked once)
            return offset
        except (LookupError, TypeError, ValueError, AttributeError) as error:
            raise unreadable(version, error) from error

    @classmethod
    def _decode(
        cls, raw: Mapping[str, Any], version: int, max_event_time_ahead_ms: int | None
    ) -> SourceOffset:
        if version == 1:
            data, data_from = offset_v1.offsets(raw["data"]), offset_v1.offsets(raw["from"])
            aligner = offset_v1.aligner(raw["aligner"])
        else:
            data, data_from, aligner = _decode_partitions(raw)
        return cls(
            data=data,
            data_from=data_from,
            control={str(p): int(o) for p, o in raw["control"].items()},
            progress={str(p): int(o) for p, o in raw["progress"].items()},
            watermark=int(raw["watermark"]),
            late_threshold=int(raw["late_threshold"]),
            status=str(raw["status"]),
            aligner=aligner,
            # What an older version 1 left out (tests/data) is what its code meant then:
            plan_id=str(raw.get("plan_id", "")),  # none before 2dd89a8
            query=str(raw.get("query", "")),  # none before 0d924d2 (progress keys without)
            latest_event_ms=_latest_event_ms(raw, max_event_time_ahead_ms),
            # None before 544f4e9: readers judge by the batch's own threshold, no synthetic
            # record is waited for (as 544f4e9 read an offset without them).
            previous_threshold=_optional_int(raw.get("previous_threshold")),
            previous_batch_id=_optional_int(raw.get("previous_batch_id")),
            counters={str(k): int(v) for k, v in raw.get("counters", {}).items()},
            progress_wait_ms=int(raw.get("progress_wait_ms", 0)),  # unmeasured before 8404e02
            held=list(raw.get("held", [])),  # nothing held before 969c088
            tasks=None if version == 1 else _optional_int(raw.get("tasks")),
            version=version,
            kafka=_object(raw.get("kafka")),  # none before issue 31 (skipped if odd)
            planned_with=_object(raw.get("planned_with")),  # none before its finding 7
            alignment=_object(raw.get("alignment")),  # none before issue 43
        )

    def statuses(self) -> dict[str, str]:
        """Each partition's status as the aligner holds it, by channel ("topic:p")."""
        return {row[0]: row[1] for row in self.aligner["partitions"]}

    def channel_watermarks(self) -> dict[str, int]:
        """Each valve channel's watermark, by channel."""
        return {row[0]: int(row[1]) for row in self.aligner["valve"]["channels"]}

    def ranges(self) -> list[tuple[str, int, int, int]]:
        """The batch's non-empty ``[start, end)`` per partition, in topic and partition
        order (computed once: a plan asks several times, 20 ms at 10,000 partitions)."""
        return list(self._ranges)

    @functools.cached_property
    def ends_by_key(self) -> dict[TopicPartitionKey, int]:
        """The data end offsets by (topic, partition), once: an idle plan compares them."""
        return {(t, int(p)): end for t, ends in self.data.items() for p, end in ends.items()}

    @functools.cached_property
    def _ranges(self) -> tuple[tuple[str, int, int, int], ...]:
        return tuple(ranges(self.data_from, self.data))

    # ------------------------------------------------------------------ writing

    def encode(self) -> dict[str, Any]:
        """The offset as Spark logs it: version 2, whatever it was read from."""
        encoded: dict[str, Any] = {
            "v": OFFSET_VERSION,
            "plan_id": self.plan_id,
            "query": self.query,
            "watermark": self.watermark,
            "late_threshold": self.late_threshold,
            "previous_threshold": self.previous_threshold,
            "previous_batch_id": self.previous_batch_id,
            "latest_event_ms": self.latest_event_ms,
            "status": self.status,
            "counters": dict(self.counters),
            "progress_wait_ms": self.progress_wait_ms,
            "control": dict(self.control),
            "progress": dict(self.progress),
            "held": list(self.held),
            "tasks": self.tasks,
            "kafka": self.kafka,
            "planned_with": self.planned_with,
        }
        if self.alignment:
            encoded["alignment"] = self.alignment
        encoded.update(self._state)
        return encoded

    @functools.cached_property
    def _state(self) -> dict[str, Any]:
        """The version 2 form of the data positions and the aligner (computed once)."""
        return _encode_partitions(self.data, self.data_from, self.aligner)

    def same_state(self, other: SourceOffset) -> bool:
        """Whether the two hold the same data positions and aligner/valve state (in the
        canonical order version 2 writes, whatever order each was built in)."""
        return self._state == other._state


def ranges(begin: Offsets, end: Offsets) -> list[tuple[str, int, int, int]]:
    """Non-empty ``[start, end)`` per partition, in topic and partition order."""
    result = []
    for topic in sorted(end):
        for partition, finish in sorted(end[topic].items(), key=lambda kv: int(kv[0])):
            start = begin.get(topic, {}).get(partition, finish)
            if finish > start:
                result.append((topic, int(partition), int(start), int(finish)))
    return result


# ---------------------------------------------------------------------- version 2


def _split_channel(channel: str) -> TopicPartitionKey:
    # Kafka topic names have no ':' (legal characters: letters, digits, '.', '_', '-').
    topic, _, partition = channel.rpartition(":")
    return topic, int(partition)


def _encode_partitions(
    data: Offsets, data_from: Offsets, aligner: dict[str, Any]
) -> dict[str, Any]:
    # Rows by channel; a partition may have a data position, an aligner row, a valve
    # channel, or any of them (a deleted topic's partitions: no data position).
    aligner_rows = {row[0]: row for row in aligner["partitions"]}
    valve_rows = {row[0]: row for row in aligner["valve"]["channels"]}
    partitions: dict[str, set[int]] = {t: {int(p) for p in parts} for t, parts in data.items()}
    # Only the channels of partitions without a data position are split into theirs (a
    # third of the encoding's time at 1,000 partitions when every one was).
    named = {f"{t}:{p}" for t, parts in data.items() for p in parts}
    for name in (aligner_rows.keys() | valve_rows.keys()) - named:
        topic, partition = _split_channel(name)
        partitions.setdefault(topic, set()).add(partition)
    out_of_orderness = int(aligner["max_out_of_orderness_ms"])
    return {
        "aligner": {
            "max_out_of_orderness_ms": out_of_orderness,
            "consumer_idle_timeout_ms": aligner.get("consumer_idle_timeout_ms"),
            "counters": aligner["counters"],
            "valve": [aligner["valve"]["output_watermark"], aligner["valve"]["output_status"]],
        },
        "topics": {
            topic: _encode_topic(
                topic,
                sorted(partitions[topic]),
                ends_by_partition=data.get(topic, {}),
                starts_by_partition=data_from.get(topic, {}),
                aligner_rows=aligner_rows,
                valve_rows=valve_rows,
                out_of_orderness=out_of_orderness,
            )
            for topic in sorted(partitions)
        },
    }


def _encode_topic(
    topic: str,
    partitions: list[int],
    *,
    ends_by_partition: dict[str, int],
    starts_by_partition: dict[str, int],
    aligner_rows: dict[str, list[Any]],
    valve_rows: dict[str, list[Any]],
    out_of_orderness: int,
) -> dict[str, Any]:
    names = [f"{topic}:{p}" for p in partitions]
    rows = [aligner_rows.get(name) for name in names]
    channels = [valve_rows.get(name) for name in names]
    columns: dict[str, Any] = {}
    if partitions != list(range(len(partitions))):
        columns["partitions"] = partitions
    ends = [ends_by_partition.get(str(p)) for p in partitions]
    starts = [
        None if end is None else starts_by_partition.get(str(p), end)
        for p, end in zip(partitions, ends, strict=True)
    ]
    columns["end"] = ends
    _put(columns, "read", starts, ends, sign=-1)
    columns["status"] = "".join(_NONE if r is None else _STATUS_CHARS[r[1]] for r in rows)
    valve = "".join(_NONE if c is None else _STATUS_CHARS[c[2]] for c in channels)
    if valve != columns["status"]:
        columns["valve"] = valve
    aligned = "".join("1" if c is not None and c[3] else "0" for c in channels)
    if aligned != valve.replace("A", "1").replace("I", "0").replace("F", "0").replace("-", "0"):
        columns["aligned"] = aligned
    positions = [None if r is None else r[2] for r in rows]
    _put(columns, "position", positions, starts)
    _put(columns, "max_offset", [None if r is None else r[3] for r in rows], _minus_one(positions))
    events = [None if r is None else r[4] for r in rows]
    event_base = min((e for e in events if e is not None), default=None)
    if event_base is not None:
        columns["event_base"] = event_base
    _put(columns, "event", events, [event_base] * len(rows), default=None)
    watermarks = [None if c is None else c[1] for c in channels]
    _put(columns, "watermark", watermarks, _watermark_refs(events, out_of_orderness))
    epochs = [None if r is None else r[5] for r in rows]
    commonest = Counter(e for e in epochs if e is not None).most_common(1)
    epoch_base = commonest[0][0] if commonest else None
    if epoch_base is not None:
        columns["epoch_base"] = epoch_base
    _put(columns, "epoch", epochs, [epoch_base] * len(rows))
    _put(
        columns, "idle_offset", [None if r is None else r[6] for r in rows], positions, default=None
    )
    last_data = [None if r is None else r[7] for r in rows]
    last_data_base = min((t for t in last_data if t is not None), default=None)
    if last_data_base is not None:
        columns["last_data_base"] = last_data_base
    _put(columns, "last_data", last_data, [last_data_base] * len(rows), default=None)
    pending = {str(i): list(r[8]) for i, r in enumerate(rows) if r is not None and r[8]}
    if pending:
        columns["pending"] = pending
    return columns


def _decode_partitions(raw: Mapping[str, Any]) -> tuple[Offsets, Offsets, dict[str, Any]]:
    aligner = raw["aligner"]
    out_of_orderness = int(aligner["max_out_of_orderness_ms"])
    decoded = _Decoded()
    for topic, columns in raw["topics"].items():
        _decode_topic(topic, columns, out_of_orderness, decoded)
    output_watermark, output_status = aligner["valve"]
    snapshot = {
        "topic": None,
        "max_out_of_orderness_ms": out_of_orderness,
        "valve": {
            "output_watermark": output_watermark,
            "output_status": output_status,
            "channels": decoded.channel_rows,
        },
        "counters": aligner["counters"],
        "consumer_idle_timeout_ms": aligner.get("consumer_idle_timeout_ms"),
        "partitions": decoded.partition_rows,
    }
    return decoded.data, decoded.data_from, snapshot


@dataclass
class _Decoded:
    """What the offset's topics decode to: the offsets, and the aligner's rows."""

    data: Offsets = field(default_factory=dict)
    data_from: Offsets = field(default_factory=dict)
    partition_rows: list[list[Any]] = field(default_factory=list)
    channel_rows: list[list[Any]] = field(default_factory=list)


def _decode_topic(
    topic: str, columns: Mapping[str, Any], out_of_orderness: int, decoded: _Decoded
) -> None:
    ends: list[int | None] = columns["end"]
    count = len(ends)
    partitions = columns.get("partitions", list(range(count)))
    starts = _take(columns, "read", ends, count, sign=-1)
    positions = _take(columns, "position", starts, count)
    max_offsets = _take(columns, "max_offset", _minus_one(positions), count)
    events = _take(columns, "event", [columns.get("event_base")] * count, count, default=None)
    watermarks = _take(columns, "watermark", _watermark_refs(events, out_of_orderness), count)
    epochs = _take(columns, "epoch", [columns.get("epoch_base")] * count, count)
    idle = _take(columns, "idle_offset", positions, count, default=None)
    last_data_refs = [columns.get("last_data_base")] * count
    last_data = _take(columns, "last_data", last_data_refs, count, default=None)
    statuses: str = columns["status"]
    valve: str = columns.get("valve", statuses)
    aligned: str = columns.get("aligned", "".join("1" if s == "A" else "0" for s in valve))
    pending: dict[str, list[Any]] = columns.get("pending", {})
    if not len(partitions) == len(statuses) == len(valve) == len(aligned) == count:
        raise OffsetFormatError(f"offset columns of topic {topic!r} differ in length")
    for i, partition in enumerate(partitions):
        name = f"{topic}:{partition}"
        end, start = ends[i], starts[i]
        if end is not None and start is not None:
            decoded.data.setdefault(topic, {})[str(partition)] = end
            decoded.data_from.setdefault(topic, {})[str(partition)] = start
        if statuses[i] != _NONE:
            status = _STATUS_NAMES[statuses[i]]
            row = [name, status, positions[i], max_offsets[i], events[i], epochs[i], idle[i]]
            decoded.partition_rows.append([*row, last_data[i], pending.get(str(i), [])])
        if valve[i] != _NONE:
            decoded.channel_rows.append(
                [name, watermarks[i], _STATUS_NAMES[valve[i]], aligned[i] == "1"]
            )


# A column: values, the values they nearly always equal (their references), and the
# difference a value is written as. A null value is written as null; a value whose
# reference is null is written whole.


def _put(
    columns: dict[str, Any],
    name: str,
    values: list[int | None],
    references: list[int | None],
    *,
    sign: int = 1,
    default: int | None = 0,
) -> None:
    differences = [
        None if v is None else v if r is None else sign * (v - r)
        for v, r in zip(values, references, strict=True)
    ]
    if not differences or differences.count(differences[0]) == len(differences):
        if differences and differences[0] != default:
            columns[name] = differences[0]
        return
    columns[name] = differences


def _take(
    columns: Mapping[str, Any],
    name: str,
    references: list[int | None],
    count: int,
    *,
    sign: int = 1,
    default: int | None = 0,
) -> list[int | None]:
    written = columns.get(name, default)
    differences = written if isinstance(written, list) else [written] * count
    if len(differences) != count:
        raise OffsetFormatError(f"offset column {name!r}: {len(differences)} values, not {count}")
    return [
        None if d is None else int(d) if r is None else r + sign * int(d)
        for d, r in zip(differences, references, strict=True)
    ]


def _minus_one(values: list[int | None]) -> list[int | None]:
    return [None if v is None else v - 1 for v in values]


def _watermark_refs(events: list[int | None], out_of_orderness: int) -> list[int | None]:
    """A channel's watermark is nearly always its newest event time less the allowed
    out-of-orderness (rule 1 of semantics.md §3), or MIN before any event time."""
    return [MIN_WATERMARK if e is None else e - out_of_orderness for e in events]


# ---------------------------------------------------------------------- both versions
# (version 1's own rows: offset_v1.py)


def _latest_event_ms(raw: Mapping[str, Any], ahead_ms: int | None) -> int | None:
    """Version 1 of 0d924d2 logged its planning clock instead (``planned_at_ms``), its
    readers adding the option as the query ran (off, None: no bound)."""
    if raw.get("latest_event_ms") is None and raw.get("planned_at_ms") is not None:
        return None if ahead_ms is None else int(raw["planned_at_ms"]) + ahead_ms
    return _optional_int(raw.get("latest_event_ms"))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _object(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}
