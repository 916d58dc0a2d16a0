# The two commands of the README: `make demo` and `make test`. Both start from
# nothing: they create .venv, install the project, and check Java first.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check-tools test-tools lint typecheck unit bench clean

demo: check-tools $(STAMP)
	$(BIN)/slackwater demo

test: check-tools test-tools $(STAMP) lint typecheck unit

check-tools:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
		"error: Python 3.11 is required, found " + sys.version.split()[0])'
	@$(PYTHON) spark_consumer/java_check.py

# promtool and prometheus (Debian's package) for the deploy tests.
test-tools:
	@command -v promtool >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "error: the deploy tests need Debian's prometheus package: run 'sudo apt-get install prometheus' once"; exit 1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

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
