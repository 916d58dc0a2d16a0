"""Histories of the control topic for property tests of the protocol's order (issue 42,
finding 6): markers as emitters wrote them to several partitions of the control topic,
and the orders a reader may take them in."""

from __future__ import annotations

from collections import deque

from hypothesis import strategies as st

from slackwater.markers import Marker, MarkerStatus

# (control partition, record) in the order the records were written.
Written = list[tuple[int, Marker]]


@st.composite
def written_histories(draw: st.DrawFn) -> Written:
    """Markers as emitters wrote them, one epoch after another, each to some partition of
    the control topic (an old deployment's hashed keys after partitions were added):
    per data partition, seq rising, epochs never going back."""
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 2),  # data partition
                st.sampled_from(MarkerStatus),
                st.booleans(),  # a new emitter (epoch) from this marker on
                st.integers(0, 5),  # control partition
            ),
            max_size=24,
        )
    )
    epoch, seqs, written = 1, dict.fromkeys(range(3), 0), []
    for data_partition, status, new_epoch, control_partition in steps:
        epoch += new_epoch
        seq = seqs[data_partition]
        seqs[data_partition] = seq + 1
        marker = Marker(
            topic="t",
            partition=data_partition,
            status=status,
            offset=seq + 1,
            emitted_at=0,
            emitter_id=f"e{epoch}",
            epoch=epoch,
            seq=seq,
        )
        written.append((control_partition, marker))
    return written


def interleavings(written: Written) -> st.SearchStrategy[Written]:
    """The records as a reader may take them: each partition's in its log's order, the
    partitions' interleaved any way."""

    def taken(order: list[int]) -> Written:
        logs: dict[int, deque[Marker]] = {}
        for partition, marker in written:
            logs.setdefault(partition, deque()).append(marker)
        return [(partition, logs[partition].popleft()) for partition in order]

    return st.permutations([partition for partition, _ in written]).map(taken)
