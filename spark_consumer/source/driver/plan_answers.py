"""What one plan saw of Kafka: the answers of one metadata request and one ListOffsets
round (``PlannerClient.observe``), and the ids of the topics whose answers changed,
which every step of the plan judges. The emitter's ``PollAnswers`` is what one poll saw
(other questions: committed offsets, members)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slackwater.markers import TopicPartitionKey


@dataclass(frozen=True)
class PlanAnswers:
    """What one plan saw of the broker (``PlannerClient.observe``)."""

    counts: dict[str, int]  # partitions per subscribed topic (listed without an error)
    listed: frozenset[str]  # every topic the broker lists, with an error or not
    latest: dict[TopicPartitionKey, int]  # log ends (last stable offsets if read_committed)
    control_ends: dict[str, int]  # the control topic's log ends; empty if it does not exist
    # The leader epoch each log end was answered in, where the broker gave one.
    leader_epochs: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # The progress topic's partitions, from the same metadata; None if it is not listed
    # there (not there, or not the principal's to list: asked by name then).
    progress_partitions: tuple[int, ...] | None = None
    # The ids of the topics described this plan (``PartitionIdentity.to_ask``: those
    # whose answers changed, or whose id is not known); a topic not asked or not
    # answered is left out: its identity is unknown this plan, not changed.
    topic_ids: dict[str, str] = field(default_factory=dict)
