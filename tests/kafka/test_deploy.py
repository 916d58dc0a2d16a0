"""The deploy files: Compose schema, promtool, metric names, and a real Prometheus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slackwater.kafka_broker import KafkaBroker, free_port
from tests.conftest import TopicFactory
from tests.harness.emitter import (
    RunningEmitter,
    commit,
    produce_one,
    start_emitter,
)
from tests.harness.factories import PROMETHEUS, ROOT, deploy_metric_names, samples, wait_until

CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_file_validates_against_the_compose_specification() -> None:
    result = _check_compose(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_compose_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  kafka:\n    image: 5\n    restartt: always\n")
    assert _check_compose(broken).returncode != 0


def test_compose_services_use_the_deploy_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "topics", "producer", "emitter", "consumer", "prometheus", "grafana"} <= set(
        services
    )
    for name in ("emitter", "consumer", "prometheus", "kafka"):
        assert "healthcheck" in services[name], name
    mounts = " ".join(services["prometheus"]["volumes"] + services["grafana"]["volumes"])
    for path in (
        "./deploy/prometheus",
        "./deploy/grafana/provisioning",
        "./deploy/grafana/dashboards",
    ):
        assert path in mounts and (ROOT / path).exists()
    assert (ROOT / services["emitter"]["build"]["dockerfile"]).exists()


def test_promtool_accepts_the_config_and_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make test` installs Debian's prometheus package"
    for args in (
        ["check", "config", str(PROMETHEUS / "prometheus.yml")],
        ["check", "rules", str(PROMETHEUS / "alerts.yml")],
    ):
        result = subprocess.run(
            [promtool, *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_named_in_the_issue_exist() -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert {
        "SlackwaterPartitionIdleTooLong",
        "SlackwaterEmitterCannotReachBroker",
        "SlackwaterValveWatermarkStalled",
        "SlackwaterLateRecordsRising",
        "SlackwaterGroupLagSecondsHigh",
        "SlackwaterNoMarkersWhilePartitionsChange",
    } <= names


def _sample_names(text: str) -> set[str]:
    return {key.partition("{")[0] for key in samples(text)}


@pytest.fixture
def emitter_with_group(
    broker: KafkaBroker,
    new_topic: TopicFactory,
) -> Iterator[RunningEmitter]:
    from confluent_kafka import Consumer, TopicPartition

    topic, group = new_topic(partitions=2), f"deploy-{time.monotonic_ns()}"
    produce_one(broker.bootstrap_servers, topic, 0, count=2)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group})
    commit(consumer, [TopicPartition(topic, 0, 1), TopicPartition(topic, 1, 0)])
    consumer.close()
    running = start_emitter(
        bootstrap_servers=broker.bootstrap_servers,
        topics=[topic],
        control_topic=f"ctl-{topic}",
        group=group,
    )
    wait_until(
        lambda: (
            running.metric(
                "slackwater_emitter_group_lag_offsets", group=group, topic=topic, partition="0"
            )
            == 1
        ),
        10,
        "lag",
    )
    try:
        yield running
    finally:
        running.stop()


def test_every_emitter_metric_of_the_dashboard_and_rules_is_exported(
    emitter_with_group: RunningEmitter,
) -> None:
    exported = _sample_names(emitter_with_group.metrics_text())
    wanted = {n for n in deploy_metric_names() if n.startswith("slackwater_emitter_")}
    assert wanted and wanted <= exported, wanted - exported


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_real_prometheus_scrapes_a_running_emitter(
    emitter_with_group: RunningEmitter, tmp_path: Path
) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus missing: `make test` installs Debian's prometheus package"
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(PROMETHEUS / "alerts.yml")],
                "scrape_configs": [
                    {
                        "job_name": "slackwater-emitter",
                        "static_configs": [
                            {"targets": [f"127.0.0.1:{emitter_with_group.emitter.metrics_port}"]}
                        ],
                    }
                ],
            }
        )
    )
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:

        def scraped() -> list[dict[str, Any]] | None:
            try:
                return _query(port, "slackwater_emitter_broker_up") or None
            except OSError:
                return None

        result = wait_until(scraped, 60, "Prometheus to scrape the emitter")
        assert result[0]["value"][1] == "1"
        assert result[0]["metric"]["job"] == "slackwater-emitter"
        lag = _query(port, 'slackwater_emitter_group_lag_offsets{partition="0"}')
        assert lag and lag[0]["value"][1] == "1"
    finally:
        process.terminate()
        process.wait(30)
