"""The progress topic made where it is missing, as the planner makes it: a topic of one
partition with a time retention of its own (its readers' progress records are needed
only until the next plan; a broker's default may keep them forever)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from slackwater import kafka_clients, kafka_evidence
from spark_consumer.source.driver.planner_client import PlannerClient
from spark_consumer.source.shared.options import SourceError


def ensure_progress_topic(kafka: PlannerClient) -> None:
    """Makes the progress topic if it is not there, with a time retention of its own
    (a restart needs only the last batch's records, and copes without them): the
    broker's default may be infinite or size-only."""
    name, admin, timeout_s = (
        kafka.options.progress_topic,
        kafka.admin,
        kafka.options.request_timeout_s,
    )
    if not kafka_clients.not_listed(admin.list_topics(timeout=timeout_s), [name]):
        return
    # Not listed: not there, or there but not the principal's to describe (a broker
    # lists only those): asked for by name, a refusal says Describe, not Create.
    answer = kafka_clients.asked_by_name(admin, [name], timeout_s)[name]
    if answer is None:
        return
    refused = kafka.options.refused(answer, f"describe progress topic {name}")
    if refused:
        raise refused
    config = {
        "cleanup.policy": "delete",
        "retention.ms": str(kafka.options.progress_retention_ms),
    }
    made = NewTopic(name, num_partitions=1, replication_factor=-1, config=config)
    try:
        kafka_clients.create_topic(admin, made, timeout_s)
    except KafkaException as error:
        reason = error.args[0] if error.args else None
        if isinstance(reason, KafkaError) and kafka_evidence.not_answered(reason):
            raise  # the broker is away, not a refusal: its callers wait for it
        raise kafka.options.refused(error.args[0], f"create progress topic {name}") or SourceError(
            f"cannot create progress topic {name!r}: {error}"
        ) from error
