"""Outputs are written aside and renamed per batch id; a replayed batch id changes nothing."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from spark_consumer.pipeline import SlackwaterBatch


def test_parquet_and_json_outputs_appear_whole_and_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = spark.createDataFrame(
        [("2023-11-14T22:13:20.000Z", "k", 3)], "window_start string, key string, count long"
    )
    SlackwaterBatch._publish(rows, tmp_path / "p", 7, "parquet")
    SlackwaterBatch._publish(rows, tmp_path / "j", 7, "json")
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["batch-000000000007"]
    assert spark.read.parquet(str(tmp_path / "p" / "batch-000000000007")).collect()[0][2] == 3
    json_parts = list((tmp_path / "j" / "batch-000000000007").glob("part-*.json"))
    assert len(json_parts) == 1
    assert '"count":3' in json_parts[0].read_text()
    # A replay of batch 7 with other rows leaves the complete output as it was.
    other = spark.createDataFrame([("x", "y", 99)], rows.schema)
    SlackwaterBatch._publish(other, tmp_path / "j", 7, "json")
    assert '"count":3' in next((tmp_path / "j" / "batch-000000000007").glob("part-*")).read_text()
    assert not list((tmp_path / "j").glob(".tmp-*"))
