"""Kafka clients kept across the tasks a Python worker runs, as Spark's Kafka source keeps
a pool of consumers per executor: a reader task borrows a consumer and gives it back, and
reports its progress through one producer per settings.

Spark reuses a Python worker for task after task (``spark.python.worker.reuse``, on by
default), so this module's state lives as long as the worker. A client idle for
``IDLE_CLOSE_S`` is closed by the next borrow; a consumer whose task failed is closed at
once (it may be in any state), never given back.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Spark's Kafka source closes a pooled consumer idle for 5 minutes
# (spark.kafka.consumer.cache.timeout); a reader's next task usually comes within a trigger.
IDLE_CLOSE_S = 300.0

_Key = tuple[tuple[str, str], ...]
_lock = threading.Lock()
_idle_consumers: dict[_Key, list[tuple[Any, float]]] = {}
_producers: dict[_Key, tuple[Any, float]] = {}


def _key(config: dict[str, Any]) -> _Key:
    """Settings as a key. A callback (error_cb, made anew for every client) counts by
    the function it is, not by which closure object: one made the same way is the same."""
    return tuple(
        sorted(
            (name, f"{value.__module__}.{value.__qualname__}" if callable(value) else str(value))
            for name, value in config.items()
        )
    )


class NotMade(Exception):
    """librdkafka would not make a client of these settings (a file it cannot read, a
    setting it does not know): its KafkaError is ``args[0]``."""


def _made(factory: Any, config: dict[str, Any]) -> Any:
    from confluent_kafka import KafkaException

    try:
        return factory(config)
    except KafkaException as error:
        raise NotMade(error.args[0]) from error


@dataclass
class Lease:
    """A borrowed consumer; ``spoiled`` once it has seen an error event (such a consumer
    is closed, not given back: an error left in its queue would reach the next task)."""

    consumer: Any
    spoiled: bool = False


@contextlib.contextmanager
def borrowed_consumer(config: dict[str, Any]) -> Iterator[Lease]:
    """A consumer with these settings (one given back earlier, or a new one), with no
    partition assigned; given back unassigned when the block ends without an error.
    NotMade if librdkafka would not make one."""
    from confluent_kafka import Consumer, KafkaException

    key = _key(config)
    _close_idle()
    with _lock:
        idle = _idle_consumers.get(key)
        consumer = idle.pop()[0] if idle else None
    lease = Lease(consumer if consumer is not None else _made(Consumer, config))
    try:
        yield lease
    except BaseException:
        lease.consumer.close()
        raise
    try:
        lease.consumer.unassign()
    except KafkaException:
        lease.spoiled = True
    if lease.spoiled:
        lease.consumer.close()
        return
    with _lock:
        _idle_consumers.setdefault(key, []).append((lease.consumer, time.monotonic()))


def producer(config: dict[str, Any]) -> Any:
    """The producer for these settings, made on first use (NotMade if it would not be)."""
    from confluent_kafka import Producer

    key = _key(config)
    _close_idle()
    with _lock:
        made = _producers.get(key)
        client = made[0] if made is not None else _made(Producer, config)
        _producers[key] = (client, time.monotonic())
    return client


def drop_producer(config: dict[str, Any]) -> None:
    """Forgets the producer for these settings (one whose record failed may be in any
    state); the next report makes a new one."""
    with _lock:
        _producers.pop(_key(config), None)


def idle_clients() -> int:
    """How many clients this worker keeps (for tests and the bench)."""
    with _lock:
        return sum(len(idle) for idle in _idle_consumers.values()) + len(_producers)


def _close_idle(older_than_s: float = IDLE_CLOSE_S) -> None:
    now = time.monotonic()
    closing: list[Any] = []
    with _lock:
        for key, idle in list(_idle_consumers.items()):
            keep = [(c, since) for c, since in idle if now - since < older_than_s]
            closing += [c for c, since in idle if now - since >= older_than_s]
            if keep:
                _idle_consumers[key] = keep
            else:
                del _idle_consumers[key]
        for key, (_, since) in list(_producers.items()):
            if now - since >= older_than_s:
                del _producers[key]  # nothing in flight: every report flushed its record
    for consumer in closing:
        consumer.close()


@atexit.register
def close_all() -> None:
    """Every kept client closed (at the worker's exit, and by tests)."""
    _close_idle(older_than_s=-1.0)
