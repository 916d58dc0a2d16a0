"""`slackwater consume`'s configuration: one frozen model; a bad setting is one error
naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from slackwater.settings import ConfigError, load_config
from spark_consumer.config import ConsumerConfig
from spark_consumer.consume_job import aggregation_column, late_rule

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
