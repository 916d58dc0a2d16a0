# The two commands of the README: `make demo` and `make test`. Both start from
# nothing: they create .venv, install the project, and check Java first.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check-tools lint typecheck unit bench clean

demo: check-tools $(STAMP)
	$(BIN)/slackwater demo

test: check-tools $(STAMP) lint typecheck unit

check-tools:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
		"error: Python 3.11 is required, found " + sys.version.split()[0])'
	@$(PYTHON) spark_consumer/java_check.py

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check emitter spark_consumer tests bench
	$(BIN)/ruff format --check emitter spark_consumer tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m bench.valve_bench
	$(BIN)/python -m bench.emitter_bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
