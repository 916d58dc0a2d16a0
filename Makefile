# The two commands of the README: `make demo` and `make test`. Both start from
# nothing: they check Python 3.11, Java 17+ and Maven first, create .venv, install the
# project, and fetch Apache Kafka and Spark's Kafka source from Maven Central into .jars/
# (deploy/jars/pom.xml), once: nothing downloads at run time.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
JARS := .jars/.fetched
POMS := deploy/jars/pom.xml deploy/jars/kafka-broker/pom.xml deploy/jars/spark-kafka/pom.xml

.PHONY: demo test quick unit check-tools test-tools jars lint typecheck all-tests bench clean

demo: check-tools $(STAMP) $(JARS)
	$(BIN)/slackwater demo

test: check-tools test-tools $(STAMP) $(JARS) lint typecheck all-tests

# The pure tests alone (tests/pure: no broker, no Spark), in under a minute.
quick: check-tools $(STAMP)
	$(BIN)/python -m pytest tests/pure

# Its old name: the unit tests are the pure ones (it ran every test before issue 40).
unit: quick

jars: $(JARS)

$(JARS): $(POMS)
	rm -rf .jars
	mvn -q -B -f deploy/jars/pom.xml dependency:copy-dependencies
	@touch $(JARS)

check-tools:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else \
		"error: Python 3.11 is required, found " + sys.version.split()[0])'
	@$(PYTHON) slackwater/java_check.py

# promtool and prometheus (Debian's package) for the deploy tests.
test-tools:
	@command -v promtool >/dev/null || { \
		[ "$$(id -u)" = 0 ] || { echo "error: the deploy tests need Debian's prometheus package: run 'sudo apt-get install prometheus' once"; exit 1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# -qq: setuptools' editable-install notice is a screen of text; errors still show.
	$(BIN)/python -m pip install -qq -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check slackwater emitter spark_consumer demo tests bench examples
	$(BIN)/ruff format --check slackwater emitter spark_consumer demo tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

# Every test: tests/pure, tests/kafka, tests/spark, tests/cluster.
all-tests: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

bench: $(STAMP) $(JARS)
	$(BIN)/python -m bench.valve_bench
	$(BIN)/python -m bench.emitter_bench
	$(BIN)/python -m bench.source_planning_bench

clean:
	rm -rf $(VENV) .jars .pytest_cache .mypy_cache .ruff_cache .hypothesis build *.egg-info
