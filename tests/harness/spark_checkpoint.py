"""Reading a streaming query's checkpoint as Spark writes it: ``offsets/N`` (batch N
planned: Spark's metadata, then one offset per source) before the batch runs,
``commits/N`` (batch N done: the watermark for the next one) after. Spark writes each
file whole (a temporary file renamed), so a file that exists is complete."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def batch_ids(checkpoint: Path, log: str) -> set[int]:
    """The batches in a checkpoint log: "offsets" (planned) or "commits" (done)."""
    folder = checkpoint / log
    if not folder.is_dir():
        return set()
    return {int(f.name) for f in folder.iterdir() if f.name.isdigit()}


@dataclass(frozen=True)
class PlannedBatch:
    """``offsets/N``: the watermark Spark applies while batch N runs, and the offsets."""

    watermark_ms: int  # Spark's batchWatermarkMs
    sources: list[Any]  # one parsed offset per source, in the query's source order
    text: str  # the file as Spark wrote it

    def slackwater_offset(self) -> dict[str, Any]:
        """The (only) slackwater source's offset: its plan, with the watermark planned
        into the batch's synthetic row under "watermark"."""
        offsets = [s for s in self.sources if isinstance(s, dict) and "aligner" in s]
        assert len(offsets) == 1, self.sources
        return offsets[0]


def planned_batch(checkpoint: Path, batch: int) -> PlannedBatch:
    text = (checkpoint / "offsets" / str(batch)).read_text()
    lines = text.splitlines()  # "v1", Spark's metadata, one offset per source
    metadata = json.loads(lines[1])
    return PlannedBatch(
        int(metadata["batchWatermarkMs"]), [json.loads(line) for line in lines[2:]], text
    )


def next_watermark_ms(checkpoint: Path, batch: int) -> int:
    """``commits/N``: the watermark Spark computed from batch N's rows (and earlier
    batches'), which it applies from batch N+1 on."""
    lines = (checkpoint / "commits" / str(batch)).read_text().splitlines()
    return int(json.loads(lines[1])["nextBatchWatermarkMs"])


def ran_with_watermark(checkpoint: Path, at_least_ms: int) -> bool:
    """A batch that ran with Spark's watermark at ``at_least_ms`` or later has committed:
    in append mode every window ending by then has been written, and evicted."""
    return any(
        planned_batch(checkpoint, batch).watermark_ms >= at_least_ms
        for batch in batch_ids(checkpoint, "commits") & batch_ids(checkpoint, "offsets")
    )
