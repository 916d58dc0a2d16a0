"""``slackwater demo``: the main job on the embedded broker, end to end.

Everything real, in one process: the embedded Kafka broker (Tansu), an
8-partition data topic and a compacted control topic, a scripted producer,
the emitter sidecar (in a thread) and the Spark consumer (local SparkSession).
A live terminal view shows each partition as the emitter and the consumer
see it, the valve, windows and late records; a summary follows.

Script, as shares of ``--duration`` D (event time = wall clock, every
record up to 0.8 s out of order, within the 1 s bound):

    0 ........ 0.2D ........ 0.25D .... 0.35D ........ 0.6D ........ D
    p0-p4, p6: steady traffic all along
    p5:  traffic | quiet (the emitter marks it IDLE)   | traffic again
    p7:  traffic ............ | stops | finished with `slackwater finish`
"""

from __future__ import annotations

import gc
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from emitter.config import EmitterConfig
from emitter.control_topic import ControlTopicWriter
from emitter.embedded_broker import EmbeddedBroker
from emitter.markers import FinishRequest, MarkerStatus
from emitter.service import Emitter
from spark_consumer.alignment import MarkerAligner
from spark_consumer.config import ConsumerConfig
from spark_consumer.pipeline import BatchReport, load_report_lines, spark_session, start
from spark_consumer.valve import MAX_WATERMARK, MIN_WATERMARK

PARTITIONS = 8
QUIET, FINISHED_PARTITION = 5, 7
RECORDS_PER_SECOND = 8
DATA_TOPIC, CONTROL_TOPIC = "demo-events", "demo-control"


@dataclass
class DemoState:
    """What the live view and the summary show; written by the callbacks."""

    reports: list[BatchReport] = field(default_factory=list)
    aligner: MarkerAligner | None = None
    produced: Counter[int] = field(default_factory=Counter)
    windows_while_quiet_idle: int = 0
    events: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_batch(self, report: BatchReport, aligner: MarkerAligner) -> None:
        with self.lock:
            self.reports.append(report)
            self.aligner = aligner
            if (
                QUIET in aligner.partitions
                and report.windows_emitted
                and aligner.status_of(QUIET) is MarkerStatus.IDLE
            ):
                self.windows_while_quiet_idle += report.windows_emitted


def produce_script(
    bootstrap: str,
    duration_s: float,
    state: DemoState,
    stop: threading.Event,
    *,
    topic: str = DATA_TOPIC,
    control_topic: str = CONTROL_TOPIC,
) -> None:
    """The demo's producer script (module docstring), from now for ``duration_s``."""
    started = time.monotonic()
    # One record per request: the embedded broker's log end stays exact (DESIGN §7).
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    rng = random.Random(42)
    finish_sent = False
    while not stop.is_set():
        elapsed = time.monotonic() - started
        if elapsed >= duration_s:
            break
        for partition in range(PARTITIONS):
            quiet = partition == QUIET and 0.2 * duration_s <= elapsed < 0.6 * duration_s
            ended = partition == FINISHED_PARTITION and elapsed >= 0.25 * duration_s
            if quiet or ended:
                continue
            event_ms = time.time_ns() // 1_000_000 - rng.randrange(0, 800)
            producer.produce(
                topic,
                key=f"sensor-{partition}".encode(),
                value=b"{}",
                partition=partition,
                timestamp=event_ms,
            )
            producer.flush(10)
            with state.lock:
                state.produced[partition] += 1
        if not finish_sent and elapsed >= 0.35 * duration_s:
            writer = ControlTopicWriter(bootstrap, control_topic, {}, 10.0)
            writer.write(
                FinishRequest(
                    topic=topic,
                    partition=FINISHED_PARTITION,
                    requested_at=time.time_ns() // 1_000_000,
                    requested_by="slackwater demo",
                )
            )
            writer.close()
            finish_sent = True
            with state.lock:
                state.events.append(f"{elapsed:5.1f}s  slackwater finish p{FINISHED_PARTITION}")
        stop.wait(1 / RECORDS_PER_SECOND)


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
        aligner, reports = state.aligner, list(state.reports)
        produced = dict(state.produced)
        events = list(state.events[-4:])
    emitter_status = {p: s.status.value for (_, p), s in emitter.detector.partitions.items()}
    for partition in range(PARTITIONS):
        consumer = "-"
        watermark = "-"
        if aligner is not None and partition in aligner.partitions:
            consumer = aligner.status_of(partition).value
            watermark = _clock(aligner.valve.channel_watermark(partition))
        table.add_row(
            f"p{partition}",
            str(produced.get(partition, 0)),
            emitter_status.get(partition, "-"),
            consumer,
            watermark,
        )
    summary = Table.grid(padding=(0, 2))
    valve = (
        "-"
        if aligner is None
        else (f"{_clock(aligner.valve.watermark)}  {aligner.valve.status.value}")
    )
    summary.add_row("valve", valve)
    summary.add_row("micro-batches", str(len(reports)))
    summary.add_row("windows emitted", str(sum(r.windows_emitted for r in reports)))
    summary.add_row("late records", str(sum(r.late for r in reports)))
    for event in events:
        summary.add_row("", event)
    return Group(table, summary)


def run_live_demo(
    duration_s: float = 90.0, output_dir: Path | None = None, console: Console | None = None
) -> int:
    console = console or Console()
    output_dir = output_dir or Path(tempfile.mkdtemp(prefix="slackwater-demo-"))
    state = DemoState()
    stop = threading.Event()
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        console.print(f"embedded Kafka broker (Tansu) on {bootstrap}; output in {output_dir}")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics(
            [
                NewTopic(DATA_TOPIC, num_partitions=PARTITIONS, replication_factor=1),
            ]
        ).values():
            future.result(10)
        del admin
        emitter = Emitter(
            EmitterConfig(
                bootstrap_servers=bootstrap,
                topics=[DATA_TOPIC],
                control_topic=CONTROL_TOPIC,
                idle_timeout_ms=5_000,
                poll_interval_ms=500,
                metadata_interval_ms=2_000,
                metrics_port=0,
                emitter_id="demo-emitter",
            )
        )
        emitter_thread = threading.Thread(target=emitter.run, args=(stop,), daemon=True)
        emitter_thread.start()
        console.print("starting Spark (local[2]) ...")
        spark = spark_session("slackwater-demo")
        spark.sparkContext.setLogLevel("ERROR")
        config = ConsumerConfig(
            bootstrap_servers=bootstrap,
            topic=DATA_TOPIC,
            control_topic=CONTROL_TOPIC,
            window_ms=5_000,
            max_out_of_orderness_ms=1_000,
            trigger_ms=1_000,
            output=str(output_dir / "windows"),
            checkpoint=str(output_dir / "checkpoint"),
            metrics_port=None,
        )
        started = time.monotonic()
        producer = threading.Thread(
            target=produce_script, args=(bootstrap, duration_s, state, stop), daemon=True
        )
        producer.start()
        query = start(spark, config, on_batch=state.on_batch)
        try:
            with Live(console=console, refresh_per_second=4) as live:
                while producer.is_alive():
                    elapsed = time.monotonic() - started
                    live.update(_view(state, emitter, elapsed, duration_s))
                    if query.exception() is not None:
                        break
                    time.sleep(0.25)
                query.processAllAvailable()
                live.update(_view(state, emitter, time.monotonic() - started, duration_s))
        finally:
            stop.set()
            if query.isActive:
                query.stop()
            spark.stop()
            emitter_thread.join(30)
            markers = _markers_published(emitter)
            failure = query.exception()
            del emitter, query  # their Kafka clients go before the broker does
            gc.collect()
    return _summary(console, state, markers, output_dir, failure)


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
    windows = load_report_lines(output_dir / "windows")
    late = sum(r.late for r in state.reports)
    console.print()
    console.print(f"records produced        {sum(state.produced.values())}")
    console.print(f"micro-batches           {len(state.reports)}")
    console.print(f"windows emitted         {len(windows)} (window-key rows)")
    console.print(f"  while p{QUIET} was IDLE    {state.windows_while_quiet_idle}")
    console.print(f"late records            {late} (0 expected)")
    console.print(f"markers published       {markers}")
    console.print(f"windows written to      {output_dir / 'windows'}")
    if failure is not None:
        console.print(f"[red]the streaming query failed: {failure}[/red]")
        return 1
    ok = late == 0 and len(windows) > 0 and state.windows_while_quiet_idle > 0
    return 0 if ok else 1
