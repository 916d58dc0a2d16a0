"""A restart with options changed since the checkpoint (docs/source.md, "Options on
restart"; issue 31, finding 7). Each option is applied, refused with one line that names
it, or kept from the checkpoint and logged; never the checkpoint's value in silence:

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
consumerIdleTimeout are in its aligner state). An offset written before has none: its
restart compares nothing else, and reads the last batch by the option as it is now.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_consumer.source.shared.options import SourceError, SourceOptions, same_ends
from spark_consumer.source.wire.offset import SourceOffset

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


def compare(offset: SourceOffset, options: SourceOptions) -> Changes:
    """The options against those the checkpoint's ``offset`` was planned with: one line
    logged for each one changed, a ``SourceError`` for a change refused."""
    planned = offset.planned_with
    _refuse_another_progress_topic(planned, options)
    _refuse_past_a_bounded_run(planned, options)
    lines = [*_aligner_lines(offset.aligner, options), *_planned_lines(planned, options)]
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
            f"alone); markers of {was!r} already read still apply"
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
    return "none" if name is None else repr(name)
