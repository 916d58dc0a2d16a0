"""The private C method of confluent-kafka is used only on the releases we checked."""

from __future__ import annotations

import pytest

from slackwater import list_offsets


@pytest.mark.parametrize(
    ("release", "uses_c_method"),
    [("2.16.1", True), ("2.99.0", True), ("2.15.0", False), ("3.0.0", False)],
)
def test_the_c_method_only_on_checked_releases(
    monkeypatch: pytest.MonkeyPatch, release: str, uses_c_method: bool
) -> None:
    monkeypatch.setattr("importlib.metadata.version", lambda name: release)
    assert (list_offsets.c_method_if_checked() is not None) is uses_c_method
