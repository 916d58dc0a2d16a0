"""The log ends the emitter has seen, and which lower answers it believes
(``slackwater.kafka_evidence`` rules 3 and 6), so that no marker is placed on a stale
leader's answer.

    answer below the highest end seen, or from an older leader epoch than the one seen:
        a newer leader epoch than that end's      -> truncated (unclean election): taken
        the topic's id is another                 -> re-created: taken, seen afresh
        otherwise (same or older epoch, none)     -> stale: this poll did not see it

A partition not seen this poll makes no decision and its idle clock stands (the
detector's rule for a partition without an answer); the next answer decides again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from slackwater import kafka_evidence
from slackwater.markers import TopicPartitionKey

log = logging.getLogger("emitter.observer")


class KnownEnds:
    """The highest log end seen per partition, the newest leader epoch it was answered
    in, and the id of each topic when first seen."""

    def __init__(self, topic_ids: Callable[[Collection[str]], dict[str, str]]) -> None:
        self._topic_ids_now = topic_ids  # DescribeTopics: ids of the topics it describes
        self._ends: dict[TopicPartitionKey, int] = {}
        self._epochs: dict[TopicPartitionKey, int] = {}
        self._ids: dict[str, str] = {}
        self._said: set[TopicPartitionKey] = set()

    def learn_topics(self, topics: Collection[str]) -> None:
        """The ids of topics seen for the first time (asked once; one not answered is
        asked at the next call)."""
        unnamed = [t for t in topics if t not in self._ids]
        if unnamed:
            self._ids.update(self._topic_ids_now(unnamed))

    def believed(
        self, answers: dict[TopicPartitionKey, int], epochs: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """``answers`` without the stale ones (kept in place: a dict built per poll)."""
        ends, known_epochs = self._ends, self._epochs
        low: list[TopicPartitionKey] = []
        for key, end in answers.items():
            known = ends.get(key)
            epoch, known_epoch = epochs.get(key), known_epochs.get(key)
            if (known is not None and end < known) or (
                epoch is not None and known_epoch is not None and epoch < known_epoch
            ):
                low.append(key)  # below the end seen, or an older leader's answer
                continue
            if known != end:
                ends[key] = end
            if epoch is not None and epoch != known_epoch:
                known_epochs[key] = epoch  # (newer: an older one is judged above)
        if self._said:
            self._said &= set(low)
        if low:
            self._judge(low, answers, epochs)
        return answers

    def _judge(
        self,
        low: list[TopicPartitionKey],
        answers: dict[TopicPartitionKey, int],
        epochs: Mapping[TopicPartitionKey, int],
    ) -> None:
        known_ids = {topic: self._ids[topic] for topic, _ in low if topic in self._ids}
        ids_now = self._topic_ids_now(list(known_ids))
        recreated = {
            t for t, i in ids_now.items() if kafka_evidence.topic_recreated(i, known_ids[t])
        }
        self._ids.update(ids_now)
        for topic in recreated:  # a new log for every partition, low yet or not
            for key in [k for k in self._ends if k[0] == topic]:
                del self._ends[key]
                self._epochs.pop(key, None)
        for key in low:
            end, known = answers[key], self._ends.get(key, -1)
            truncated = kafka_evidence.log_end_went_back(
                end, known, epochs.get(key), self._epochs.get(key)
            )
            if key[0] in recreated or truncated:
                self._ends[key] = end  # a new log: seen afresh from here
                if (epoch := epochs.get(key)) is not None:
                    self._epochs[key] = epoch
                continue
            del answers[key]  # a stale leader's answer: not seen this poll
            if key not in self._said:
                self._said.add(key)
                log.warning(
                    "%s[%d]'s log end %d is below the %d seen before or from an older "
                    "leader epoch, without a newer epoch or another topic id: a stale "
                    "answer, not taken",
                    *key,
                    end,
                    known,
                )
