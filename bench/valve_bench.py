"""Nanoseconds per input event through the valve at 10, 1,000 and 10,000 channels.

Realistic mix: per-partition watermarks that rise by a random step, and about
2% status events, which alternately make a random ACTIVE channel IDLE and wake
the longest-idle channel up again (so a small idle set comes and goes).

    .venv/bin/python -m bench.valve_bench [--events 400000] [--repeat 5]

Prints one row per channel count: the best of --repeat runs (the least
disturbed by other work on a shared machine) and the median.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque

from spark_consumer.valve import StatusWatermarkValve, WatermarkStatus

STATUS_SHARE = 0.02


def make_events(channels: int, count: int, seed: int = 7) -> list[tuple[int, int, int]]:
    """(kind, channel, value): kind 0 = watermark, 1 = IDLE, 2 = ACTIVE."""
    rng = random.Random(seed)
    watermarks = [rng.randrange(0, 1_000) for _ in range(channels)]
    idle: deque[int] = deque()
    idle_set: set[int] = set()
    events: list[tuple[int, int, int]] = []
    go_idle = True
    for _ in range(count):
        if rng.random() < STATUS_SHARE:
            if go_idle or not idle:
                channel = rng.randrange(channels)
                if channel not in idle_set:
                    idle.append(channel)
                    idle_set.add(channel)
                    events.append((1, channel, 0))
            else:
                channel = idle.popleft()
                idle_set.discard(channel)
                events.append((2, channel, 0))
            go_idle = not go_idle
        else:
            channel = rng.randrange(channels)
            watermarks[channel] += rng.randrange(1, 200)
            events.append((0, channel, watermarks[channel]))
    return events


def run_once(channels: int, events: list[tuple[int, int, int]]) -> float:
    """Nanoseconds per event for one pass over the events on a fresh valve."""
    valve = StatusWatermarkValve(range(channels))
    input_watermark, input_status = valve.input_watermark, valve.input_status
    idle, active = WatermarkStatus.IDLE, WatermarkStatus.ACTIVE
    started = time.perf_counter_ns()
    for kind, channel, value in events:
        if kind == 0:
            input_watermark(channel, value)
        elif kind == 1:
            input_status(channel, idle)
        else:
            input_status(channel, active)
    return (time.perf_counter_ns() - started) / len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'channels':>9} {'events':>9} {'best ns/event':>14} {'median ns/event':>16}")
    for channels in (10, 1_000, 10_000):
        events = make_events(channels, args.events)
        runs = [run_once(channels, events) for _ in range(args.repeat)]
        print(
            f"{channels:>9,} {len(events):>9,} {min(runs):>14.0f} {statistics.median(runs):>16.0f}"
        )


if __name__ == "__main__":
    main()
