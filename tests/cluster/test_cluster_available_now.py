"""A run under availableNow on three Apache Kafka nodes (issue 32): a partition whose
only replica's node is down when the run starts is waited for, not left unread, while
the others are read. Before, its log end was missing from the plan, it stood still, and
the run's next plan returned its start: Spark ended the run, that partition unread and
its windows open."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from slackwater.kafka_cluster import KafkaCluster
from spark_consumer.source.wire.offset import SourceOffset
from tests.harness.cluster import FAULT_DEADLINE_S, leader_now, leader_of
from tests.harness.factories import wait_until
from tests.harness.source_driver import Driven, options, real


@pytest.mark.timeout(900)
def test_a_run_reads_the_others_and_waits_for_a_partition_whose_leader_is_down(
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
    driven = Driven.start(options(cluster.bootstrap_servers, topic, None))
    cluster.node(down).kill()
    wait_until(lambda: leader_now(admin, topic, 1) == -1, FAULT_DEADLINE_S, "no leader for p1")
    driven.reader.prepareForTriggerAvailableNow()  # Spark: the query runs under availableNow
    read_to: dict[str, object] = {}

    def run() -> None:  # Spark's triggers, until a batch reaches partition 1's end
        while SourceOffset.decode(driven.offset).data[topic]["1"] < 4:
            driven.step()
            read_to["p0"] = SourceOffset.decode(driven.offset).data[topic]["0"]

    caplog.set_level(
        logging.WARNING, logger="spark_consumer.source.driver.planner.run_ends.waiting"
    )
    running = threading.Thread(target=run, daemon=True)
    running.start()
    wait_until(
        lambda: any("the run waits for" in r.getMessage() for r in caplog.records),
        FAULT_DEADLINE_S,
        "the run saying it waits",
    )
    # Partition 0 is read meanwhile; the run waits for partition 1 instead of ending.
    assert running.is_alive() and read_to["p0"] == 3
    said = next(r.getMessage() for r in caplog.records if "the run waits for" in r.getMessage())
    assert f"{topic}[1]" in said and f"{topic}[0]" not in said, said
    cluster.start_nodes([down])
    running.join(3 * FAULT_DEADLINE_S)
    assert not running.is_alive(), "the run still waits with the node back"
    assert sorted(row["partition"] for row in real(driven.rows)) == [0] * 3 + [1] * 4
    driven.stop()
