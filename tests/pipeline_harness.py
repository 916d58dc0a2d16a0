"""Running the slackwater pipeline in the shared SparkSession, for integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from emitter.markers import Marker, MarkerStatus, encode
from spark_consumer.alignment import MarkerAligner
from spark_consumer.config import ConsumerConfig
from spark_consumer.pipeline import BatchReport, load_report_lines, start

BASE_MS = 1_700_000_000_000  # event times are BASE_MS + seconds * 1000


class Writer:
    """Data records and markers, one record per request (exact log ends, DESIGN §7)."""

    def __init__(self, bootstrap: str, topic: str, control_topic: str) -> None:
        self.topic, self.control_topic = topic, control_topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.log_end: dict[int, int] = {}
        self.seq = 0

    def data(self, partition: int, *seconds: float, key: str = "k") -> None:
        for second in seconds:
            self.producer.produce(
                self.topic,
                key=key.encode(),
                value=b"{}",
                partition=partition,
                timestamp=BASE_MS + int(second * 1000),
            )
            assert self.producer.flush(10) == 0
            self.log_end[partition] = self.log_end.get(partition, 0) + 1

    def marker(self, partition: int, status: MarkerStatus, offset: int | None = None) -> None:
        marker = Marker(
            topic=self.topic,
            partition=partition,
            status=status,
            offset=self.log_end.get(partition, 0) if offset is None else offset,
            emitted_at=0,
            emitter_id="test",
            epoch=1,
            seq=self.seq,
        )
        self.seq += 1
        self.raw_control(*encode(marker))

    def raw_control(self, key: bytes | None, value: bytes | None) -> None:
        self.producer.produce(self.control_topic, key=key, value=value)
        assert self.producer.flush(10) == 0


@dataclass
class PipelineRun:
    query: StreamingQuery
    output: Path
    late_output: Path
    reports: list[BatchReport] = field(default_factory=list)
    aligner: MarkerAligner | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_batch(self, report: BatchReport, aligner: MarkerAligner) -> None:
        with self._lock:
            self.reports.append(report)
            self.aligner = aligner

    def wait_for(
        self, predicate: Callable[[PipelineRun], Any], timeout_s: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            failure = self.query.exception()
            assert failure is None, f"query failed: {failure}"
            with self._lock:
                if predicate(self):
                    return
            time.sleep(0.2)
        raise AssertionError(
            f"timed out after {timeout_s}s waiting for {what}; last report: {self.reports[-1:]}"
        )

    def settle(self) -> None:
        """Blocks until everything produced so far has been processed."""
        self.query.processAllAvailable()
        failure = self.query.exception()
        assert failure is None, f"query failed: {failure}"

    @property
    def watermark(self) -> int:
        assert self.aligner is not None
        return self.aligner.valve.watermark

    def windows(self) -> list[dict[str, Any]]:
        return load_report_lines(self.output)

    def late(self) -> list[dict[str, Any]]:
        return load_report_lines(self.late_output)

    def window_counts(self) -> dict[tuple[int, int], int]:
        """{(start s, end s): count} over all keys, in seconds after BASE_MS."""
        from datetime import datetime

        counts: dict[tuple[int, int], int] = {}
        for row in self.windows():
            start = int(datetime.fromisoformat(row["window_start"]).timestamp() * 1000)
            end = int(datetime.fromisoformat(row["window_end"]).timestamp() * 1000)
            key = ((start - BASE_MS) // 1000, (end - BASE_MS) // 1000)
            counts[key] = counts.get(key, 0) + int(row["count"])
        return counts

    def stop(self) -> None:
        if self.query.isActive:
            self.query.stop()


def run_pipeline(spark: SparkSession, tmp: Path, **settings: Any) -> PipelineRun:
    config = ConsumerConfig.model_validate(
        {
            "window_ms": 5_000,
            "max_out_of_orderness_ms": 1_000,
            "trigger_ms": 300,
            "output": str(tmp / "out"),
            "checkpoint": str(tmp / "checkpoint"),
            "metrics_port": None,
            **settings,
        }
    )
    run = PipelineRun.__new__(PipelineRun)
    run.reports, run.aligner, run._lock = [], None, threading.Lock()
    run.output, run.late_output = Path(config.output), Path(config.effective_late_output)
    run.query = start(spark, config, on_batch=run.on_batch)
    return run
