"""Kafka client settings from a Java-style ``.properties`` file (``--kafka-config-file``),
the format Kafka's own tools read with ``--command-config``.

Java's rules: ``#`` and ``!`` start a comment line; blank lines are skipped; a line that
ends in an odd number of backslashes goes on at the next line (whose leading blanks are
dropped); ``\\t \\n \\r \\f \\uXXXX`` are escapes and a backslash before any other
character stands for that character; the first unescaped ``=`` or ``:`` ends the name;
a later name wins. Values are trimmed, as Kafka's clients trim theirs. Two rules are
ours, so that a stray line is an error naming its line rather than a setting whose name
is a password (which librdkafka would print, "No such configuration property"): a
setting needs ``=`` or ``:`` (Java also takes a blank), and its name is letters, digits,
``.``, ``_`` and ``-`` (every librdkafka setting's is). An error names the file and the
line, never the line's text. The file is read as UTF-8.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

_BLANKS = " \t\f"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|u|.)", re.DOTALL)
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_NOT_SHOWN = "(its text is not shown: it may hold a secret)"


class PropertiesError(ValueError):
    """A file that cannot be read as settings: one line naming it and the line number."""


def read_properties(path: Path) -> dict[str, str]:
    """The settings of the file at ``path``; PropertiesError if it cannot be read or a
    line is not a setting."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise PropertiesError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise PropertiesError(f"{path} line {line}: not UTF-8 text {_NOT_SHOWN}") from None
    return parse_properties(text, str(path))


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """The settings of a properties document; ``source`` names it in an error."""
    settings: dict[str, str] = {}
    for number, line in _logical_lines(text):
        try:
            name, value = _setting(line)
        except ValueError as problem:
            raise PropertiesError(f"{source} line {number}: {problem} {_NOT_SHOWN}") from None
        settings[name] = value
    return settings


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Each setting's text, continuations joined, with the number of its first line."""
    physical = _LINE_BREAK.split(text)
    index = 0
    while index < len(physical):
        number, line = index + 1, physical[index].lstrip(_BLANKS)
        index += 1
        if line.startswith(("#", "!")):
            continue  # a comment goes on at no next line, whatever it ends with
        while _continued(line):
            line = line[:-1]
            if index < len(physical):
                line += physical[index].lstrip(_BLANKS)
                index += 1
        if line.strip(_BLANKS):
            yield number, line


def _continued(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _setting(line: str) -> tuple[str, str]:
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "=:":
            name = _unescape(line[:index].strip(_BLANKS))
            if not _NAME.fullmatch(name):
                raise ValueError("a setting's name is letters, digits, '.', '_' and '-'")
            return name, _unescape(line[index + 1 :]).strip()
    raise ValueError("not a setting: no '=' or ':' after a name")


def _unescape(text: str) -> str:
    unescaped = _ESCAPE.sub(_unescaped, text)
    try:  # \uD83D\uDE00, as Java writes a character beyond the first 65536, is one
        return unescaped.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise ValueError("a \\u escape is half a character") from None


def _unescaped(match: re.Match[str]) -> str:
    escape = match.group(1)
    if escape == "u":
        raise ValueError("a \\u escape needs four hexadecimal digits")
    if len(escape) == 5:
        return chr(int(escape[1:], 16))
    return _ESCAPES.get(escape, escape)
