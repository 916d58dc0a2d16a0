"""Checks for Java 17+ (Spark 4 and Kafka 4 need it) and Maven (set-up fetches the broker
and Spark's Kafka source with it), and says so in one line if one is missing.

Runs with the system Python before any virtual environment exists:
``python3 slackwater/java_check.py`` exits 0, or 1 with one line on stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

MINIMUM_JAVA = 17


def java_executable() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def parse_major_version(version_output: str) -> int | None:
    """The major version from ``java -version`` output ("1.8.0_392" -> 8, "17.0.15" -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


def check_java() -> str | None:
    """None if Java is usable, else the one-line reason it is not."""
    java = java_executable()
    if java is None:
        return (
            f"Java {MINIMUM_JAVA}+ is required (Spark 4) but no 'java' was found: "
            f"install OpenJDK {MINIMUM_JAVA} (e.g. apt-get install openjdk-17-jre-headless)"
            " or set JAVA_HOME"
        )
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Java {MINIMUM_JAVA}+ is required (Spark 4) but '{java} -version' failed: {error}"
    major = parse_major_version(result.stderr + result.stdout)
    if major is None:
        return f"Java {MINIMUM_JAVA}+ is required (Spark 4): cannot read the version of {java}"
    if major < MINIMUM_JAVA:
        return (
            f"Java {MINIMUM_JAVA}+ is required (Spark 4) but {java} is Java {major}: "
            f"install OpenJDK {MINIMUM_JAVA} or point JAVA_HOME at it"
        )
    return None


def check_maven() -> str | None:
    """None if ``mvn`` is on the PATH, else the one-line reason set-up cannot go on."""
    if shutil.which("mvn") is None:
        return (
            "Maven is required to fetch Apache Kafka and Spark's Kafka source at set-up, but no"
            " 'mvn' was found: install it (e.g. apt-get install maven)"
        )
    return None


def main() -> int:
    problem = check_java() or check_maven()
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
