"""Stopping a long-running service cleanly on SIGTERM (Kubernetes, Compose) or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import threading


def stop_on_signals(service: str) -> threading.Event:
    """An event that SIGTERM and SIGINT set (and log), for a service's main loop."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        logging.getLogger(service).info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
