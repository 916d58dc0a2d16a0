"""The HTTP server of both services: /metrics in the scraper's format, JSON views,
404 for anything else, 500 (and the server lives on) when a view fails."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from slackwater.http_server import MetricsServer


def _broken_view() -> dict[str, Any]:
    raise RuntimeError("view failed")


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("served", "A counter.", registry=registry).inc(3)
    running = MetricsServer(
        "127.0.0.1",
        0,
        registry,
        {"/status": lambda: {"ok": True}, "/broken": _broken_view},
        extra=lambda: (
            "# HELP direct_series A series written directly.\n"
            "# TYPE direct_series gauge\ndirect_series 1.0\n"
        ),
    ).start()
    yield running
    running.stop()


def _get(server: MetricsServer, path: str, accept: str = "") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def test_metrics_in_the_text_format_with_the_direct_series_after_the_registry(
    server: MetricsServer,
) -> None:
    code, content_type, body = _get(server, "/metrics")
    assert (code, content_type.split(";")[0]) == (200, "text/plain")
    assert "served_total 3.0\n" in body
    assert body.endswith("direct_series 1.0\n")


def test_openmetrics_keeps_its_eof_last(server: MetricsServer) -> None:
    code, content_type, body = _get(server, "/metrics", "application/openmetrics-text")
    assert (code, content_type.split(";")[0]) == (200, "application/openmetrics-text")
    assert body.endswith("direct_series 1.0\n# EOF\n")
    assert body.count("# EOF") == 1


def test_a_json_view(server: MetricsServer) -> None:
    assert _get(server, "/status?pretty=1") == (200, "application/json", '{\n  "ok": true\n}')
    assert json.loads(_get(server, "/status")[2]) == {"ok": True}


def test_an_unknown_path_is_404_naming_the_paths_there_are(server: MetricsServer) -> None:
    code, _, body = _get(server, "/nope")
    assert code == 404
    assert body == "not found; try /metrics, /status, /broken\n"


def test_a_failing_view_is_500_and_the_server_lives_on(server: MetricsServer) -> None:
    assert _get(server, "/broken")[0] == 500
    assert _get(server, "/status")[0] == 200
