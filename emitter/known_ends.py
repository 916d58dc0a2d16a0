"""What the emitter has seen of each partition's log, and the verdict on each poll's
answers: ``slackwater.log_verdict.judge``'s (issue 41; its GREW row written out for
speed, held equal to it by a test), so that no marker is placed on a stale leader's
answer and none of an old log is carried over to a new one.

    per partition, against what was seen (the highest end, its leader epoch, the topic's id):
        SAME, GREW      -> taken
        TRUNCATED       -> taken (a newer leader's end), seen afresh from it; the
                           detector is told (a new log)
        RECREATED       -> not taken this poll, seen afresh from the next answer; the
                           detector is told, for every partition of the topic
        UNKNOWN         -> dropped: this poll did not see it (a stale leader's answer),
                           said once per partition while it lasts
        DELETED         -> never here: the observer asks only for partitions its metadata
                           lists; a deleted topic is the detector's (rules 1 and 2)

A poll, in order (rule 6 at the cost of what changed): the ListOffsets answers; the
partitions whose answer is not what was seen (``changed``: another end, another leader
epoch; the others are SAME and change nothing, so they are not judged); the ids of the
topics not known yet and of those with a changed answer (``to_ask``: one DescribeTopics,
after ListOffsets); the changed answers judged (``believed``). A quiet poll asks no id
(DescribeTopics costs 12-15 ms of CPU per 1,000 partitions: librdkafka builds every
partition's description). That is enough: a topic re-created with ends exactly those
seen shows no new record to misjudge; its first new record makes an answer differ, and
its id is asked in that very poll, before any marker is placed on it.

A re-created topic's answer of the poll that finds it is not taken (``log_verdict.after``
sees the new log from its next answer): ListOffsets was answered before DescribeTopics,
maybe by a leader still holding the old log. A topic whose id was asked and not answered
(no answer in time, a broker behind on metadata) is not known to be the same log: its
changed answers are not taken that poll (as the Spark source's planner stands still on
them), and still differ at the next poll, which asks again; its unchanged ones are taken
(the same ends show nothing new). A partition not seen this poll makes no decision and
its idle clock stands (the detector's rule for one without an answer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from slackwater import kafka_evidence
from slackwater.log_verdict import Answer, Seen, Verdict, after, judge
from slackwater.markers import TopicPartitionKey

log = logging.getLogger("emitter.observer")


@dataclass(frozen=True)
class NewLogs:
    """What one poll found on a new log: partitions TRUNCATED, and topics RECREATED
    (every partition of such a topic is on a new log, whoever holds it)."""

    truncated: frozenset[TopicPartitionKey] = frozenset()
    recreated: frozenset[str] = frozenset()


NO_NEW_LOG = NewLogs()


class KnownEnds:
    """Per partition the highest log end seen and the newest leader epoch it was
    answered in; per topic its id (log_verdict.Seen, kept as three dicts)."""

    def __init__(self) -> None:
        self._ends: dict[TopicPartitionKey, int] = {}
        self._epochs: dict[TopicPartitionKey, int] = {}
        self._ids: dict[str, str] = {}
        self._said: set[TopicPartitionKey] = set()  # stale answers said, while they last

    def changed(
        self, answers: Mapping[TopicPartitionKey, int], epochs: Mapping[TopicPartitionKey, int]
    ) -> set[TopicPartitionKey]:
        """The answered partitions whose answer is not what was seen: another log end (or
        none seen yet), or another leader epoch (none answered tells nothing). Only these
        can be judged other than SAME (two set differences: a quiet poll's whole cost)."""
        changed = {key for key, _ in answers.items() - self._ends.items()}
        if epochs:
            changed |= {key for key, _ in epochs.items() - self._epochs.items() if key in answers}
        return changed

    def to_ask(self, listed: Iterable[str], changed: Iterable[TopicPartitionKey]) -> list[str]:
        """The topics whose id this poll asks: those of ``listed`` whose id is not known
        yet, and those with a ``changed`` answer (the module's docstring says why)."""
        topics = {topic for topic, _ in changed}
        topics.update(topic for topic in listed if topic not in self._ids)
        return sorted(topics)

    def believed(
        self,
        answers: dict[TopicPartitionKey, int],
        epochs: Mapping[TopicPartitionKey, int],
        changed: Iterable[TopicPartitionKey],
        asked: Iterable[str],
        topic_ids: Mapping[str, str],
    ) -> NewLogs:
        """Judges one poll's ``changed`` answers with the ids ``asked`` and answered
        (``topic_ids``): ``answers`` loses those not taken (in place: a dict built per
        poll); returns what was found on a new log. A changed answer of a topic whose id
        was asked and not answered is not taken: it may be a new log's, which only the id
        tells (it stands still, as a stale one does; the observer counts the error)."""
        recreated = frozenset(
            topic
            for topic, topic_id in topic_ids.items()
            if kafka_evidence.topic_recreated(topic_id, self._ids.get(topic))
        )
        judged = set(changed)
        unanswered = {topic for topic in asked if topic not in topic_ids}
        if unanswered:
            blind = {key for key in judged if key[0] in unanswered}
            judged -= blind
            for key in blind:
                answers.pop(key, None)
        if recreated:  # every partition of the topic, answered this poll or not
            judged |= {key for key in self._ends.keys() | answers.keys() if key[0] in recreated}
        truncated, stale = self._judge_all(judged, answers, epochs, topic_ids, recreated)
        self._ids.update(topic_ids)  # once every partition was judged against the old id
        for topic in sorted(recreated):
            log.warning(
                "topic %s was re-created (its id is now %s): its partitions' logs are new, "
                "seen afresh from their next answer, and an IDLE marker placed on the old "
                "log is withdrawn",
                topic,
                topic_ids[topic],
            )
        self._drop_stale(stale, answers)
        if not truncated and not recreated:
            return NO_NEW_LOG
        return NewLogs(frozenset(truncated), recreated)

    def _judge_all(
        self,
        judged: set[TopicPartitionKey],
        answers: dict[TopicPartitionKey, int],
        epochs: Mapping[TopicPartitionKey, int],
        topic_ids: Mapping[str, str],
        recreated: frozenset[str],
    ) -> tuple[list[TopicPartitionKey], list[TopicPartitionKey]]:
        """Every partition of ``judged`` judged; returns those TRUNCATED and UNKNOWN. A
        grown log's answer is kept without a call: ``judge``'s GREW and ``after``'s,
        written out (a call each is 40 ms of CPU at 10,000 moved partitions; the
        hypothesis test holds the two equal)."""
        ends, known_epochs = self._ends, self._epochs
        truncated: list[TopicPartitionKey] = []
        stale: list[TopicPartitionKey] = []
        for key in judged:
            end, epoch = answers.get(key), epochs.get(key)
            seen_end, seen_epoch = ends.get(key), known_epochs.get(key)
            if (
                key[0] not in recreated  # rule 6, and no answer said missing (rules 1, 2)
                and end is not None
                and kafka_evidence.known_offset(end)  # rule 5
                and (seen_end is None or end >= seen_end)  # not lower (rule 3)
                and (epoch is None or seen_epoch is None or epoch >= seen_epoch)  # not stale
            ):
                ends[key] = end
                if epoch is not None and epoch != seen_epoch:
                    known_epochs[key] = epoch  # (newer: an older one is not here)
                continue
            verdict = self._judge(key, end, epoch, topic_ids)
            if verdict is Verdict.UNKNOWN:
                stale.append(key)
            elif verdict is Verdict.TRUNCATED:
                truncated.append(key)
            elif verdict is Verdict.RECREATED:
                answers.pop(key, None)  # maybe the old log's: the new one's next answer
        return truncated, stale

    def _judge(
        self,
        key: TopicPartitionKey,
        end: int | None,
        epoch: int | None,
        topic_ids: Mapping[str, str],
    ) -> Verdict:
        """log_verdict's verdict on one answer; what is seen after it is kept."""
        topic = key[0]
        seen = Seen(self._ends.get(key), self._epochs.get(key), self._ids.get(topic))
        answer = Answer(end, epoch, topic_ids.get(topic))
        verdict = judge(seen, answer)
        now = after(seen, answer, verdict)
        if now is not seen:
            _keep(self._ends, key, now.end)
            _keep(self._epochs, key, now.leader_epoch)
        return verdict

    def _drop_stale(
        self, stale: list[TopicPartitionKey], answers: dict[TopicPartitionKey, int]
    ) -> None:
        """UNKNOWN answers: not seen this poll, each said once while it lasts."""
        if self._said:
            self._said &= set(stale)
        for key in stale:
            end = answers.pop(key, None)
            if end is None or key in self._said:
                continue
            self._said.add(key)
            log.warning(
                "%s[%d]'s log end %d is below the %s seen before or from an older leader "
                "epoch, without a newer epoch or another topic id: a stale answer, not taken",
                *key,
                end,
                self._ends.get(key),
            )


def _keep(values: dict[TopicPartitionKey, int], key: TopicPartitionKey, value: int | None) -> None:
    """``values[key] = value``, or no entry for None (nothing seen)."""
    if value is None:
        values.pop(key, None)
    else:
        values[key] = value
