"""What a batch may read: from the read positions to the log ends, less the partitions
watermark alignment holds (watermark_alignment.py), within the read limit. Pure."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from slackwater.markers import TopicPartitionKey
from spark_consumer.alignment import MarkerAligner
from spark_consumer.source.driver.watermark_alignment import Alignment, align
from spark_consumer.source.wire.offset import Offsets, ranges


def batch_ends(
    aligner: MarkerAligner,
    begin: Offsets,
    latest: dict[TopicPartitionKey, int],
    limit: ReadLimit,
    max_watermark_drift_ms: int | None = None,
) -> tuple[Offsets, Alignment | None]:
    """Where the batch's ranges end, and the holds (None: alignment off). A held partition
    ends at its read position, so the read limit's budget goes to the others."""
    ends = reachable_ends(begin, latest)
    alignment = None
    if max_watermark_drift_ms is not None:
        alignment = align(aligner, begin, ends, max_watermark_drift_ms)
        for topic, partition in alignment.held:
            ends[topic][partition] = begin[topic][partition]
    if isinstance(limit, ReadMaxRows):
        ends = rate_limit(begin, ends, limit.max_rows)
    return ends, alignment


def reachable_ends(begin: Offsets, latest: dict[TopicPartitionKey, int]) -> Offsets:
    """The log ends, never behind what was read (offsets that went back stand still until
    their earliest offset is known: topic_partitions.follow)."""
    ends: Offsets = {}
    for topic, partitions in begin.items():
        for partition, position in partitions.items():
            end = max(position, latest.get((topic, int(partition)), position))
            ends.setdefault(topic, {})[partition] = end
    return ends


def rate_limit(begin: Offsets, end: Offsets, max_records: int) -> Offsets:
    """At most ``max_records`` in all, shared in proportion to what each partition has."""
    batch_ranges = ranges(begin, end)
    total = sum(b - a for _, _, a, b in batch_ranges)
    if total <= max_records:
        return end
    limited = {t: dict(p) for t, p in end.items()}
    for topic, partition, a, b in batch_ranges:
        share = max(1, (b - a) * max_records // total)
        limited[topic][str(partition)] = min(b, a + share)
    return limited
