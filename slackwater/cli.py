"""The ``slackwater`` command's shell: it finds its subcommands, it does not know them.

Each side, and the demo, declares its subcommands in ``pyproject.toml``'s
``slackwater.commands`` entry-point group (name = the subcommand, value = a function
that adds it to the parser), found with ``importlib.metadata.entry_points`` as pytest
finds its plugins. So this shell imports neither side.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TypeAlias

COMMANDS_GROUP = "slackwater.commands"

# What an entry point of the group is: it adds the subcommand ``name`` to ``commands``
# and sets ``run`` (args -> exit code) as the parser's default.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
AddCommand: TypeAlias = Callable[[Commands, str], None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slackwater",
        description="Keep event time moving when Kafka partitions go quiet or end for good.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        add_command: AddCommand = entry.load()
        add_command(commands, entry.name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
