"""The error of an offset this code cannot read, apart from the offset's module so that
the reading of every version (``offset``, ``offset_v1``) raises it without importing the
other."""

from __future__ import annotations


class OffsetFormatError(ValueError):
    """An offset this code cannot read (an unknown version, or not an offset)."""
