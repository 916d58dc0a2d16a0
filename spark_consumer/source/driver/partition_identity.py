"""Whether a partition is still the one the query read: its offsets went back (the topic
re-created, or its log truncated) or it vanished (its topic deleted, or re-created with
fewer partitions), judged on Kafka's evidence alone (``slackwater.kafka_evidence`` rules
1-3 and 6), for the planner's data and control topics; never on a timer. The planner's
``PlannerClient`` asks the broker; this room keeps what the positions were seen in
(``seen_in``: topic ids, leader epochs) and judges.

    answer for a partition, against its position:
        at or past it, from the newest epoch seen   -> its epoch is known from here
        below it, or from an older epoch than known:
            the topic's id is another               -> went back (every partition of it)
            a newer leader epoch than known         -> went back (truncated)
            otherwise                               -> stale: this plan did not see it
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException

from slackwater import kafka_evidence
from slackwater.markers import TopicPartitionKey
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.seen_in import SeenIn
from spark_consumer.source.shared.options import SourceError, SourceOptions
from spark_consumer.source.wire.offset import Offsets

log = logging.getLogger("spark_consumer.source.driver.planner").getChild("broker")


class PartitionIdentity:
    """The judgment, and what it keeps between plans: the ids and epochs (``seen``, kept
    in the offset), the partitions found gone back and not started again yet, and those
    said stale."""

    def __init__(
        self,
        options: SourceOptions,
        topic_ids_now: Callable[[Collection[str]], dict[str, str]],
        describe: Callable[[str], Any],
    ) -> None:
        self.options = options
        self._topic_ids_now = topic_ids_now  # DescribeTopics
        self._describe = describe  # one topic's metadata, asked for by name (None: unlisted)
        self.seen = SeenIn()
        self.leader_epochs = self.seen.leader_epochs
        self.topic_ids = self.seen.topic_ids
        # Partitions whose log end is below the position and was said so.
        self._said_low: set[TopicPartitionKey] = set()
        # Partitions found gone back and not yet started again (``started_again``): the
        # evidence is taken once (the new topic id is kept), so the finding is.
        self._going_back: set[TopicPartitionKey] = set()
        # Answers in a row that a read partition is not listed (rule 2).
        self._missing: dict[TopicPartitionKey, kafka_evidence.MissingAnswers] = {}

    def kept(self) -> dict[str, Any]:
        """What the offset keeps of it (``seen_in``): the topic ids and leader epochs."""
        return self.seen.encode()

    def remember(self, kafka: Mapping[str, Any], positions: Mapping[str, Any]) -> None:
        """A restart's first plan takes what its checkpoint's offset kept (``kept``)."""
        self.seen.remember(kafka, positions)

    def learn(self, now: PlanAnswers) -> None:
        """A topic first seen: its id, asked once (rule 6), right after the plan's look."""
        control = self.options.control_topic
        unnamed = [t for t in now.counts if t not in self.topic_ids]
        if control is not None and control not in self.topic_ids and now.control_ends:
            unnamed.append(control)
        if unnamed:
            learned = self._topic_ids_now(unnamed)
            if learned:
                self.topic_ids.update(learned)
                self.seen.changed()

    def went_back(self, data: Offsets, now: PlanAnswers) -> list[TopicPartitionKey]:
        """Partitions whose offsets went back, on Kafka's evidence alone: the topic's id
        changed (kafka_evidence rule 6: re-created), or a log end below the position was
        answered in a newer leader epoch than any end at or past it (rule 3: truncated
        by an unclean election). A lower end with neither is a stale leader's: the
        partition stands still (a batch never reads past its start) for as long as that
        lasts, never on a timer. failOnDataLoss=true stops the query at the first."""
        positions = (
            ((topic, int(partition)), position)
            for topic, partitions in data.items()
            for partition, position in partitions.items()
        )
        went_back, recreated = self._went_back(positions, now)
        if recreated:  # every partition of a topic re-created, low yet or not
            listed = {
                t: {p: o for p, o in data[t].items() if int(p) < now.counts.get(t, 0)}
                for t in recreated
            }  # (those past the new topic's count vanish: vanished, below)
            went_back = self._whole(recreated, went_back, listed)
        if went_back and self.options.fail_on_data_loss:
            # Named by one that answered (a re-created topic's others may not have yet).
            topic, number = next((k for k in went_back if k in now.latest), went_back[0])
            why = "re-created" if topic in recreated else "truncated in a newer leader epoch"
            raise SourceError(
                f"data loss: {topic}[{number}]'s log end went back from "
                f"{data[topic][str(number)]} to {now.latest.get((topic, number), 'unknown')} "
                f"(the topic was {why}): records this query had not read may be gone; the "
                "option failOnDataLoss=false starts again at its earliest offset"
            )
        return went_back

    def control_went_back(self, control: dict[str, int], now: PlanAnswers) -> list[str]:
        """The control topic's partitions whose offsets went back, by the same evidence
        as ``went_back``: one low answer once made the planner read it again from 0 and
        forget every emitter epoch, so a fenced emitter's marker was accepted again."""
        topic = self.options.control_topic
        if topic is None:
            return []
        positions = (((topic, int(p)), position) for p, position in control.items())
        went_back, recreated = self._went_back(positions, now)
        if recreated:
            went_back = self._whole(recreated, went_back, {topic: control})
        for key in went_back:
            self.started_again(key)  # the control reader reads it from 0 at once
        return [str(p) for _, p in went_back]

    def _went_back(
        self, positions: Iterable[tuple[TopicPartitionKey, int]], now: PlanAnswers
    ) -> tuple[list[TopicPartitionKey], set[str]]:
        """Those of ``positions`` whose offsets went back (rules 3 and 6), and the topics
        found re-created; every other end's leader epoch is kept as known."""
        low: dict[TopicPartitionKey, tuple[int, int]] = {}
        epochs, answered, said = self.leader_epochs, now.leader_epochs, self._said_low
        going_back, still_going_back = self._going_back, []
        for key, position in positions:
            if going_back and key in going_back:
                still_going_back.append(key)  # found before: its start was not answered
                continue
            end = now.latest.get(key)
            if end is None:
                continue  # no answer: nothing to judge
            epoch = answered.get(key)
            known_epoch = epochs.get(key)
            if kafka_evidence.lower_end(end, position) or (
                epoch is not None and known_epoch is not None and epoch < known_epoch
            ):
                low[key] = (end, position)  # below the position, or an older leader's
                continue
            if said:
                said.discard(key)  # past it: said again should it come back
            if epoch is not None and (known_epoch is None or epoch > known_epoch):
                epochs[key] = epoch  # (rule 3's known epoch)
                self.seen.changed()
        if not low:
            return sorted(still_going_back), set()
        recreated = self._recreated({topic for topic, _ in low})
        went_back = sorted(
            key
            for key, (end, position) in low.items()
            if key[0] in recreated
            or kafka_evidence.log_end_went_back(end, position, answered.get(key), epochs.get(key))
        )
        stale = {k: low[k] for k in low.keys() - set(went_back)}
        self._say_stale(now, stale)
        for key in stale:
            now.latest.pop(key, None)  # not an end to plan to: this plan did not see it
            if key[0] == self.options.control_topic:
                now.control_ends.pop(str(key[1]), None)
        for key in went_back:
            self._said_low.discard(key)
        self._going_back.update(went_back)
        return sorted(went_back + still_going_back), recreated

    def _whole(
        self, recreated: set[str], went_back: list[TopicPartitionKey], data: Offsets
    ) -> list[TopicPartitionKey]:
        """``went_back`` with every partition of the re-created topics: the id is taken
        once, so a partition of the new topic that answers only in a later plan (its
        leader not ready yet) must be found now, or its new records below the old
        position would be skipped."""
        whole = {(t, int(p)) for t in recreated for p in data.get(t, {})}
        for key in whole:
            self.leader_epochs.pop(key, None)
        self._going_back.update(whole)
        self.seen.changed()
        return sorted(whole.union(went_back))

    def forget(self, key: TopicPartitionKey, last_of_topic: bool) -> None:
        """A partition that left the reading (vanished, unsubscribed): what was seen of it
        goes, and its topic's id with its last partition (a topic made again under the
        name later is a new one read from its start, not one gone back)."""
        self.leader_epochs.pop(key, None)
        self._going_back.discard(key)
        self._said_low.discard(key)
        self._missing.pop(key, None)
        if last_of_topic:
            self.topic_ids.pop(key[0], None)
        self.seen.changed()

    def vanished(self, data: Offsets, now: PlanAnswers) -> list[TopicPartitionKey]:
        """Partitions the broker no longer lists: a topic missing from the metadata, or
        partitions past a topic's count (re-created with fewer).

        One answer is not enough (kafka_evidence rule 2: believed when told twice in a
        row, in two plans): a topic also goes missing from an all-topics answer when the
        principal loses DESCRIBE, or from a broker behind on metadata. For a whole
        topic, each answer is a request for that topic alone, which must say it does not
        exist (rule 1); a request not answered leaves the count where it was.
        """
        if not self._missing and all(
            topic in now.counts and len(partitions) <= now.counts[topic]
            for topic, partitions in data.items()
        ):
            return []  # every partition read is listed (partitions are numbered from 0)
        unlisted = {topic for topic in data if topic not in now.counts and topic not in now.listed}
        missing = {(topic, int(partition)) for topic in unlisted for partition in data[topic]} | {
            (topic, int(partition))
            for topic, count in now.counts.items()
            for partition in data.get(topic, {})
            if int(partition) >= count
        }
        self._missing = {
            key: self._missing.get(key) or kafka_evidence.MissingAnswers() for key in missing
        }
        said = {topic: self._topic_does_not_exist(topic) for topic in unlisted}
        vanished = sorted(
            key for key, answers in self._missing.items() if answers.answer(said.get(key[0], True))
        )
        for key in vanished:
            del self._missing[key]
        return vanished

    def _topic_does_not_exist(self, topic: str) -> bool | None:
        """A request for this topic alone answers that it does not exist (rule 1); None
        if it was not answered."""
        try:
            described = self._describe(topic)
        except KafkaException:
            return None
        return kafka_evidence.topic_missing(described)

    def started_again(self, key: TopicPartitionKey) -> None:
        """A partition that went back is read from its new start: the new log's epochs
        count from here."""
        self._going_back.discard(key)
        self.leader_epochs.pop(key, None)
        self.seen.changed()

    def _recreated(self, topics: set[str]) -> set[str]:
        """Those of ``topics`` whose id is not the one first seen (rule 6); the new id is
        kept, so a topic counts as re-created once."""
        known = {t: self.topic_ids[t] for t in topics if t in self.topic_ids}
        ids_now = self._topic_ids_now(list(known))
        recreated = {t for t, i in ids_now.items() if kafka_evidence.topic_recreated(i, known[t])}
        if recreated:
            self.topic_ids.update({t: ids_now[t] for t in recreated})
            self.seen.changed()
        return recreated

    def _say_stale(self, now: PlanAnswers, stale: dict[TopicPartitionKey, tuple[int, int]]) -> None:
        """Once per partition while it lasts (a partition past it is said again)."""
        for key, (end, position) in sorted(stale.items()):
            if key in self._said_low:
                continue
            log.warning(
                "%s[%d]'s log end %d (leader epoch %s) is below this query's position %d or "
                "from an older leader epoch than %s, and Kafka gives no evidence that it "
                "went back (the same topic id): a stale leader's answer; it stands still",
                *key,
                end,
                now.leader_epochs.get(key, "unknown"),
                position,
                self.leader_epochs.get(key, "unknown"),
            )
            self._said_low.add(key)
