"""The planner's process: Spark runs a query's ``SlackwaterStreamReader`` in a Python process
of its own (pyspark's ``python_streaming_source_runner``) and ends it with SIGTERM when the
query stops (``PythonWorkerFactory.stopWorker``: the signal, then the socket closed).

That runner calls the reader's ``stop`` only in a ``finally`` that SIGTERM's default action
never reaches: the source's ``stop`` never ran and its Kafka clients were never closed
(issue 31, finding 12). Here SIGTERM ends the planner's current call with ``StopAsked``,
wherever it waits (a Kafka request, the progress wait, the socket between calls), so the
runner's ``finally`` runs ``stop``; ``stop`` then ends the process (``end_if_asked``), with
no report to a socket Spark has closed and no traceback.

After its first whole plan the process's objects so far (pyspark's, py4j's, the Kafka
clients', the first plan's state) leave the garbage collector's generations
(``settled``): they live as long as the process, and a full collection scanning them
took 35-45 ms of a plan every few plans at 1,000 partitions (docs/performance.md).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from types import FrameType

# The module Spark runs a Python streaming source's planner as (``python -m``).
RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
# How long the source's stop may take once Spark asked the planner to end; then SIGALRM's
# default action ends the process anyway.
STOP_GRACE_S = 10


class StopAsked(BaseException):
    """Spark's SIGTERM, as an exception in the planner's current call. Not an Exception:
    no ``except Exception`` of the planner takes it for a Kafka error and plans on."""


class _Asked:
    stop = False
    settled = False


def in_planner_process() -> bool:
    """Whether this is the main thread of Spark's planner process (never an executor's
    Python worker, nor a test driving the reader in its own process)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == RUNNER and (
        threading.current_thread() is threading.main_thread()
    )


def stop_on_sigterm() -> None:
    """In Spark's planner process, SIGTERM from now on asks for the source's stop."""
    if in_planner_process():
        signal.signal(signal.SIGTERM, _ask)


def settled() -> None:
    """In Spark's planner process, once, after its first whole plan: the objects it holds
    so far are frozen out of the collector's generations (``gc.freeze``), after one full
    collection (garbage in a cycle then would stay for the process's life). Refcounting
    still frees any of them dropped later; only a cycle among them would stay."""
    if not _Asked.settled and in_planner_process():
        _Asked.settled = True
        gc.collect()
        gc.freeze()


def _ask(_signum: int, _frame: FrameType | None) -> None:
    if _Asked.stop:
        return  # Spark sends a second SIGTERM (PythonWorkerFactory.stop): the stop runs
    _Asked.stop = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.alarm(STOP_GRACE_S)
    raise StopAsked


def end_if_asked() -> None:
    """After the source's stop: the process ends here if Spark's SIGTERM asked for it."""
    if _Asked.stop:
        logging.shutdown()  # the stop's last lines reach every handler's file
        sys.stderr.flush()
        os._exit(0)
