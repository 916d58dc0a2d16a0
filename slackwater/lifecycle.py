"""Stopping a long-running service cleanly on SIGTERM (Kubernetes, Compose) or Ctrl-C."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType


def stop_on_signals(service: str) -> threading.Event:
    """An event that SIGTERM and SIGINT set (and log), for a service's main loop."""
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        logging.getLogger(service).info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


class Stop(Exception):
    """Raised by :func:`raise_stop` on SIGTERM, so that cleanup runs as on Ctrl-C."""


def raise_stop(signum: int, frame: FrameType | None) -> None:
    """A SIGTERM handler for foreground commands (``signal.signal(SIGTERM, raise_stop)``)."""
    raise Stop(signal.Signals(signum).name)
