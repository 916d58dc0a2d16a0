"""``slackwater demo``: the main job on a local Apache Kafka, end to end.

Everything real: Apache Kafka (one KRaft node it starts itself), an
8-partition data topic and a compacted control topic, a scripted producer,
the emitter sidecar (in a thread) and the Spark consumer (local SparkSession).
A live terminal view shows each partition as the emitter and the consumer
see it, the valve, windows and late records; a summary follows.

The script (producer_script.py): steady traffic on p0-p4 and p6, p3's records
delivered late by a slow upstream, p5 quiet for a while (IDLE), p7 stopped and
finished with `slackwater finish`.

Why plain Spark's loss (--compare) does not depend on the machine's speed: see
``PLAIN_SPARK_MAX_OFFSETS`` below, and docs/decisions.md.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from confluent_kafka.admin import NewTopic
from pyspark.sql.streaming.query import StreamingQuery
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from demo.chart import Sample, write_chart
from demo.producer_script import (
    CONTROL_TOPIC,
    DATA_TOPIC,
    LAGGING,
    PARTITIONS,
    QUIET,
    produce_script,
)
from emitter.config import EmitterConfig
from emitter.service import Emitter
from slackwater import kafka_clients
from slackwater.kafka_broker import KafkaBroker
from slackwater.kafka_logging import LOGGER_NAME as LIBRDKAFKA_LOGGER
from slackwater.markers import MarkerStatus
from spark_consumer.consume.config import ConsumerConfig
from spark_consumer.consume.job import (
    committed_rows,
    plain_spark_output,
    spark_session,
    start,
    windows_emitted,
)
from spark_consumer.source.metrics import offsets_in, partitions_of
from spark_consumer.valve import MAX_WATERMARK, MIN_WATERMARK

WINDOW_MS, OUT_OF_ORDERNESS_MS = 5_000, 1_000
# --compare: plain Spark reads with maxOffsetsPerTrigger, as production jobs do. Spark
# drops a row of batch N when its window ended by the watermark of batch N-1 (SPARK-40925),
# max(event time over batches <= N-2) - delay: a row read in the same batch as the rows
# that move the watermark past its window, or in the next, is never late. Without a cap,
# how far a batch reaches depends on how long the last one took, so a busy machine hid
# every loss. With this cap (split over partitions in proportion to their backlog) no
# batch holds more than 17 rounds of any of the six partitions that write every round
# (p0-p4, p6), and their read positions stay within one round of each other. So
# the first p3 row of a batch N is at most 19 rounds after p0's newest row in batches
# <= N-2, which was stamped at least 80 - 19 = 61 rounds (7.6 s) after that p3 row: more
# than a window (5 s) + the delay (1 s) + the largest jitter (0.8 s). The p3 row's window
# has ended by batch N's late-row watermark, whatever the machine's speed, in every batch
# that reads p3's rows from its 40th round on (docs/decisions.md).
PLAIN_SPARK_MAX_OFFSETS = 96


@dataclass
class DemoState:
    """What the live view and the summary show, followed from the query's progress."""

    batches: int = 0
    last_batch: int = -1
    windows_emitted: int = 0
    valve_watermark_ms: int = MIN_WATERMARK
    valve_status: str = "-"
    partitions: dict[int, tuple[str, int]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    produced: Counter[int] = field(default_factory=Counter)
    windows_while_quiet_idle: int = 0
    events: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    plain_spark_lost: Counter[str] | None = None  # records per key (--compare)
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def follow(self, query: StreamingQuery) -> None:
        """Takes in the micro-batches the query finished since the last call."""
        for progress in query.recentProgress:
            if progress.batchId <= self.last_batch:
                continue
            offsets = offsets_in(progress)
            with self.lock:
                self.last_batch = progress.batchId
                self.batches += 1
                emitted = windows_emitted(progress)
                self.windows_emitted += emitted
                if not offsets:
                    continue
                offset = offsets[0]
                self.valve_watermark_ms = offset.watermark
                self.valve_status = offset.status
                self.counters = dict(offset.counters)
                self.partitions = {
                    int(channel.rpartition(":")[2]): view
                    for channel, view in partitions_of(offset).items()
                }
                if self.partitions.get(QUIET, ("",))[0] == MarkerStatus.IDLE.value:
                    self.windows_while_quiet_idle += emitted
                self.samples.append(
                    Sample(
                        wall_s=time.monotonic() - self.started,
                        valve_watermark_ms=self.valve_watermark_ms,
                        partition_watermark_ms={p: w for p, (_, w) in self.partitions.items()},
                        partition_status={
                            p: MarkerStatus(status) for p, (status, _) in self.partitions.items()
                        },
                    )
                )


def _clock(ms: int) -> str:
    if ms == MIN_WATERMARK:
        return "-"
    if ms == MAX_WATERMARK:
        return "MAX"
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}"


def _view(state: DemoState, emitter: Emitter, elapsed: float, duration_s: float) -> Group:
    table = Table(title=f"slackwater demo  {elapsed:5.1f}s / {duration_s:.0f}s", expand=False)
    for column in ("partition", "produced", "emitter", "consumer", "watermark (UTC)"):
        table.add_column(column)
    with state.lock:
        partitions = dict(state.partitions)
        produced = dict(state.produced)
        events = list(state.events[-4:])
        valve = f"{_clock(state.valve_watermark_ms)}  {state.valve_status}"
        batches, windows_emitted = state.batches, state.windows_emitted
        dropped = state.counters.get("records_dropped", 0)
    # The emitter's public snapshot (taken under its lock); the demo watches one topic.
    emitter_status = {row.partition: row.status.value for row in emitter.snapshot().partitions}
    for partition in range(PARTITIONS):
        consumer, watermark = partitions.get(partition, ("-", MIN_WATERMARK))
        table.add_row(
            f"p{partition}",
            str(produced.get(partition, 0)),
            emitter_status.get(partition, "-"),
            consumer,
            _clock(watermark),
        )
    summary = Table.grid(padding=(0, 2))
    summary.add_row("valve", valve)
    summary.add_row("micro-batches", str(batches))
    summary.add_row("windows emitted", str(windows_emitted))
    summary.add_row("records dropped as late", str(dropped))
    for event in events:
        summary.add_row("", event)
    return Group(table, summary)


def run_live_demo(
    duration_s: float = 90.0,
    output_dir: Path | None = None,
    console: Console | None = None,
    compare: bool = False,
) -> int:
    """Broker, topic, emitter, the consume job, then the script: live until it ends."""
    console = console or Console(soft_wrap=True)
    # librdkafka's warnings while a fresh broker starts (its coordinators loading) sort
    # themselves out: the demo shows errors only.
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.ERROR)
    output_dir = output_dir or Path(tempfile.mkdtemp(prefix="slackwater-demo-"))
    state = DemoState()
    stop = threading.Event()
    with KafkaBroker() as broker:
        bootstrap = broker.bootstrap_servers
        console.print(f"Apache Kafka (KRaft) on {bootstrap}; output in {output_dir}")
        _create_data_topic(bootstrap)
        emitter = Emitter(_emitter_config(bootstrap))
        emitter_thread = threading.Thread(target=emitter.run, args=(stop,), daemon=True)
        console.print("starting Spark (local[2]) ...")
        spark = spark_session("slackwater-demo")
        config = _consumer_config(bootstrap, output_dir, compare)
        job = start(spark, config, plain_max_offsets_per_trigger=PLAIN_SPARK_MAX_OFFSETS)
        query, plain = job.query, job.plain_spark
        # The emitter and the script start once the consumer's trigger loop runs,
        # so that what they show happens while the consumer is live, however long
        # Spark took to start (and no empty partition is marked IDLE meanwhile).
        _wait_for_trigger_loop(query)
        emitter_thread.start()
        producer = _start_script(bootstrap, duration_s, state, stop)
        try:
            _watch(
                console,
                state,
                emitter=emitter,
                query=query,
                producer=producer,
                duration_s=duration_s,
            )
            stop.set()  # the emitter stops: no new markers, so no new micro-batch
            emitter_thread.join(30)
            query.processAllAvailable()
            state.follow(query)
            if plain is not None:
                plain.processAllAvailable()
                _print_comparison(console, config, state, plain)
        finally:
            stop.set()
            job.stop()
            spark.stop()
            emitter_thread.join(30)
            markers = _markers_published(emitter)
            failure = query.exception()
            del emitter, query, plain, job  # their Kafka clients go before the broker does
            gc.collect()
    return _summary(console, state, markers, output_dir, failure)


def _start_script(
    bootstrap: str, duration_s: float, state: DemoState, stop: threading.Event
) -> threading.Thread:
    """The producer script, in a thread from now: the live view's clock and the chart's
    time axis start with it."""
    with state.lock:
        state.started = time.monotonic()
        state.samples.clear()  # the chart's time axis is the script's
    producer = threading.Thread(
        target=produce_script, args=(bootstrap, duration_s, state, stop), daemon=True
    )
    producer.start()
    return producer


def _create_data_topic(bootstrap: str) -> None:
    admin = kafka_clients.admin_client("demo", bootstrap)
    topic = NewTopic(DATA_TOPIC, num_partitions=PARTITIONS, replication_factor=1)
    for future in admin.create_topics([topic]).values():
        future.result(10)


def _emitter_config(bootstrap: str) -> EmitterConfig:
    """The demo's emitter: a 5 s idle timeout, so that idleness shows within the script."""
    return EmitterConfig(
        bootstrap_servers=bootstrap,
        topics=[DATA_TOPIC],
        control_topic=CONTROL_TOPIC,
        idle_timeout_ms=5_000,
        poll_interval_ms=500,
        metadata_interval_ms=2_000,
        metrics_port=0,
        emitter_id="demo-emitter",
    )


def _consumer_config(bootstrap: str, output_dir: Path, compare: bool) -> ConsumerConfig:
    """`slackwater consume`'s job: 5 s windows, 1 s out-of-orderness, a 1 s trigger."""
    return ConsumerConfig(
        bootstrap_servers=bootstrap,
        topics=(DATA_TOPIC,),
        control_topic=CONTROL_TOPIC,
        window_ms=WINDOW_MS,
        max_out_of_orderness_ms=OUT_OF_ORDERNESS_MS,
        trigger_ms=1_000,
        output=str(output_dir / "windows"),
        checkpoint=str(output_dir / "checkpoint"),
        metrics_port=None,
        compare=compare,
    )


def _wait_for_trigger_loop(query: StreamingQuery, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while (
        query.exception() is None
        and time.monotonic() < deadline
        and "Waiting" not in str(query.status.get("message", ""))
    ):
        time.sleep(0.2)


def _watch(
    console: Console,
    state: DemoState,
    *,
    emitter: Emitter,
    query: StreamingQuery,
    producer: threading.Thread,
    duration_s: float,
) -> None:
    """The live view, until the script ended and the emitter marked every partition.

    The input stops at the end of the script; the emitter then marks every
    partition IDLE, the valve flushes and the last windows close.
    """
    quiet_until: float | None = None
    with Live(console=console, refresh_per_second=4) as live:
        while query.exception() is None:
            state.follow(query)
            live.update(_view(state, emitter, time.monotonic() - state.started, duration_s))
            if not producer.is_alive():
                quiet_until = quiet_until or time.monotonic() + 8.0
                if time.monotonic() > quiet_until or _all_marked(emitter):
                    break
            time.sleep(0.25)
        live.update(_view(state, emitter, time.monotonic() - state.started, duration_s))


def _all_marked(emitter: Emitter) -> bool:
    """Every partition IDLE or FINISHED at the emitter (the input has stopped)."""
    rows = emitter.snapshot().partitions
    return bool(rows) and all(row.status is not MarkerStatus.ACTIVE for row in rows)


def _print_comparison(
    console: Console, config: ConsumerConfig, state: DemoState, plain: StreamingQuery
) -> None:
    ours = {(r["window_start"], r["key"]): int(r["count"]) for r in committed_rows(config.output)}
    theirs = {
        (r["window_start"], r["key"]): int(r["count"])
        for r in committed_rows(plain_spark_output(config))
    }
    # Windows both queries have closed: each has emitted every row it counted in them (a
    # window whose every record plain Spark dropped has no row there at all).
    closed_before_ms = min(state.valve_watermark_ms, _watermark_ms(plain))
    lost = plain_spark_losses(ours, theirs, closed_before_ms)
    console.print()
    table = Table(title="the same input, side by side")
    for column in ("", "slackwater", "Spark's Kafka source + withWatermark"):
        table.add_column(column)
    table.add_row("window-key rows emitted", str(len(ours)), str(len(theirs)))
    both = set(ours) & set(theirs)
    table.add_row(
        "records counted in the windows both emitted",
        str(sum(ours[k] for k in both)),
        str(sum(theirs[k] for k in both)),
    )
    table.add_row(
        "records dropped as late",
        str(state.counters.get("records_dropped", 0)),
        f"{sum(lost.values())} (silently; p{LAGGING}'s: {lost[f'sensor-{LAGGING}']})",
    )
    console.print(table)
    state.plain_spark_lost = lost


def plain_spark_losses(
    ours: dict[tuple[str, str], int], theirs: dict[tuple[str, str], int], closed_before_ms: int
) -> Counter[str]:
    """Per key, the records slackwater counted and plain Spark did not, over the windows
    (window start, key) -> count that ended at or before ``closed_before_ms``."""
    lost: Counter[str] = Counter()
    for (window_start, key), count in ours.items():
        if _iso_ms(window_start) + WINDOW_MS <= closed_before_ms:
            lost[key] += count - theirs.get((window_start, key), 0)
    return lost


def _iso_ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).timestamp() * 1000)


def _watermark_ms(query: StreamingQuery) -> int:
    """The watermark Spark applied in the query's last batch (MIN_WATERMARK: none yet)."""
    progress = query.lastProgress
    watermark = progress.eventTime.get("watermark") if progress is not None else None
    return _iso_ms(watermark) if watermark else MIN_WATERMARK


def _markers_published(emitter: Emitter) -> dict[str, int]:
    registry = emitter.metrics.registry
    return {
        status.value: int(
            registry.get_sample_value(
                "slackwater_emitter_markers_published_total", {"status": status.value}
            )
            or 0
        )
        for status in MarkerStatus
    }


def _summary(
    console: Console,
    state: DemoState,
    markers: dict[str, int],
    output_dir: Path,
    failure: object,
) -> int:
    windows = committed_rows(output_dir / "windows")
    dropped = state.counters.get("records_dropped", 0)
    chart = (
        write_chart(state.samples, output_dir / "slackwater-demo.png") if state.samples else None
    )
    console.print()
    console.print(f"records produced        {sum(state.produced.values())}")
    console.print(f"micro-batches           {state.batches}")
    console.print(f"windows emitted         {len(windows)} (window-key rows)")
    console.print(f"  while p{QUIET} was IDLE    {state.windows_while_quiet_idle}")
    console.print(f"late records            {dropped} (0 expected)")
    console.print(f"markers published       {markers}")
    console.print(f"windows written to      {output_dir / 'windows'}")
    console.print(f"chart                   {chart}")
    if state.plain_spark_lost is not None:
        lost = state.plain_spark_lost
        console.print(
            f"plain Spark lost        {sum(lost.values())} records, "
            f"{lost[f'sensor-{LAGGING}']} of them p{LAGGING}'s (Spark's Kafka source, --compare)"
        )
    if failure is not None:
        first_line = str(failure).strip().splitlines()[0]
        console.print(f"[red]the streaming query failed: {first_line}[/red]")
        return 1
    return 0 if dropped == 0 and windows else 1
