"""``--kafka-config-file``: Java-style properties read as Kafka's tools read them, and an
error that names the file and the line, never the line's text (issue 31, finding 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slackwater.properties import PropertiesError, parse_properties, read_properties

SECRET = "hunter2-4b9e"


def test_settings_comments_blank_lines_and_both_separators() -> None:
    text = (
        "# a comment\n"
        "   ! another, indented\n"
        "\n"
        "   \t\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism : SCRAM-SHA-512\n"
        "  sasl.username=ops\n"
    )
    assert parse_properties(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "ops",
    }


def test_a_value_keeps_commas_equals_signs_colons_and_hashes() -> None:
    """Only the first '=' or ':' separates; the rest of the line is the value, whole."""
    parsed = parse_properties("sasl.password=a,b=c:d#e!f g\nssl.cipher.suites: X,Y:Z\n")
    assert parsed == {"sasl.password": "a,b=c:d#e!f g", "ssl.cipher.suites": "X,Y:Z"}


def test_escapes_as_java_reads_them() -> None:
    text = (
        "a=tab\\there\n"
        "b=\\u0041\\u00e9\\uD83D\\uDE00\n"  # A, é, and one character beyond 65536
        "c=back\\\\slash\n"
        "d=\\=\\:\\#\\!\\ x\n"  # any other escaped character is itself
        "we\\:ird=x\n"  # an escaped ':' is part of the name, and then not a name
    )
    with pytest.raises(PropertiesError, match="line 5: a setting's name"):
        parse_properties(text)
    assert parse_properties(text.rsplit("we", 1)[0]) == {
        "a": "tab\there",
        "b": "Aé\U0001f600",
        "c": "back\\slash",
        "d": "=:#! x",
    }


def test_a_line_ending_in_a_backslash_goes_on_at_the_next() -> None:
    text = (
        "ssl.cipher.suites=A,\\\n"
        "      B,\\\n"
        "\tC\n"
        "c=ends in two\\\\\n"  # an even number: a backslash, and no continuation
        "# a comment ending in a backslash goes on at no line \\\n"
        "d=4\n"
    )
    assert parse_properties(text) == {"ssl.cipher.suites": "A,B,C", "c": "ends in two\\", "d": "4"}


def test_line_breaks_of_every_kind_a_later_setting_wins_and_values_are_trimmed() -> None:
    parsed = parse_properties("a=1\r\nb=2\rc=3 \t\na=4\nempty=\n")
    assert parsed == {"a": "4", "b": "2", "c": "3", "empty": ""}


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (f"security.protocol=SASL_SSL\n{SECRET}\n", 2, "no '=' or ':'"),
        (f"a=1\n\n# c\nsasl.password {SECRET}\n", 4, "no '=' or ':'"),  # Java's blank
        (f"a=\\\n  1\n{SECRET} x=y\n", 3, "a setting's name"),  # after a continuation
        (f"={SECRET}\n", 1, "a setting's name"),
        (f"sasl.password={SECRET}\\u12\n", 1, "four hexadecimal digits"),
        (f"sasl.password={SECRET}\\uD83D\n", 1, "half a character"),
    ],
)
def test_an_error_names_the_line_never_its_text(text: str, line: int, problem: str) -> None:
    with pytest.raises(PropertiesError) as raised:
        parse_properties(text, "client.properties")
    message = str(raised.value)
    assert message.startswith(f"client.properties line {line}: "), message
    assert problem in message
    assert SECRET not in message and "\n" not in message


def test_a_file_is_read_as_utf8(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(f"sasl.password=pässwörd-{SECRET}\n", encoding="utf-8")
    assert read_properties(path) == {"sasl.password": f"pässwörd-{SECRET}"}
    path.write_bytes(b"a=1\nsasl.password=p\xe4ss\n")  # Latin-1
    with pytest.raises(PropertiesError, match=r"client.properties line 2: not UTF-8 text"):
        read_properties(path)


def test_a_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.properties"
    with pytest.raises(PropertiesError, match=f"cannot read {missing}: No such file"):
        read_properties(missing)
    with pytest.raises(PropertiesError, match=f"cannot read {tmp_path}: Is a directory"):
        read_properties(tmp_path)
