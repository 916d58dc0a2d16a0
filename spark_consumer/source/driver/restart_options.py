"""A restart with options changed since the checkpoint (docs/source.md, "Options on
restart"). Each is applied, refused in one line naming it, or kept and logged:

    maxOutOfOrderness       applied: every newest event time is judged by the new bound
    consumerIdleTimeout     applied (its clocks start again at a restart anyway)
    eventTimeField          the batch planned before the restart is read by the field it
                            was planned with (its progress keys carry it); every batch
                            planned from then on by the new one
    watermarkDelay          applied: the synthetic rows and with_valve_watermark take it
    subscribe, -Pattern     applied: a topic added joins from its earliest offset; a topic
                            dropped follows failOnDataLoss (topic_partitions.drop_unsubscribed):
                            refused, or not read any more and FINISHED
    controlTopic            applied: the new one is read from its start
    progressTopic           refused: the last batch's progress is on the old one
    startingOffsets         kept from the checkpoint (a new query's option, as Spark's)
    endingOffsets           added: applied (this run ends the query); changed or left out
                            after a bounded run: refused (every record past its ends late)

Every other option is applied as the query runs (source.md's table). The offset keeps
what its batch was planned with (``planned_with``; maxOutOfOrderness and
consumerIdleTimeout are in its aligner state). An offset written before has none (issue
41, item 5): what the source can still know stands in for it (``known_planned``): the
topics its data positions name, no bounded run, and what its readers left on Kafka
(``find_old_readers``): the progress topic holding its query's records, the field their
keys spell, the control topic that progress topic is named after. What it cannot know
is said in one line, with the safe choice made.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, TopicPartition

from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.shared.options import SourceError, SourceOptions, same_ends
from spark_consumer.source.wire.offset import SourceOffset
from spark_consumer.source.wire.progress import synthetic_progress_key
from spark_consumer.source.wire.splits import batch_tasks

if TYPE_CHECKING:
    from spark_consumer.alignment import MarkerAligner

# Under the planner's logger, whose lines these are.
log = logging.getLogger("spark_consumer.source.driver.planner").getChild("restart_options")


@dataclass(frozen=True)
class Changes:
    """What the first plan after a restart does besides planning (``compare``)."""

    # Read the control topic from its start: the checkpoint's positions are another's.
    control_topic: bool = False
    # Plan even with nothing new: the aligner takes another bound (``apply``).
    bound: bool = False

    @property
    def pending(self) -> bool:
        """Whether the next plan must restore the state, even with nothing new."""
        return self.control_topic or self.bound


def planned_with(options: SourceOptions) -> dict[str, Any]:
    """What an offset keeps of the options its batch is planned with."""
    return {
        "subscribe": ",".join(options.topics) or None,
        "subscribePattern": options.topic_pattern,
        "controlTopic": options.control_topic,
        "progressTopic": options.progress_topic,
        "eventTimeField": options.event_time_field,
        "watermarkDelayMs": options.watermark_delay_ms,
        "startingOffsets": options.starting_offsets,
        "endingOffsets": options.ending_offsets,
    }


def apply(aligner: MarkerAligner, options: SourceOptions) -> None:
    """The aligner runs with the options as the query runs now, at every plan."""
    aligner.consumer_idle_timeout_ms = options.consumer_idle_timeout_ms
    if aligner.max_out_of_orderness_ms != options.max_out_of_orderness_ms:
        aligner.take_max_out_of_orderness(options.max_out_of_orderness_ms)


def compare(offset: SourceOffset, options: SourceOptions, find: Finder | None = None) -> Changes:
    """The options against those the checkpoint's ``offset`` was planned with: one line
    logged for each one changed, a ``SourceError`` for a change refused. An offset written
    before ``planned_with`` gets what the source can know of it (``known_planned``, from
    what ``find``, by default ``find_old_readers``, finds its readers left on Kafka), kept
    in that offset: the planner keeps the object by its plan id, so the wait for its
    batch's progress, and a replay of that batch, read by the field its readers' keys
    spell (splits.event_time_field), not by one they never wrote."""
    guessed: list[str] = []
    if not offset.planned_with:
        known, guessed = known_planned(offset, options, (find or find_old_readers)(offset, options))
        offset.planned_with.update(known)
    planned = offset.planned_with
    _refuse_another_progress_topic(planned, options)
    _refuse_past_a_bounded_run(planned, options)
    lines = [*_aligner_lines(offset.aligner, options), *_planned_lines(planned, options)]
    lines += guessed
    for line in lines:
        log.warning("%s", line)
    return Changes(
        control_topic="controlTopic" in planned
        and planned["controlTopic"] != options.control_topic,
        bound=offset.aligner["max_out_of_orderness_ms"] != options.max_out_of_orderness_ms,
    )


def _refuse_another_progress_topic(planned: dict[str, Any], options: SourceOptions) -> None:
    was = planned.get("progressTopic", options.progress_topic)
    if was == options.progress_topic:
        return
    named = "" if options.progress_topic_name else " (from controlTopic)"
    raise SourceError(
        f"option 'progressTopic' is {options.progress_topic!r}{named}, the checkpoint's "
        f"{was!r}: a restart cannot move it, as the last batch's progress is there; set "
        f"progressTopic to {was!r} to keep it, or start the query on a new checkpointLocation"
    )


def _refuse_past_a_bounded_run(planned: dict[str, Any], options: SourceOptions) -> None:
    """A bounded run's checkpoint goes on only to the same ends: past them, Spark's
    watermark (which never goes back) would make every record late."""
    was = planned.get("endingOffsets")
    if was is None or same_ends(was, options.ending_offsets):
        return  # the same ends, however spelt (an explicit -1 or a partition left out)
    now = "left out" if options.ending_offsets is None else repr(options.ending_offsets)
    raise SourceError(
        f"option 'endingOffsets' is {now}, the checkpoint's {was!r}: this checkpoint is a "
        "bounded run's, whose windows close at its ends (Spark's watermark never goes "
        "back), so every record past them would be late; set endingOffsets to "
        f"{was!r} to finish that run, or start the query on a new checkpointLocation"
    )


def _line(option: str, now: str, was: str, what: str) -> str:
    return f"option {option!r} is {now}, the checkpoint's {was}: {what}"


def _ms(value: int | None) -> str:
    return "off" if value is None else f"{value} ms"


def _aligner_lines(aligner: dict[str, Any], options: SourceOptions) -> list[str]:
    lines = []
    was, bound = int(aligner["max_out_of_orderness_ms"]), options.max_out_of_orderness_ms
    if bound > was:
        what = (
            "applied from this restart on to every event time read; a watermark never goes "
            "back, so a partition's stays where it is until its newest event time less "
            f"{bound} ms passes it"
        )
        lines.append(_line("maxOutOfOrderness", _ms(bound), _ms(was), what))
    elif bound < was:
        what = (
            "applied from this restart on: every partition's watermark is its newest event "
            f"time read less {bound} ms (records between the old and the new watermark are "
            "late)"
        )
        lines.append(_line("maxOutOfOrderness", _ms(bound), _ms(was), what))
    idle_was, idle = aligner.get("consumer_idle_timeout_ms"), options.consumer_idle_timeout_ms
    if idle != idle_was:
        what = (
            "applied from this restart on (its clocks start again at a restart); a "
            "partition it made IDLE stays so until its next record"
        )
        lines.append(_line("consumerIdleTimeout", _ms(idle), _ms(idle_was), what))
    return lines


def _planned_lines(planned: dict[str, Any], options: SourceOptions) -> list[str]:
    now = planned_with(options)
    changed = [key for key in now if key in planned and planned[key] != now[key]]
    lines = []
    if "eventTimeField" in changed:
        was, field = _field(planned["eventTimeField"]), _field(options.event_time_field)
        what = (
            f"the batch planned before the restart is read by {was} (should Spark run it "
            f"again), every batch planned from now on by {field}; a watermark never goes "
            f"back, so records whose event time by {field} is below it are late"
        )
        lines.append(_line("eventTimeField", field, was, what))
    if "watermarkDelayMs" in changed:
        what = (
            "applied from this restart on (every batch's synthetic row, and "
            "with_valve_watermark through the event_time column's metadata)"
        )
        was = _ms(planned["watermarkDelayMs"])
        lines.append(_line("watermarkDelay", _ms(options.watermark_delay_ms), was, what))
    lines += _subscription_lines(planned, now)
    if "controlTopic" in changed:
        lines.append(_control_topic_line(planned["controlTopic"], options.control_topic))
    if "endingOffsets" in changed and planned["endingOffsets"] is None:
        # added (a change or a removal was refused; the same ends spelt otherwise, kept)
        what = "applied: this run reads to those ends, every partition FINISHED there"
        lines.append(_line("endingOffsets", repr(options.ending_offsets), "none", what))
    if "startingOffsets" in changed:
        what = (
            "kept from the checkpoint (it applies to a new query alone, as in Spark's Kafka "
            "source): this one goes on from its checkpoint's positions"
        )
        was = planned["startingOffsets"]
        lines.append(_line("startingOffsets", options.starting_offsets, was, what))
    return lines


def _field(name: str | None) -> str:
    return "the Kafka timestamp" if name is None else repr(name)


def _subscription_lines(planned: dict[str, Any], now: dict[str, Any]) -> list[str]:
    if "subscribe" not in planned or "subscribePattern" not in planned:
        return []
    (was_option, was_text, was_names), (option, text, names) = map(_subscription, (planned, now))
    if (was_option, was_names) == (option, names):
        return []
    what = (
        "applied from this restart on: the partitions of topics it adds join from their "
        "earliest offsets; a topic it drops is no longer read and counts as FINISHED with "
        "failOnDataLoss=false, and stops the query otherwise"
    )
    was_shown = repr(was_text) if was_option == option else f"{was_option} {was_text!r}"
    return [_line(option, repr(text), was_shown, what)]


def _subscription(planned: dict[str, Any]) -> tuple[str, str, frozenset[str]]:
    """(option, its text, the topics it names) of a subscription; the same topics in
    another order are the same subscription."""
    if planned["subscribePattern"] is not None:
        pattern = planned["subscribePattern"]
        return "subscribePattern", pattern, frozenset([pattern])
    text = planned["subscribe"] or ""
    return "subscribe", text, frozenset(text.split(","))


def _control_topic_line(was: str | None, now: str | None) -> str:
    if now is None:
        what = (
            "applied from this restart on: no markers are read (the valve works on data "
            f"alone); markers of {_topic(was)} already read still apply"
        )
    elif was is None:
        what = f"applied from this restart on: {now!r} is read from its start"
    else:
        what = (
            f"applied from this restart on: {now!r} is read from its start, its emitter's "
            "epochs taken as they come"
        )
    return _line("controlTopic", _topic(now), _topic(was), what)


def _topic(name: str | None) -> str:
    return "none" if name is None else name if name == _UNNAMED else repr(name)


# ------------------------------------------------------------ a checkpoint written before

# What the lines about an offset without ``planned_with`` say of it.
_OLD = "this checkpoint, written before offsets recorded the options they were planned with,"
# The control topic such an offset read, when nothing names it.
_UNNAMED = "a control topic it does not name"


@dataclass(frozen=True)
class OldReaders:
    """What the readers of a checkpoint written before ``planned_with`` left on Kafka
    (``find_old_readers``); None: not found."""

    # The topic holding its query's progress records (around the checkpoint's positions).
    progress_topic: str | None = None
    # The field their keys spell: the last batch's, else its query's newest ("timestamp":
    # the Kafka timestamp; a field of that name spells the same).
    field: str | None = None
    # The topic the broker lists that the progress topic is named after (<it>.progress,
    # the source's default): the control topic the checkpoint read.
    control_topic: str | None = None


Finder = Callable[[SourceOffset, SourceOptions], OldReaders]


def known_planned(
    offset: SourceOffset, options: SourceOptions, found: OldReaders
) -> tuple[dict[str, Any], list[str]]:
    """What an offset written before ``planned_with`` was planned with, as far as the
    source can know (as ``planned_with`` says it), and one line for each option it
    cannot know whose change matters, with the choice made; the others as now."""
    known = {**planned_with(options), **_read_subscription(offset, options)}
    known["endingOffsets"] = None
    guessed = []
    if found.progress_topic is not None:
        known["progressTopic"] = found.progress_topic
    else:
        guessed.append(_unknown_progress_topic(options))
    if found.field is not None:
        known["eventTimeField"] = _spelt(found.field, options.event_time_field)
    else:
        guessed.append(_unknown_field(options))
    known["controlTopic"], line = _read_control(offset, options, found)
    return known, guessed + ([line] if line else [])


def _read_subscription(offset: SourceOffset, options: SourceOptions) -> dict[str, Any]:
    """The subscription as the data positions name it: the topics read; the pattern as
    it is now if it takes every one of them (a topic it adds joins as any of a pattern's)."""
    read = sorted(offset.data)
    if options.topic_pattern is not None and all(options.subscribes(t) for t in read):
        return {"subscribe": None, "subscribePattern": options.topic_pattern}
    return {"subscribe": ",".join(read) or None, "subscribePattern": None}


def _spelt(key_field: str, now: str | None) -> str | None:
    """The eventTimeField a progress key's field stands for."""
    if key_field == (now or "timestamp"):
        return now  # the same key: the same field (or the Kafka timestamp)
    return None if key_field == "timestamp" else key_field


def _read_control(
    offset: SourceOffset, options: SourceOptions, found: OldReaders
) -> tuple[str | None, str | None]:
    """The control topic the offset's control positions are on, and the line when the
    source cannot know it: none without positions; the one its progress topic is named
    after; else taken as the one now, positions kept (reading a topic again from its
    start would apply markers again that data has not overtaken, and move a watermark)."""
    if not offset.control:
        return None, None
    if found.control_topic is not None:
        return found.control_topic, None
    now = options.control_topic
    if now is None:
        return _UNNAMED, None  # read before, none now: applied whatever it was
    what = (
        f"{_OLD} does not name the control topic its positions are on, nor does its progress "
        f"topic (not found, or not named after a topic the broker lists): they are taken as "
        f"{now!r}'s; if the query read another control topic, restart once with that one, "
        f"then change it, or the markers of {now!r} below them are never read"
    )
    return now, f"option 'controlTopic' is {now!r}: {what}"


def _unknown_field(options: SourceOptions) -> str:
    field = _field(options.event_time_field)
    what = (
        f"{_OLD} does not say the field its batches were read by, and no progress record of "
        f"its query was found to say it: every batch from this restart on is read by "
        f"{field} (the one planned before it too, should Spark run it again); a watermark "
        "never goes back, so if it is another field than before, records whose event time "
        "by it is below the watermark are late"
    )
    return f"option 'eventTimeField' is {field}: {what}"


def _unknown_progress_topic(options: SourceOptions) -> str:
    topic = options.progress_topic
    named = "" if options.progress_topic_name else " (from controlTopic)"
    what = (
        f"{_OLD} does not name its progress topic, and no record of its query is on {topic!r} "
        "or another topic named *.progress: its last batch's progress is waited for on "
        f"{topic!r} (read as unknown if gone, which can hold the watermark back, never make "
        "a row late); if the query ran with another progress topic, set progressTopic to it"
    )
    return f"option 'progressTopic' is {topic!r}{named}: {what}"


# What its readers left, read once at the restart: records per partition before the
# checkpoint's progress position (its planner read its query's earlier batches' there)
# and after it (its last batch's readers wrote there).
LOOK_BACK, LOOK_AHEAD = 1_000, 10_000
_FIELD = "\x00"  # stands for the field in a key made to find the field


def find_old_readers(offset: SourceOffset, options: SourceOptions) -> OldReaders:
    """Where the records of the offset's query are: on the progress topic as it is now,
    else on another named *.progress (the default names), asked until the broker
    answers; a topic that refuses or does not answer is passed over."""
    client, keys = PlannerClient(options), _OldKeys(offset, options)
    while True:
        # Not the planner's wrapper: a refusal of another query's topic ends nothing.
        consumer = client.consumer("restart").consumer
        try:
            listed = client.admin.list_topics(timeout=options.request_timeout_s).topics
            others = _nearest_first(options.progress_topic, listed)
            for topic in dict.fromkeys([options.progress_topic, *others]):
                if topic not in listed:
                    continue
                try:
                    partitions = sorted(listed[topic].partitions)
                    seen = _read_around(client, consumer, (topic, partitions), offset, keys)
                except (SourceError, KafkaException) as error:  # refused, or no answer:
                    log.info("passed over %s: %s", topic, error)  # (never the whole scan)
                    continue
                if seen.seen:
                    return OldReaders(
                        topic, seen.exact or seen.newest[1], _named(topic, listed, options)
                    )
            return OldReaders()
        except KafkaException as error:
            client.unreachable(error)  # said; a failed authentication ends the query
            time.sleep(1.0)
        finally:
            consumer.close()


def _named(topic: str, listed: Any, options: SourceOptions) -> str | None:
    """The control topic a progress topic is named after (``<it>.progress``), unless
    <it> is a data topic (a progressTopic given by hand after it, not a control's)."""
    named = topic.removesuffix(".progress")
    data = options.subscribes(named)
    return named if named != topic and named in listed and not data else None


def _nearest_first(mine: str, listed: Any) -> list[str]:
    """The *.progress topics, those sharing the longest prefix with ``mine`` first."""
    near = [t for t in listed if t.endswith(".progress")]
    return sorted(near, key=lambda t: (-len(os.path.commonprefix([t, mine])), t))  # noqa: RUF071


@dataclass
class _Seen:
    """What the records read so far show of the offset's query."""

    seen: bool = False
    exact: str | None = None  # the field its last batch's keys spell
    newest: tuple[int, str | None] = (-1, None)  # (time, field) of its query's newest key


class _OldKeys:
    """How the old readers' records are told: the last batch's keys whatever field they
    spell (its tasks', as ``batch_tasks`` makes them again), its synthetic row's, and any
    key of its query (its identity leads its keys)."""

    def __init__(self, offset: SourceOffset, options: SourceOptions) -> None:
        tasks, _ = batch_tasks(options, offset)
        self.last = [task.progress_key(_FIELD).split(_FIELD) for task in tasks]
        self.synthetic = synthetic_progress_key(offset.plan_id) if offset.plan_id else None
        self.query = f"{offset.query}/" if offset.query else None

    def take(self, key: str, stamp: int, seen: _Seen) -> None:
        for prefix, suffix in self.last:
            inside = len(key) - len(prefix) - len(suffix)
            if inside > 0 and key.startswith(prefix) and key.endswith(suffix):
                seen.seen, seen.exact = True, key[len(prefix) : len(prefix) + inside]
                return
        if self.query is not None and key.startswith(self.query):
            seen.seen = True
            if stamp >= seen.newest[0]:
                seen.newest = (stamp, _field_in(key[len(self.query) :]) or seen.newest[1])
        seen.seen = seen.seen or key == self.synthetic


def _field_in(key: str) -> str | None:
    """The field in a key of a query (after its identity): ``task:<topic>:<p>:<a>-<b>+<n>:
    <threshold>:<field>:<digest>``, or version 1's ``<topic>:<p>:<a>-<b>:<threshold>:
    <field>``; a topic has no ':', a field may."""
    parts = key.removeprefix("task:").split(":", 4)
    if len(parts) < 5:
        return None
    return parts[4].rsplit(":", 1)[0] if key.startswith("task:") else parts[4]


def _read_around(
    client: PlannerClient,
    consumer: Any,
    listed: tuple[str, list[int]],
    offset: SourceOffset,
    keys: _OldKeys,
) -> _Seen:
    """The records of a topic (``listed``: name, partitions) around the offset's progress
    position (LOOK_BACK before, LOOK_AHEAD after), until the last batch's key is found."""
    topic, partitions = listed
    asked = [(topic, p) for p in partitions]
    low, high = client.list_offsets(asked, "earliest"), client.list_offsets(asked, "latest")
    windows = {}
    for key in set(low) & set(high):
        middle = max(low[key], offset.progress.get(str(key[1]), low[key]))
        windows[key[1]] = (max(low[key], middle - LOOK_BACK), min(high[key], middle + LOOK_AHEAD))
    reading = {p: end for p, (start, end) in windows.items() if start < end}
    seen = _Seen()
    consumer.assign([TopicPartition(topic, p, windows[p][0]) for p in reading])
    deadline = time.monotonic() + client.options.request_timeout_s
    while reading and seen.exact is None and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=1000, timeout=0.2):
            partition, error = message.partition(), message.error()
            if partition not in reading:
                continue
            if error is not None or message.offset() + 1 >= reading[partition]:
                reading.pop(partition)  # its window's end, the log's, or not ours to read
            if error is None:
                keys.take(
                    (message.key() or b"").decode(errors="replace"), message.timestamp()[1], seen
                )
    consumer.unassign()
    return seen
