"""`slackwater consume`'s configuration: one frozen model; a bad setting is one error
naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from slackwater.settings import ConfigError, load_config
from spark_consumer.consume.config import ConsumerConfig
from spark_consumer.consume.job import aggregation_column, late_rule

BASE: dict[str, Any] = {
    "bootstrap_servers": "localhost:9092",
    "topics": ["orders"],
    "control_topic": "ctl",
    "window_ms": "10s",
    "max_out_of_orderness_ms": "2s",
    "output": "/tmp/out",
    "checkpoint": "/tmp/ck",
}


def _load(**changes: Any) -> ConsumerConfig:
    settings = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    return load_config(ConsumerConfig, settings, None)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"topics": None}, "topics"),
        ({"topic_pattern": "o.*"}, "topics"),
        ({"topics": None, "topic_pattern": "("}, "topic_pattern"),
        ({"topics": ["ctl"]}, "control_topic"),
        ({"session_gap_ms": "30s"}, "window_ms"),
        ({"window_ms": None}, "window_ms"),
        ({"window_ms": None, "session_gap_ms": "5s", "slide_ms": "1s"}, "slide_ms"),
        ({"slide_ms": "20s"}, "slide_ms"),
        ({"aggregations": ["median:amount"]}, "aggregations"),
        ({"aggregations": ["sum"]}, "aggregations"),
        ({"consumer_idle_timeout_ms": "soon"}, "consumer_idle_timeout_ms"),
        ({"state_store": "memory"}, "state_store"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_a_bad_setting_is_one_error_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"'{field}'"):
        _load(**changes)


def test_defaults_and_lists() -> None:
    config = _load(aggregations="sum:amount", consumer_idle_timeout_ms="off")
    assert config.topics == ("orders",)
    assert config.aggregations == ("sum:amount",)
    assert config.state_store == "rocksdb"
    assert config.consumer_idle_timeout_ms is None
    assert config.effective_late_output == "/tmp/out-late"
    assert _load(consumer_idle_timeout_ms="30s").consumer_idle_timeout_ms == 30_000


def test_the_late_rule_follows_the_windows() -> None:
    assert late_rule(_load()) == "window:10000:10000"
    assert late_rule(_load(slide_ms="5s")) == "window:10000:5000"
    assert late_rule(_load(window_ms=None, session_gap_ms="30s")) == "session:30000"


def test_aggregation_columns_are_function_and_field() -> None:
    assert aggregation_column("sum:amount") == "sum_amount"
    assert aggregation_column("approx_distinct:user.id") == "approx_distinct_user_id"


def test_production_settings_default_as_the_source_and_take_off() -> None:
    config = _load()
    assert config.fail_on_data_loss is True
    assert config.max_event_time_ahead_ms == 3_600_000
    changed = _load(fail_on_data_loss="false", max_event_time_ahead_ms="off")
    assert changed.fail_on_data_loss is False
    assert changed.max_event_time_ahead_ms is None
    assert _load(max_event_time_ahead_ms="2h").max_event_time_ahead_ms == 7_200_000
    with pytest.raises(ConfigError, match="'max_event_time_ahead_ms'"):
        _load(max_event_time_ahead_ms="soon")
    with pytest.raises(ConfigError, match="'fail_on_data_loss'"):
        _load(fail_on_data_loss="maybe")


def test_the_job_hands_its_settings_to_the_source_as_options() -> None:
    from spark_consumer.consume.job import source_options
    from spark_consumer.source.shared.options import SourceOptions

    parsed = SourceOptions.parse(
        source_options(_load(fail_on_data_loss="false", max_event_time_ahead_ms="off"))
    )
    assert (parsed.fail_on_data_loss, parsed.max_event_time_ahead_ms) == (False, None)
    parsed = SourceOptions.parse(source_options(_load(max_event_time_ahead_ms="2h")))
    assert (parsed.fail_on_data_loss, parsed.max_event_time_ahead_ms) == (True, 7_200_000)
    assert parsed.topics == ("orders",) and parsed.control_topic == "ctl"


def test_batch_size_and_watermark_alignment_reach_the_source() -> None:
    from spark_consumer.consume.job import source_options
    from spark_consumer.source.shared.options import SourceOptions

    default = SourceOptions.parse(source_options(_load()))
    assert (default.max_offsets_per_trigger, default.max_watermark_drift_ms) == (None, None)
    config = _load(max_offsets_per_trigger=500, max_watermark_drift_ms="5m")
    parsed = SourceOptions.parse(source_options(config))
    assert (parsed.max_offsets_per_trigger, parsed.max_watermark_drift_ms) == (500, 300_000)
    with pytest.raises(ConfigError, match="'max_offsets_per_trigger'"):
        _load(max_offsets_per_trigger=0)
    with pytest.raises(ConfigError, match="'max_watermark_drift_ms'"):
        _load(max_watermark_drift_ms="soon")
