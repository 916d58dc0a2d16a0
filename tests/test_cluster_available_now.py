"""A run under availableNow on three Apache Kafka nodes (issue 32): a partition whose
only replica's node is down when the run starts is waited for, not left unread. Before,
its log end was missing from the plan, it stood still, and the run's next plan returned
its start: Spark ended the run, that partition unread and its windows open."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable

from slackwater.kafka_cluster import KafkaCluster
from spark_consumer.source.offset import SourceOffset
from spark_consumer.source.options import SourceOptions
from spark_consumer.source.planner import SlackwaterStreamReader
from tests.cluster_harness import FAULT_DEADLINE_S, leader_now, leader_of
from tests.factories import wait_until
from tests.source_driver import options


@pytest.mark.timeout(900)
def test_a_run_waits_for_a_partition_whose_leader_is_down_instead_of_ending_without_it(
    all_nodes_running: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = all_nodes_running
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    up, down = cluster.nodes[0].node_id, cluster.nodes[-1].node_id
    topic = f"c-{uuid.uuid4().hex[:12]}"
    # Partition 0's one replica stays up; partition 1's goes down.
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[up], [down]])])[topic].result(
        FAULT_DEADLINE_S
    )
    for partition in (0, 1):
        leader_of(admin, topic, partition)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 0})
    for partition, records in ((0, 3), (1, 4)):
        for _ in range(records):
            producer.produce(topic, b"{}", partition=partition)
    assert producer.flush(FAULT_DEADLINE_S) == 0
    given = options(cluster.bootstrap_servers, topic, None)
    planner = SlackwaterStreamReader(SourceOptions.parse(given))
    start = planner.initialOffset()
    cluster.node(down).kill()
    wait_until(lambda: leader_now(admin, topic, 1) == -1, FAULT_DEADLINE_S, "no leader for p1")
    planner.prepareForTriggerAvailableNow()  # Spark: the query runs under availableNow
    planned: dict[str, object] = {}

    def plan() -> None:
        planned["offset"] = planner.latestOffset(start, ReadAllAvailable())

    caplog.set_level(logging.WARNING, logger="spark_consumer.source.planner.run_ends.waiting")
    planning = threading.Thread(target=plan, daemon=True)
    planning.start()
    wait_until(
        lambda: any("waits for the log end of" in r.getMessage() for r in caplog.records),
        FAULT_DEADLINE_S,
        "the run saying it waits",
    )
    assert planning.is_alive() and "offset" not in planned  # waiting, not planned without p1
    said = next(r.getMessage() for r in caplog.records if "waits for" in r.getMessage())
    assert f"{topic}[1]" in said and f"{topic}[0]" not in said, said
    cluster.start_nodes([down])
    planning.join(3 * FAULT_DEADLINE_S)
    assert not planning.is_alive(), "the run still waits with the node back"
    offset = planned["offset"]
    assert isinstance(offset, dict)
    assert SourceOffset.decode(offset).data == {topic: {"0": 3, "1": 4}}
    planner.stop()
