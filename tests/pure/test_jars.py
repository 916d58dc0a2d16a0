"""The Java parts set-up fetches (deploy/jars/pom.xml): the right versions, no duplicates."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pyspark

from slackwater.jars import KAFKA_BROKER, SPARK_KAFKA, jar_files

POM = Path(__file__).resolve().parents[2] / "deploy" / "jars" / "pom.xml"
NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _property(name: str) -> str:
    found = ET.parse(POM).getroot().find(f"m:properties/m:{name}", NS)
    assert found is not None and found.text
    return found.text


def _artifact(jar: Path) -> str:
    """'kafka-clients-3.9.2.jar' -> 'kafka-clients' (the name without its version)."""
    return re.sub(r"-\d+\.[\w.\-]*\.jar$", "", jar.name)


def test_spark_kafka_source_is_pysparks_version() -> None:
    assert _property("spark.version") == version("pyspark")
    names = [jar.name for jar in jar_files(SPARK_KAFKA)]
    assert f"spark-sql-kafka-0-10_2.13-{version('pyspark')}.jar" in names


def test_spark_jars_add_no_second_copy_of_what_pyspark_ships() -> None:
    shipped = {_artifact(jar) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    ours = {_artifact(jar) for jar in jar_files(SPARK_KAFKA)}
    assert ours == {
        "spark-sql-kafka-0-10_2.13",
        "spark-token-provider-kafka-0-10_2.13",
        "kafka-clients",
        "commons-pool2",
    }
    assert not ours & shipped


def test_kafka_broker_is_the_composed_version() -> None:
    kafka_version = _property("kafka.version")
    assert f"kafka_2.13-{kafka_version}.jar" in [jar.name for jar in jar_files(KAFKA_BROKER)]
    compose = (POM.parents[2] / "docker-compose.yml").read_text()
    assert f"apache/kafka:{kafka_version}" in compose
