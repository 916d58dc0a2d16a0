"""The Java check that `make test` and `make demo` run first."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slackwater.java_check import parse_major_version

SCRIPT = Path(__file__).resolve().parents[2] / "slackwater" / "java_check.py"


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "11.0.2" 2019-01-15', 11),
        ("no version here", None),
    ],
)
def test_parses_major_version(output: str, major: int | None) -> None:
    assert parse_major_version(output) == major


def _run_with_fake_java(
    tmp_path: Path, version_line: str | None, *, maven: bool = True
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if version_line is not None:
        java = bin_dir / "java"
        java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
        java.chmod(java.stat().st_mode | stat.S_IEXEC)
    if maven:
        mvn = bin_dir / "mvn"
        mvn.write_text("#!/bin/sh\n")
        mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(bin_dir)
    return subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, check=False
    )


def test_missing_java_stops_with_one_line(tmp_path: Path) -> None:
    result = _run_with_fake_java(tmp_path, None)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "no 'java' was found" in result.stderr


def test_old_java_stops_with_one_line(tmp_path: Path) -> None:
    result = _run_with_fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15')
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "is Java 11" in result.stderr


def test_java_17_passes(tmp_path: Path) -> None:
    result = _run_with_fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
    assert (result.returncode, result.stderr) == (0, "")


def test_missing_maven_stops_with_one_line(tmp_path: Path) -> None:
    result = _run_with_fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15', maven=False)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "no 'mvn' was found" in result.stderr
