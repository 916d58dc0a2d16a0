"""A small HTTP server for ``/metrics`` and JSON views, on one port, in a thread."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

JsonView = Callable[[], Any]
# A probe answers (healthy, text): 200 with the text when healthy, else 503.
Probe = Callable[[], tuple[bool, str]]


def exposition(
    registry: CollectorRegistry, accept: str, extra: Callable[[], str] | None = None
) -> tuple[bytes, str]:
    """The ``/metrics`` body and its content type: the registry in the format the
    scraper accepts, then ``extra`` (families written directly, identical in the text
    format and in OpenMetrics), before OpenMetrics' closing ``# EOF``."""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    if extra is None:
        return body, content_type
    more = extra().encode()
    eof = b"# EOF\n"
    if body.endswith(eof):
        return body[: -len(eof)] + more + eof, content_type
    return body + more, content_type


class MetricsServer:
    """Serves ``/metrics`` from a registry (and ``extra``) and each JSON view at its path."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        json_views: dict[str, JsonView],
        extra: Callable[[], str] | None = None,
        *,
        probes: dict[str, Probe] | None = None,
    ) -> None:
        handler = _handler_class(registry, json_views, extra, probes or {})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_class(
    registry: CollectorRegistry,
    json_views: dict[str, JsonView],
    extra: Callable[[], str] | None,
    probes: dict[str, Probe],
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/metrics":
                    body, content_type = exposition(registry, self.headers.get("Accept", ""), extra)
                    self._send(200, content_type, body)
                elif path in json_views:
                    document = json.dumps(json_views[path](), indent=2, default=str)
                    self._send(200, "application/json", document.encode())
                elif path in probes:  # Kubernetes' readiness and liveness probes
                    healthy, text = probes[path]()
                    self._send(200 if healthy else 503, "text/plain", text.encode())
                else:
                    paths = ", ".join(["/metrics", *json_views, *probes])
                    self._send(404, "text/plain", f"not found; try {paths}\n".encode())
            except Exception:  # the server must outlive any one bad scrape
                log.exception("error serving %s", path)
                self._send(500, "text/plain", b"internal error\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
