"""Every client is made one way: the user's settings, our logging, the bootstrap servers,
then what the client's job needs, in that order of precedence."""

from __future__ import annotations

import logging

from slackwater.kafka_clients import client_settings


def test_the_jobs_settings_win_over_the_users_and_the_users_over_nothing() -> None:
    settings = client_settings(
        "control-writer",
        "broker:9092",
        user={"acks": "1", "security.protocol": "SSL", "bootstrap.servers": "ignored:1"},
        ours={"acks": "all"},
    )
    assert settings["acks"] == "all"  # a marker is acknowledged by all replicas
    assert settings["security.protocol"] == "SSL"  # the user's own settings pass
    assert settings["bootstrap.servers"] == "broker:9092"


def test_librdkafka_logs_through_python_logging_under_the_clients_name() -> None:
    settings = client_settings("admin", "broker:9092")
    assert isinstance(settings["logger"], logging.Logger)
    assert settings["logger"].name.endswith(".admin")
    assert callable(settings["error_cb"])
