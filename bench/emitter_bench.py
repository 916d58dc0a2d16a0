"""The emitter's cost per poll against the number of watched partitions, quiet and busy.

On Apache Kafka (`slackwater broker`'s launcher): topics of 1,000 partitions each (one
topic below 1,000), a record on every partition and a consumer group's committed
offsets, so every poll sends ListOffsets, OffsetFetch and DescribeGroups; metadata is
re-read every 10th poll (the default 1 s poll and 10 s metadata interval: the emitter's
clock advances one poll interval per poll).

Each size is measured in a fresh process (its resident memory is the emitter's), twice:

* quiet: no log end moves between polls (the common case of a large cluster);
* busy: a writer process puts one record on every partition before every poll, so
  every log end has moved (the worst case: all partitions changed).

Per poll: median and max wall ms, mean CPU ms of the whole process (librdkafka's
threads included, time.process_time) and that as % of a core at a 1 s poll; then one
scrape of /metrics (ms and bytes), the process's resident memory (MiB), and, busy, how
many partitions' log ends the emitter held behind the last record written ("behind")
with its failed requests ("errors"). A measuring process that fails or dies ends the
bench with its traceback or exit code, instead of leaving the parent waiting.

    .venv/bin/python -m bench.emitter_bench [--polls 20] [--sizes 100,1000,10000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.topics import create_led
from emitter.config import EmitterConfig
from emitter.service import Emitter
from slackwater.http_server import exposition
from slackwater.kafka_broker import KafkaBroker


def _produce_round(producer: Producer, topics: list[str], per_topic: int) -> None:
    """One record on every partition, delivered (else the round fails: a partition the
    emitter then holds "behind" is the emitter's, not a record that never arrived)."""
    failed: list[str] = []
    for topic in topics:
        for partition in range(per_topic):
            producer.produce(
                topic,
                value=b"{}",
                partition=partition,
                on_delivery=lambda error, _m: failed.append(str(error)) if error else None,
            )
            producer.poll(0)
    left = producer.flush(120)
    if left or failed:
        raise RuntimeError(f"round not delivered: {left} in queue, failures {failed[:3]}")


def _fill(bootstrap: str, topics: list[str], per_topic: int, group: str) -> None:
    _produce_round(Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}), topics, per_topic)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    offsets = [TopicPartition(t, p, 0) for t in topics for p in range(per_topic)]
    deadline = time.monotonic() + 120
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            break
        except KafkaException as error:
            # Right after CreateTopics the group coordinator may not know the topics yet
            # (UNKNOWN_TOPIC_OR_PART, NOT_COORDINATOR): a consumer application retries.
            if error.args[0].code() not in _COMMIT_RETRIABLE or time.monotonic() > deadline:
                raise
            time.sleep(1)
    consumer.close()


_COMMIT_RETRIABLE = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
}


def _writer(bootstrap: str, topics: list[str], per_topic: int, pipe: Connection) -> None:
    """The busy case's writer, in its own process: a round of records per request."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    while pipe.recv():
        _produce_round(producer, topics, per_topic)
        pipe.send(True)


@dataclass(frozen=True)
class Case:
    bootstrap: str
    topics: list[str]
    per_topic: int
    group: str
    polls: int
    busy: bool


def _measure(case: Case) -> dict[str, float]:
    """One size, one mode, in a fresh process."""
    bootstrap, topics, per_topic, polls = case.bootstrap, case.topics, case.per_topic, case.polls
    writer_pipe, writer = None, None
    if case.busy:
        writer_pipe, their_end = multiprocessing.Pipe()
        writer = multiprocessing.get_context("spawn").Process(
            target=_writer, args=(bootstrap, topics, per_topic, their_end), daemon=True
        )
        writer.start()
    config = EmitterConfig(
        bootstrap_servers=bootstrap,
        topics=topics,
        control_topic=f"bench-ctl-{uuid.uuid4().hex[:8]}",
        group=case.group,
        idle_timeout_ms=3_600_000,
        request_timeout_ms=30_000,
    )
    clock = [0.0]
    emitter = Emitter(config, monotonic_s=lambda: clock[0])
    assert emitter.connect(threading.Event())
    emitter.poll_once()  # warm-up: first sight of every partition
    walls, cpus = [], []
    for _ in range(polls):
        if writer_pipe is not None:
            writer_pipe.send(True)
            writer_pipe.recv()
        clock[0] += config.poll_interval_ms / 1000
        wall, cpu = time.perf_counter(), time.process_time()
        emitter.poll_once()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    snapshot = emitter.snapshot()
    watched = len(snapshot.partitions)
    assert watched == per_topic * len(topics), f"watched {watched}"
    # Busy: every partition got a record before every poll, so after the polls each log
    # end the emitter holds is polls + 1. One behind means its last answer for that
    # partition failed or came from a stale leader: reported (with the emitter's own
    # error counts), not asserted, so a run under load still prints its row.
    # Ahead: a log end past the records the bench wrote (a produce request the writer's
    # librdkafka retried after it had been written: duplicates, not the emitter's).
    log_ends = [row.log_end_offset or 0 for row in snapshot.partitions] if case.busy else []
    behind = sum(end < polls + 1 for end in log_ends)
    ahead = sum(end > polls + 1 for end in log_ends)
    registry = emitter.metrics.registry
    errors = sum(
        registry.get_sample_value("slackwater_emitter_poll_errors_total", {"request": kind}) or 0
        for kind in ("metadata", "list_offsets", "group_offsets", "describe_group")
    )
    started = time.perf_counter()
    body = exposition(emitter.metrics.registry, "", emitter.metrics.partition_text)
    scrape_ms = (time.perf_counter() - started) * 1000
    emitter.close()
    if writer_pipe is not None and writer is not None:
        writer_pipe.send(False)
        writer.join(30)
    return {
        "wall_median_ms": statistics.median(walls),
        "wall_max_ms": max(walls),
        "cpu_ms": statistics.mean(cpus),
        "scrape_ms": scrape_ms,
        "scrape_bytes": len(body[0]),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "behind": behind,
        "ahead": ahead,
        "poll_errors": errors,
    }


def _measure_into(case: Case, pipe: Connection) -> None:
    try:
        pipe.send(("ok", _measure(case)))
    except BaseException:
        pipe.send(("failed", traceback.format_exc()))  # printed once, by the parent


# Far above a measurement at 10,000 partitions (about a minute): only a hang reaches it.
MEASURING_TIMEOUT_S = 1800


class MeasuringFailed(RuntimeError):
    """The measuring process failed or died; its traceback or exit code is the message."""


def _in_fresh_process(case: Case) -> dict[str, float]:
    # A plain process, not a Pool's (daemonic, it could not start the busy writer).
    ours, theirs = multiprocessing.Pipe()
    spawn = multiprocessing.get_context("spawn")
    process = spawn.Process(target=_measure_into, args=(case, theirs))
    process.start()
    theirs.close()  # the child's end only in the child: its death is EOF here, not a hang
    try:
        if not ours.poll(MEASURING_TIMEOUT_S):
            process.kill()
            raise MeasuringFailed(f"the measuring process gave nothing in {MEASURING_TIMEOUT_S}s")
        outcome, result = ours.recv()
    except EOFError:
        process.join(60)
        raise MeasuringFailed(
            f"the measuring process died (exit code {process.exitcode})"
        ) from None
    process.join(60)
    if outcome != "ok":
        raise MeasuringFailed(f"the measuring process failed:\n{result}")
    measured: dict[str, float] = result
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=20)
    parser.add_argument("--sizes", default="100,1000,10000")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    print(
        f"{'partitions':>10} {'mode':>5} {'median ms':>10} {'max ms':>8} {'CPU ms':>7} "
        f"{'CPU %':>6} {'/metrics ms':>11} {'/metrics KiB':>12} {'RSS MiB':>8} "
        f"{'behind':>6} {'ahead':>6} {'errors':>6}"
    )
    with KafkaBroker() as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for partitions in sizes:
            topics, per_topic = create_led(admin, "bench", partitions)
            group = f"bench-{uuid.uuid4().hex[:8]}"
            _fill(bootstrap, topics, per_topic, group)
            for busy in (False, True):
                row = _in_fresh_process(Case(bootstrap, topics, per_topic, group, args.polls, busy))
                print(
                    f"{partitions:>10,} {'busy' if busy else 'quiet':>5} "
                    f"{row['wall_median_ms']:>10.1f} {row['wall_max_ms']:>8.1f} "
                    f"{row['cpu_ms']:>7.1f} {row['cpu_ms'] / 10:>5.1f}% "
                    f"{row['scrape_ms']:>11.1f} {row['scrape_bytes'] / 1024:>12,.0f} "
                    f"{row['rss_mib']:>8.0f} {row['behind']:>6.0f} {row['ahead']:>6.0f} "
                    f"{row['poll_errors']:>6.0f}",
                    flush=True,
                )
            admin.delete_topics(topics, request_timeout=120)


if __name__ == "__main__":
    main()
