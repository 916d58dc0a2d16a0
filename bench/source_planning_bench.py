"""Milliseconds of the source's planning that are pure Python, per batch, by partitions.

    .venv/bin/python -m bench.source_planning_bench [--partitions 100 1000 10000]

What ``latestOffset`` does besides its Kafka requests, on one synthetic batch where
every partition read records: get the aligner/valve state of the previous offset, apply
every partition's progress, snapshot the state into the new offset, encode it
(``SourceOffset``, version 2), and the JSON round trip Spark puts the offset through.
"warm" is the steady state (the planner kept the state it returned last); "cold"
restores it from the offset's JSON (a restart). Kafka's
part (ListOffsets of every partition, the progress and control reads) is measured on
the broker by bench/pipeline_bench, not here. Best and median of 7 runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from spark_consumer.alignment import MarkerAligner, PartitionBatch
from spark_consumer.source.wire.offset import SourceOffset


def channel_of(marker: object) -> str | None:
    return None


def _offset(aligner: MarkerAligner, partitions: int, step: int) -> SourceOffset:
    ends = {"orders": {str(p): 10 + step for p in range(partitions)}}
    starts = {"orders": {str(p): 9 + step for p in range(partitions)}}
    return SourceOffset(
        data=ends,
        data_from=starts,
        control={"0": 0},
        progress={"0": step * partitions},
        watermark=aligner.valve.watermark,
        late_threshold=aligner.valve.watermark,
        status=aligner.valve.status.value,
        aligner=aligner.snapshot(),
    )


def offset_for(partitions: int) -> dict[str, object]:
    """The previous batch's offset as Spark hands it back (through its JSON log)."""
    aligner = MarkerAligner(None, 2_000, channel_of=channel_of)
    aligner.ensure_partitions(f"orders:{p}" for p in range(partitions))
    aligner.advance(
        {f"orders:{p}": PartitionBatch(10, 1_700_000_000_000 + p, 9, 10) for p in range(partitions)}
    )
    parsed: dict[str, object] = json.loads(json.dumps(_offset(aligner, partitions, 0).encode()))
    return parsed


def plan_once(offset: dict[str, object], partitions: int, step: int, *, cold: bool) -> float:
    def restored() -> MarkerAligner:
        return MarkerAligner.restore(SourceOffset.decode(offset).aligner, channel_of=channel_of)

    warm = None if cold else restored()
    started = time.perf_counter()
    aligner = warm or restored()
    aligner.advance(
        {
            f"orders:{p}": PartitionBatch(10, 1_700_000_000_000 + p + step, 9 + step, 10 + step)
            for p in range(partitions)
        }
    )
    new_offset = _offset(aligner, partitions, step).encode()
    json.loads(json.dumps(new_offset))  # Spark writes the offset log and hands it back
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[100, 1_000, 10_000])
    args = parser.parse_args()
    print(f"{'partitions':>10} {'state':>5} {'best ms':>9} {'median ms':>10} {'offset KiB':>11}")
    for partitions in args.partitions:
        offset = offset_for(partitions)
        size_kib = len(json.dumps(offset)) / 1024
        for cold in (False, True):
            runs = [plan_once(offset, partitions, step, cold=cold) for step in range(1, 8)]
            print(
                f"{partitions:>10,} {'cold' if cold else 'warm':>5} {min(runs):>9.1f}"
                f" {statistics.median(runs):>10.1f} {size_kib:>11,.0f}"
            )


if __name__ == "__main__":
    main()
