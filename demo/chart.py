"""The demo's PNG: per-partition and valve watermarks over time, with status bands."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slackwater.markers import MarkerStatus
from spark_consumer.valve import MAX_WATERMARK, MIN_WATERMARK


@dataclass(frozen=True)
class Sample:
    """The consumer's view after one micro-batch."""

    wall_s: float
    valve_watermark_ms: int
    partition_watermark_ms: dict[int, int]
    partition_status: dict[int, MarkerStatus]


def _shown(ms: int) -> float | None:
    return None if ms in (MIN_WATERMARK, MAX_WATERMARK) else ms / 1000


def write_chart(samples: list[Sample], path: Path) -> Path:
    """Draws watermarks (seconds relative to the first sample) and IDLE/FINISHED bands."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    if not samples:
        raise ValueError("no micro-batch to draw")
    partitions = sorted({p for s in samples for p in s.partition_watermark_ms})
    origin = min(
        (v for s in samples for v in [_shown(s.valve_watermark_ms)] if v is not None), default=0.0
    )
    figure, (lines, bands) = plt.subplots(
        2, 1, figsize=(11, 7), sharex=True, height_ratios=[3, 2], layout="constrained"
    )
    times = [s.wall_s for s in samples]
    for partition in partitions:
        values = [_shown(s.partition_watermark_ms.get(partition, MIN_WATERMARK)) for s in samples]
        lines.plot(
            times,
            [None if v is None else v - origin for v in values],
            linewidth=1,
            label=f"p{partition}",
        )
    valve = [_shown(s.valve_watermark_ms) for s in samples]
    lines.plot(
        times,
        [None if v is None else v - origin for v in valve],
        color="black",
        linewidth=2.5,
        label="valve",
    )
    lines.set_ylabel("watermark (s, event time)")
    lines.legend(ncol=5, fontsize="small")
    lines.set_title("slackwater demo: per-partition watermarks and the valve")
    colours = {MarkerStatus.IDLE: "gold", MarkerStatus.FINISHED: "steelblue"}
    for row, partition in enumerate(partitions):
        for start, end, status in _runs(samples, partition):
            if status in colours:
                bands.broken_barh([(start, end - start)], (row - 0.4, 0.8), color=colours[status])
    bands.set_yticks(range(len(partitions)), [f"p{p}" for p in partitions])
    bands.set_xlabel("wall time since the demo began (s)")
    bands.set_title("status at the consumer: IDLE (gold), FINISHED (blue), else ACTIVE")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _runs(samples: list[Sample], partition: int) -> list[tuple[float, float, MarkerStatus]]:
    """(start, end, status) runs of one partition's status over the samples."""
    runs: list[tuple[float, float, MarkerStatus]] = []
    for index, sample in enumerate(samples):
        status = sample.partition_status.get(partition, MarkerStatus.ACTIVE)
        end = samples[index + 1].wall_s if index + 1 < len(samples) else sample.wall_s + 1
        if runs and runs[-1][2] is status:
            runs[-1] = (runs[-1][0], end, status)
        else:
            runs.append((sample.wall_s, end, status))
    return runs
