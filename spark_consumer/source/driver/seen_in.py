"""What the planner's positions were seen in: each read topic's id and each partition's
newest leader epoch (``slackwater.kafka_evidence`` rules 3 and 6). Kept in the offset
(its ``kafka`` key), so that a query restarted after days away judges a lower log end as
the one before it would have: a topic re-created while it was down has another id, a
log truncated by an unclean election answers in a newer epoch.

    {"ids": {"orders": "x3Jc..."}, "epochs": {"orders": 4, "clicks": {"0": 2, "1": 3}}}

A topic's epochs are one number when every partition has the same (the common case).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slackwater.markers import TopicPartitionKey

log = logging.getLogger("spark_consumer.source.driver.planner").getChild("seen_in")


@dataclass
class SeenIn:
    """The ids and epochs, and their offset form."""

    topic_ids: dict[str, str] = field(default_factory=dict)
    leader_epochs: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # The encoded form, made again only after a change (at 10,000 partitions, every
    # plan would otherwise build it).
    _encoded: dict[str, Any] | None = None

    def changed(self) -> None:
        self._encoded = None

    def encode(self) -> dict[str, Any]:
        if self._encoded is None:
            by_topic: dict[str, dict[str, int]] = defaultdict(dict)
            for (topic, partition), epoch in self.leader_epochs.items():
                by_topic[topic][str(partition)] = epoch
            epochs: dict[str, Any] = {}
            for topic, per_partition in sorted(by_topic.items()):
                values = set(per_partition.values())
                one = len(values) == 1
                epochs[topic] = values.pop() if one else dict(sorted(per_partition.items()))
            self._encoded = {"ids": dict(sorted(self.topic_ids.items())), "epochs": epochs}
        return self._encoded

    def remember(self, kafka: Mapping[str, Any], partitions: Mapping[str, Any]) -> None:
        """Takes what an offset says for what this planner has not seen itself (a
        restart); ``partitions``: the offset's data positions, by topic, which a topic's
        single epoch stands for. What cannot be read is left out, said once: without
        it, a lower log end stands still instead of going back."""
        try:
            for topic, topic_id in kafka.get("ids", {}).items():
                self.topic_ids.setdefault(str(topic), str(topic_id))
            for topic, written in kafka.get("epochs", {}).items():
                epochs = (
                    dict.fromkeys(partitions.get(topic, {}), written)
                    if isinstance(written, int)
                    else written
                )
                for partition, epoch in epochs.items():
                    self.leader_epochs.setdefault((str(topic), int(partition)), int(epoch))
        except (AttributeError, TypeError, ValueError) as error:
            log.warning("the offset's topic ids and leader epochs are unreadable: %s", error)
        self.changed()


def kept_epochs(
    kafka: Mapping[str, Any], positions: Mapping[str, Any]
) -> dict[TopicPartitionKey, int]:
    """The leader epochs an offset kept for its ``positions`` (its data, by topic)."""
    seen = SeenIn()
    seen.remember(kafka, positions)
    return seen.leader_epochs
