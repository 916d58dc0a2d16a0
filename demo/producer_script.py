"""The demo's scripted producer: what ``slackwater demo`` writes, and ``demo-producer``.

Script, as shares of ``--duration`` D, in rounds of one record per writing
partition every 1/8 s (event time = wall clock when the round starts, every
record up to 0.8 s out of order, within the 1 s bound):

    0 ........ 0.2D ........ 0.25D .... 0.35D ........ 0.6D ........ D
    p0-p4, p6: steady traffic all along; p3's upstream is slow: it delivers
               each record 80 rounds (10 s at the script's pace, more when
               the machine is slower) after its event time (Spark's Kafka
               source with withWatermark drops them as late (--compare),
               the valve waits for them)
    p5:  traffic | quiet (the emitter marks it IDLE)   | traffic again
    p7:  traffic ............ | stops | finished with `slackwater finish`

Apart from the live view (live_demo.py) so that the producer runs against any
Kafka, without Spark.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from typing import Protocol

from slackwater import kafka_clients

PARTITIONS = 8
QUIET, FINISHED_PARTITION, LAGGING = 5, 7, 3
ROUND_MS = 125  # one record per writing partition per round: 8 a second each
LAG_ROUNDS = 80  # p3's records reach Kafka 80 rounds (>= 10 s) after their event time
MAX_JITTER_MS = 800  # every record's event time is up to 0.8 s before its round's
DATA_TOPIC, CONTROL_TOPIC = "demo-events", "demo-control"


class ScriptLog(Protocol):
    """Where the script reports what it did (the live view's ``DemoState``): records
    written per partition and its events, under the lock."""

    lock: threading.Lock
    produced: Counter[int]
    events: list[str]


class Script:
    """The demo's input, round by round (module docstring): which partitions write in a
    round and the event times they stamp. p3's upstream holds every record for
    ``LAG_ROUNDS`` rounds; it starts that far behind (its first records carry the
    event times of the rounds before the first one), so p0-p4, p3 and p6 each write
    exactly one record in every round."""

    def __init__(self, duration_s: float, seed: int = 42) -> None:
        self.duration_s = duration_s
        self._rng = random.Random(seed)
        self._lagging: deque[int] = deque()  # p3's stamps, oldest first

    def writers(self, elapsed_s: float) -> list[int]:
        """The partitions that write in a round starting ``elapsed_s`` into the script."""
        quiet = 0.2 * self.duration_s <= elapsed_s < 0.6 * self.duration_s
        ended = elapsed_s >= 0.25 * self.duration_s
        return [
            p
            for p in range(PARTITIONS)
            if not (p == QUIET and quiet) and not (p == FINISHED_PARTITION and ended)
        ]

    def round(self, elapsed_s: float, stamp_ms: int) -> list[tuple[int, int]]:
        """(partition, event time ms) of the records of the round that starts
        ``elapsed_s`` into the script, stamped ``stamp_ms`` (rounds at least ``ROUND_MS``
        apart)."""
        if not self._lagging:  # the first round
            self._lagging.extend(stamp_ms - (LAG_ROUNDS - k) * ROUND_MS for k in range(LAG_ROUNDS))
        self._lagging.append(stamp_ms)
        records = []
        for partition in self.writers(elapsed_s):
            stamp = self._lagging.popleft() if partition == LAGGING else stamp_ms
            records.append((partition, stamp - self._rng.randrange(0, MAX_JITTER_MS)))
        return records


def produce_script(
    bootstrap: str,
    duration_s: float,
    state: ScriptLog,
    stop: threading.Event,
    *,
    topic: str = DATA_TOPIC,
    control_topic: str = CONTROL_TOPIC,
) -> None:
    """The demo's producer script (module docstring), from now for ``duration_s``: a
    round every ``ROUND_MS``, or as soon as the last one is written when that took longer."""
    started_ns = time.monotonic_ns()
    # Stamps are the wall clock at the start, advanced by the monotonic clock: rounds at
    # least ROUND_MS apart are stamped at least ROUND_MS apart.
    epoch_ms = time.time_ns() // 1_000_000
    producer = kafka_clients.producer("demo-producer", bootstrap, ours={"linger.ms": 0})
    script = Script(duration_s)
    finish_sent = False
    while not stop.is_set():
        round_ns = time.monotonic_ns()
        elapsed = (round_ns - started_ns) / 1e9
        if elapsed >= duration_s:
            break
        for partition, event_ms in script.round(
            elapsed, epoch_ms + (round_ns - started_ns) // 1_000_000
        ):
            producer.produce(
                topic,
                key=f"sensor-{partition}".encode(),
                value=b"{}",
                partition=partition,
                timestamp=event_ms,
            )
            with state.lock:
                state.produced[partition] += 1
        # One round of records acknowledged before the next (so every partition's log
        # end is within one round of the others'); a stop request is seen within half a
        # second even while the broker cannot be reached.
        while producer.flush(0.5) > 0 and not stop.is_set():
            pass
        if not finish_sent and elapsed >= 0.35 * duration_s:
            outcome = _finish_stopped_partition(bootstrap, control_topic, topic)
            finish_sent = True
            with state.lock:
                state.events.append(
                    f"{elapsed:5.1f}s  slackwater finish p{FINISHED_PARTITION}: {outcome}"
                )
        next_round_ns = round_ns + ROUND_MS * 1_000_000
        while not stop.is_set() and (left_ns := next_round_ns - time.monotonic_ns()) > 0:
            stop.wait(left_ns / 1e9)


def _finish_stopped_partition(bootstrap: str, control_topic: str, topic: str) -> str:
    """``slackwater finish`` for the partition that stopped, the real command as an
    operator would run it: "ok", or why it failed."""
    finish = subprocess.run(
        [
            sys.executable,
            "-m",
            "slackwater.cli",
            "finish",
            "--bootstrap-servers",
            bootstrap,
            "--control-topic",
            control_topic,
            "--topic",
            topic,
            "--partition",
            str(FINISHED_PARTITION),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "ok" if finish.returncode == 0 else f"failed: {finish.stderr.strip()}"
