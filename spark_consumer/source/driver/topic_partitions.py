"""The plan's partitions follow the broker's (docs/source.md, "What production brings"):
partitions that appear join as channels, partitions whose offsets went back follow
failOnDataLoss, partitions gone from the broker leave as FINISHED.

``partition_identity`` judges what happened from Kafka's answers; this room
changes the plan and the aligner accordingly.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import Any

from confluent_kafka import KafkaException

from slackwater.list_offsets import Answers
from spark_consumer.alignment import PartitionBatch
from spark_consumer.source.driver.partition_identity import PartitionIdentity
from spark_consumer.source.driver.plan import Plan
from spark_consumer.source.driver.plan_answers import PlanAnswers
from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.shared.options import SourceError, SourceOptions, channel

# Under the planner's logger, whose lines these were before the planner had rooms.
log = logging.getLogger("spark_consumer.source.driver.planner").getChild("partitions")


def follow(
    plan: Plan,
    now: PlanAnswers,
    batch: dict[Any, PartitionBatch],
    kafka: PlannerClient,
    *,
    identity: PartitionIdentity,
    joining: dict[str, int] | None = None,
) -> None:
    """The plan's partitions made to match the broker's listing.

    * A partition the broker lists that the plan does not (a new topic or partition)
      starts at its earliest offset, as a new channel.
    * A new log (the topic re-created, or truncated below the position): failOnDataLoss
      stops the query (``PartitionIdentity.went_back`` raises), or the partition starts
      again at its earliest offset, the records lost counted; its last batch no longer
      counts.

    ``joining``: the partitions per topic that may join now (a run under availableNow:
    those there when it started); the broker's listing otherwise.
    """
    went_back = identity.went_back(plan.data, now)
    _count_lost(plan, identity)
    counts = now.counts if joining is None else joining
    listed = [(t, p) for t, count in counts.items() for p in range(count)]
    new = [(t, p) for t, p in listed if str(p) not in plan.data.get(t, {})]
    try:
        starts = kafka.list_offsets(new + went_back, "earliest")
    except KafkaException as error:
        # No answer in time (a leader just died): they stand still until one comes.
        log.info("earliest offsets not answered (%s): asked again next trigger", error)
        starts = Answers()
    new_set = set(new)
    for (topic, partition), offset in starts.items():
        if (topic, partition) in new_set:
            plan.data.setdefault(topic, {})[str(partition)] = offset  # a new range starts here
            continue
        # Offsets that went back (failOnDataLoss=false): read again from the earliest
        # (one whose earliest is not known yet stands still until it is).
        log.warning(
            "%s[%d] is a new log (re-created, or truncated below this query's position): "
            "read again from its earliest offset %d (failOnDataLoss=false)",
            topic,
            partition,
            offset,
        )
        plan.data[topic][str(partition)] = offset
        identity.started_again((topic, partition))
        plan.aligner.restart_at(channel(topic, partition), offset)
        batch.pop(channel(topic, partition), None)
        plan.count("offsets_went_back")
    for key in set(went_back) - starts.keys():
        # Gone back, its earliest offset not answered yet: no range this plan, not even
        # one to the new log's end past the old position (it would be read twice).
        now.latest.pop(key, None)
    # (The aligner has a channel for every partition the plan reads: only new ones.)
    positions: dict[Hashable, int] = {
        channel(t, p): plan.data[t][str(p)] for t, p in new if str(p) in plan.data.get(t, {})
    }
    plan.aligner.ensure_partitions(positions, positions)


def drop_unsubscribed(plan: Plan, options: SourceOptions, identity: PartitionIdentity) -> None:
    """Topics the options no longer subscribe (changed across a restart: docs/source.md,
    "Options on restart") follow failOnDataLoss, as partitions gone do in Spark's Kafka
    source: true stops the query in one line naming them (a topic dropped by mistake is
    not dropped for good); false drops them: not read any more, their partitions count
    as FINISHED as a deleted topic's do (their last batch's progress applied first)."""
    dropped = sorted(t for t in plan.data if not options.subscribes(t))
    if dropped and options.fail_on_data_loss:
        option = "subscribePattern" if options.topic_pattern is not None else "subscribe"
        raise SourceError(
            f"option {option!r} no longer takes topic(s) {', '.join(dropped)}, which this "
            "checkpoint reads: their records not read yet would be missed; subscribe to "
            "them again, or set failOnDataLoss=false to drop them (not read any more, their "
            "partitions FINISHED)"
        )
    for topic in dropped:
        numbers = sorted(plan.data.pop(topic), key=int)
        for partition in numbers:
            identity.forget((topic, int(partition)), last_of_topic=partition == numbers[-1])
            plan.aligner.finish(channel(topic, partition))
            plan.count("partitions_unsubscribed")
            log.warning(
                "%s[%s] is no longer subscribed: it is not read any more and counts as FINISHED",
                topic,
                partition,
            )


def drop_vanished(plan: Plan, now: PlanAnswers, identity: PartitionIdentity) -> None:
    """Partitions the broker no longer lists (``PartitionIdentity.vanished``) leave the reading and
    count as FINISHED, what the emitter's FINISHED@log_end says of a deleted topic."""
    vanished = identity.vanished(plan.data, now)
    _count_lost(plan, identity)
    for topic, partition in vanished:
        plan.data[topic].pop(str(partition))
        if not plan.data[topic]:
            del plan.data[topic]
        identity.forget((topic, partition), last_of_topic=topic not in plan.data)
        plan.aligner.finish(channel(topic, partition))
        plan.count("partitions_deleted")
        log.warning(
            "%s[%d] is gone from the broker (topic deleted or re-created with fewer "
            "partitions): it counts as FINISHED",
            topic,
            partition,
        )


def _count_lost(plan: Plan, identity: PartitionIdentity) -> None:
    """Records the data-loss policy let go (failOnDataLoss=false) count in the offset."""
    lost = identity.take_records_lost()
    if lost:
        plan.count("records_lost", lost)
