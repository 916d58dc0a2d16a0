"""The source's options: each bad value is one SourceError naming the option."""

from __future__ import annotations

import re
from typing import Any

import pytest

from spark_consumer.source.shared.late_rows import LATE_ONLY, LateRule
from spark_consumer.source.shared.options import (
    WATERMARK_DELAY_MS,
    SourceError,
    SourceOptions,
    same_ends,
)
from spark_consumer.source.stream import stream_options
from spark_consumer.source.wire.splits import TaskPartition, late_events_watermark

BASE = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "orders"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "orders"}, "'kafka.bootstrap.servers' is required"),
        ({**BASE, "subscribePattern": "o.*"}, "exactly one of"),
        ({"kafka.bootstrap.servers": "x:1"}, "exactly one of"),
        ({**BASE, "subscribe": "", "subscribePattern": "("}, "'subscribePattern' is not a regex"),
        ({**BASE, "startingOffsets": "middle"}, "'startingOffsets' must be earliest or latest"),
        ({**BASE, "maxOutOfOrderness": "soon"}, "'maxOutOfOrderness'"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a positive"),
        ({**BASE, "watermarkDelay": "abc"}, "'watermarkDelay'"),
        ({**BASE, "watermarkDelay": "0s"}, "'watermarkDelay' must be between"),
        ({**BASE, "watermarkDelay": str(WATERMARK_DELAY_MS + 1)}, "'watermarkDelay' must be"),
    ],
)
def test_a_bad_option_is_one_error_naming_it(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceError, match=message):
        SourceOptions.parse(options)


def test_watermark_delay_defaults_to_the_delay_that_makes_the_valve_alone_set_the_watermark() -> (
    None
):
    assert SourceOptions.parse(BASE).watermark_delay_ms == WATERMARK_DELAY_MS
    one_hour = SourceOptions.parse({**BASE, "watermarkDelay": "1h"})
    assert one_hour.watermark_delay_ms == 3_600_000
    # V + D must stay a Spark timestamp: a smaller D lets V go higher.
    assert one_hour.max_planned_watermark_ms > SourceOptions.parse(BASE).max_planned_watermark_ms


def _split(previous_batch_id: int | None) -> TaskPartition:
    return TaskPartition((("t", 0, 0, 10),), 41_000, 39_000, previous_batch_id)


def test_late_rows_are_judged_by_the_watermark_of_the_batch_spark_ran_just_before() -> None:
    # SPARK-40925: late input is judged by the previous Spark batch's watermark.
    assert late_events_watermark(_split(3), batch_id=4) == 39_000  # D(k) right after D(k-1)
    assert late_events_watermark(_split(3), batch_id=5) == 41_000  # a no-data batch between
    assert late_events_watermark(_split(3), batch_id=9) == 41_000
    assert late_events_watermark(_split(None), batch_id=4) == 41_000  # unknown: as before
    assert late_events_watermark(_split(3), batch_id=None) == 41_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({**BASE, "maxEventTimeAhead": "soon"}, "'maxEventTimeAhead'"),
        ({**BASE, "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({**BASE, "progressRetention": "1s"}, "'progressRetention' must be at least 1m"),
        ({**BASE, "progressRetention": "forever"}, "'progressRetention'"),
    ],
)
def test_a_bad_production_option_is_one_error_naming_it(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(SourceError, match=message):
        SourceOptions.parse(options)


def test_production_options_default_as_kafka_and_spark_do() -> None:
    default = SourceOptions.parse(BASE)
    assert default.max_event_time_ahead_ms == 3_600_000  # log.message.timestamp.after.max.ms
    assert default.fail_on_data_loss is True  # Spark's Kafka source's default
    assert default.progress_retention_ms == 7 * 86_400_000
    changed = SourceOptions.parse(
        {**BASE, "maxEventTimeAhead": "off", "FAILONDATALOSS": "False", "progressRetention": "48h"}
    )
    assert changed.max_event_time_ahead_ms is None
    assert changed.fail_on_data_loss is False
    assert changed.progress_retention_ms == 2 * 86_400_000


def test_every_keyword_of_read_stream_is_the_source_option_it_names() -> None:
    given = stream_options(
        bootstrap_servers="kafka:9092",
        topic_pattern="orders-.*",
        control_topic="slackwater.control",
        max_out_of_orderness="2s",
        event_time_field="ts",
        starting_offsets="latest",
        kafka_config={"security.protocol": "SASL_SSL"},
        watermark_delay="1h",
        late_output="/late",
        late_rule="window:10000:10000",
        fail_on_data_loss=False,
        max_event_time_ahead="off",
        consumer_idle_timeout="30s",
    )
    parsed = SourceOptions.parse(given)
    assert (parsed.topics, parsed.topic_pattern, parsed.control_topic) == (
        (),
        "orders-.*",
        "slackwater.control",
    )
    assert (parsed.max_out_of_orderness_ms, parsed.event_time_field) == (2_000, "ts")
    assert (parsed.starting_offsets, parsed.kafka_config) == (
        "latest",
        {"security.protocol": "SASL_SSL"},
    )
    assert (parsed.watermark_delay_ms, parsed.late_output) == (3_600_000, "/late")
    assert (parsed.fail_on_data_loss, parsed.max_event_time_ahead_ms) == (False, None)
    assert parsed.consumer_idle_timeout_ms == 30_000
    assert parsed.late_rule == LateRule.parse("window:10000:10000") != LATE_ONLY
    # None leaves an option to its default.
    defaults = SourceOptions.parse(stream_options(bootstrap_servers="b", topics=["t"]))
    assert defaults.fail_on_data_loss is True and defaults.control_topic is None


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"bootstrap_servers": "b", "topic": ["t"]}, "unknown keyword(s) topic"),
        ({"topics": ["t"]}, "no bootstrap_servers"),
    ],
)
def test_read_streams_keywords_are_checked_as_a_functions_are(
    keywords: dict[str, Any], message: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(f"read_stream(): {message}")):
        stream_options(**keywords)


def test_an_empty_keyword_is_given_to_the_source_to_judge_not_taken_as_its_default() -> None:
    given = stream_options(bootstrap_servers="b", topics=["t"], max_out_of_orderness="")
    with pytest.raises(SourceError, match="maxOutOfOrderness"):
        SourceOptions.parse(given)


@pytest.mark.parametrize(
    ("was", "now", "same"),
    [
        ('{"t":{"0":30,"1":-1}}', '{"t":{"0":30}}', True),  # -1: its log end, as left out
        ('{"t":{"0":-1,"1":-1}}', "latest", True),
        ('{"t":{"0":30}}', '{"t":{"0":31}}', False),
        ('{"t":{"0":30}}', '{"t":{"0":30},"u":{"0":1}}', False),
        ("latest", None, False),  # a bounded run against none
        (None, None, True),
    ],
)
def test_ending_offsets_name_the_same_ends_however_spelt(
    was: str | None, now: str | None, same: bool
) -> None:
    """Issue 41, finding 4: a partition at -1 ends where one left out does."""
    assert same_ends(was, now) is same
    assert same_ends(now, was) is same
