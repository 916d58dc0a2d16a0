"""Emitter configuration: flags, YAML and SLACKWATER_* variables into one frozen model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pydantic
import pytest

from emitter.config import EmitterConfig
from slackwater.settings import ConfigError, load_config, parse_duration_ms, parse_key_values
from tests.harness.factories import run_cli

REQUIRED = {"bootstrap_servers": "localhost:9092", "topics": ["orders"], "control_topic": "ctl"}


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("3s", 3_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("1.5s", 1_500),
        ("250", 250),
        (42, 42),
    ],
)
def test_durations(text: str | int, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["soon", "5 days", "-3s", "", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(bad)


def test_defaults() -> None:
    config = load_config(EmitterConfig, REQUIRED, environ={})
    assert (config.idle_timeout_ms, config.poll_interval_ms, config.metrics_port) == (
        30_000,
        1_000,
        9464,
    )
    assert config.group is None and config.kafka_config == {}


def test_config_is_frozen() -> None:
    config = load_config(EmitterConfig, REQUIRED, environ={})
    with pytest.raises(pydantic.ValidationError):
        config.idle_timeout_ms = 1  # type: ignore[misc]


def test_precedence_yaml_then_env_then_flags(tmp_path: Path) -> None:
    yaml_file = tmp_path / "emitter.yaml"
    yaml_file.write_text(
        "bootstrap_servers: yaml:1\ntopics: [a, b]\ncontrol_topic: ctl\n"
        "idle_timeout_ms: 10s\npoll_interval_ms: 2s\ngroup: from-yaml\n"
        "kafka_config: {security.protocol: SSL}\n"
    )
    environ = {
        "SLACKWATER_POLL_INTERVAL_MS": "750ms",
        "SLACKWATER_GROUP": "from-env",
        "SLACKWATER_TOPICS": "x,y,z",
    }
    config = load_config(EmitterConfig, {"group": "from-flag", "topics": None}, yaml_file, environ)
    assert config.bootstrap_servers == "yaml:1"
    assert config.idle_timeout_ms == 10_000  # yaml
    assert config.poll_interval_ms == 750  # env beats yaml
    assert config.topics == ["x", "y", "z"]  # env beats yaml; a None flag is "not given"
    assert config.group == "from-flag"  # flag beats env
    assert config.kafka_config == {"security.protocol": "SSL"}


def test_unknown_yaml_key_is_an_error_naming_it(tmp_path: Path) -> None:
    yaml_file = tmp_path / "emitter.yaml"
    yaml_file.write_text("bootstrap_servers: a:1\ntopics: [a]\ncontrol_topic: c\nidle: 3s\n")
    with pytest.raises(ConfigError, match="'idle': Extra inputs are not permitted"):
        load_config(EmitterConfig, {}, yaml_file, {})


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({**REQUIRED, "topics": []}, "topics"),
        ({**REQUIRED, "topics": ["bad topic"]}, "topics"),
        ({**REQUIRED, "control_topic": "orders"}, "control_topic"),
        ({**REQUIRED, "bootstrap_servers": "nohostport"}, "bootstrap_servers"),
        ({**REQUIRED, "idle_timeout_ms": "0s"}, "idle_timeout_ms"),
        ({**REQUIRED, "metrics_port": 70000}, "metrics_port"),
        ({**REQUIRED, "kafka_config": ["novalue"]}, "kafka_config"),
        ({"topics": ["a"], "control_topic": "c"}, "bootstrap_servers"),
    ],
)
def test_bad_field_is_named(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid config field '{field}'"):
        load_config(EmitterConfig, values, environ={})


def _emit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("emit", *args)


def test_cli_bad_flag_exits_2_with_one_line_naming_it() -> None:
    result = _emit(
        "--bootstrap-servers",
        "localhost:9092",
        "--topic",
        "orders",
        "--control-topic",
        "ctl",
        "--idle-timeout",
        "soon",
    )
    assert result.returncode == 2
    # argparse's convention: the usage, then one line naming the flag and the problem.
    last = result.stderr.strip().splitlines()[-1]
    assert "argument --idle-timeout: not a duration" in last
    assert "Traceback" not in result.stderr


def test_cli_bad_yaml_value_exits_2_with_one_line_naming_the_field(tmp_path: Path) -> None:
    settings = tmp_path / "emitter.yaml"
    settings.write_text("bootstrap_servers: localhost:9092\ntopics: [orders]\n"
                        "control_topic: ctl\nidle_timeout_ms: soon\n")  # fmt: skip
    result = _emit("--config", str(settings))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "invalid config field 'idle_timeout_ms'" in result.stderr


def test_cli_missing_required_setting_exits_2() -> None:
    result = _emit("--topic", "orders", "--control-topic", "ctl")
    assert result.returncode == 2
    assert "invalid config field 'bootstrap_servers': Field required" in result.stderr


def test_cli_unreadable_config_file_exits_2(tmp_path: Path) -> None:
    result = _emit("--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "cannot read config file" in result.stderr


def test_a_kafka_setting_may_hold_commas_and_equals_signs() -> None:
    """A password is any text: from flags (one setting each) and from the environment's
    'k=v,k2=v2' text alike, a comma starts a new setting only before a name and '='."""
    secret = "pa,ss=w,rd"
    from_flags = load_config(
        EmitterConfig,
        {**REQUIRED, "kafka_config": ["security.protocol=SASL_SSL", f"sasl.password={secret}"]},
        environ={},
    )
    from_env = load_config(
        EmitterConfig,
        REQUIRED,
        environ={"SLACKWATER_KAFKA_CONFIG": "sasl.password=pa,security.protocol=SASL_SSL"},
    )
    assert from_flags.kafka_config == {"security.protocol": "SASL_SSL", "sasl.password": secret}
    assert from_env.kafka_config == {"sasl.password": "pa", "security.protocol": "SASL_SSL"}
    assert parse_key_values("sasl.password=a,b,ssl.cipher.suites=X,Y") == {
        "sasl.password": "a,b",
        "ssl.cipher.suites": "X,Y",
    }


def test_a_bad_kafka_setting_is_named_without_its_text() -> None:
    """The error line names the setting's place, never its text (half a password was
    printed before: "expected KEY=VALUE, got 'ss'")."""
    with pytest.raises(ConfigError) as raised:
        load_config(
            EmitterConfig, {**REQUIRED, "kafka_config": ["sasl.password=x", "hunter2"]}, environ={}
        )
    line = str(raised.value)
    assert line.startswith("invalid config field 'kafka_config': ")
    assert "setting 2 of 2" in line
    assert "hunter2" not in line
