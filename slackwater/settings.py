"""Loading a service's frozen pydantic config from YAML, ``SLACKWATER_*`` and flags.

Precedence, lowest first: field defaults < ``--config FILE.yaml`` <
``SLACKWATER_<FIELD>`` environment variables < command-line flags. Unknown
YAML keys are errors (the models forbid extra fields). Every problem becomes
one :class:`ConfigError` line naming the field, which the CLI turns into
exit code 2. Kafka's settings (:class:`KafkaSettings`) also come from a properties
file, ``kafka_config_file``, under ``kafka_config``'s entries, setting by setting.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from slackwater.properties import PropertiesError, read_properties

ENV_PREFIX = "SLACKWATER_"
# The exit code of every command for a configuration problem.
EXIT_CONFIG = 2

_Config = TypeVar("_Config", bound=BaseModel)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000}


class ConfigError(ValueError):
    """A configuration problem, one line, naming the field."""


def parse_duration_ms(value: object) -> int:
    """'500ms', '3s', '5m', '1h' (or a bare number of milliseconds) -> milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            return round(float(match.group(1)) * _UNIT_MS[match.group(2)])
        if value.strip().isdigit():
            return int(value)
    raise ValueError(f"not a duration like 500ms, 3s or 5m: {value!r}")


def parse_optional_duration_ms(value: object) -> int | None:
    """``off`` (or nothing) -> None, else a duration as parse_duration_ms reads it."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    return parse_duration_ms(value)


# In 'k=v,k2=v2' text, a comma separates two settings only where a setting's name and
# '=' follow it: a value may hold commas and '=' (a password, an SSL cipher list).
_NEXT_SETTING = re.compile(r",(?=\s*[A-Za-z0-9_.-]+=)")


def parse_key_values(items: object) -> dict[str, str]:
    """['k=v', ...] (one setting an item, as flags give them) or 'k=v,k2=v2' or a
    mapping -> {k: v} (librdkafka settings). An error never shows a value: the values
    are passwords as often as not."""
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    if isinstance(items, str):
        items = [part for part in _NEXT_SETTING.split(items) if part.strip()]
    if not isinstance(items, list | tuple):
        raise ValueError(f"expected KEY=VALUE pairs, got a {type(items).__name__}")
    result: dict[str, str] = {}
    for number, item in enumerate(items, 1):
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"expected KEY=VALUE, setting {number} of {len(items)} has no key before "
                "'=' (its text is not shown: it may hold a secret)"
            )
        result[key.strip()] = value.strip()
    return result


def load_config(
    model: type[_Config],
    cli_values: Mapping[str, Any],
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> _Config:
    """Merges the sources (see module docstring) and validates once."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        merged.update(_read_yaml(Path(config_file)))
    env = os.environ if environ is None else environ
    for field in model.model_fields:
        env_name = ENV_PREFIX + field.upper()
        if env_name in env:
            merged[field] = env[env_name]
    merged.update({k: v for k, v in cli_values.items() if v is not None})
    try:
        return model.model_validate(merged)
    except ValidationError as error:
        first = error.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        field = ".".join(str(part) for part in first["loc"])
        if not field:  # a rule across fields names its field first: "slide_ms: ..."
            field, _, message = message.partition(": ")
        extra = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise ConfigError(f"invalid config field '{field}': {message}{extra}") from None


def config_from_args(model: type[_Config], args: Any) -> _Config:
    """A service's config from its argparse namespace (flags that were given), its
    ``--config`` file and the environment; sets up logging at ``--log-level``."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    not_settings = ("config", "log_level", "run", "command")
    flags = {k: v for k, v in vars(args).items() if k not in not_settings}
    return load_config(model, flags, args.config)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        # PyYAML's message quotes the line it stopped at, which may hold a password.
        problem = getattr(error, "problem", None) or "not a YAML document"
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML: {problem}{where}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return {str(key).replace("-", "_"): value for key, value in document.items()}


# A config field in milliseconds that takes '500ms', '3s', '5m' or '1h' (or a number).
DurationMs = Annotated[int, BeforeValidator(parse_duration_ms), Field(gt=0)]
# Extra Kafka client settings: a mapping, or 'key=value,key=value' text.
KafkaConfig = Annotated[dict[str, str], BeforeValidator(parse_key_values)]


class KafkaSettings(BaseModel):
    """The Kafka client settings of every command that talks to Kafka: those of
    ``kafka_config_file`` (a Java-style properties file, slackwater/properties.py), then
    ``kafka_config``'s entries over them, setting by setting, as Kafka's tools put
    ``--producer-property`` over ``--producer.config``."""

    kafka_config: KafkaConfig = Field(default_factory=dict)
    kafka_config_file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _under_the_entries(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or not data.get("kafka_config_file"):
            return data
        try:
            from_file = read_properties(Path(str(data["kafka_config_file"])))
        except PropertiesError as error:
            raise ValueError(f"kafka_config_file: {error}") from None
        try:
            entries = parse_key_values(data.get("kafka_config") or {})
        except ValueError as error:
            raise ValueError(f"kafka_config: {error}") from None
        return {**data, "kafka_config": {**from_file, **entries}}
