"""Every ``temper`` command has a section of the handbook whose heading names it, and every
option the real parser takes is written in that section (or in the section of the command
it belongs to, such as ``temper sandbox``'s ``--workers``), so an option added to the CLI
without a word in the docs, or a page that loses a command, fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from tempering.cli import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
HEADING = re.compile(r"(#+) ")


def commands(parser: argparse.ArgumentParser, name: str = "temper"):
    """(``temper train``, its long options) for every leaf command, and ``temper sandbox`` etc.
    for the commands that hold others (with the options they share)."""
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for action in subcommands:
        for sub_name, sub in action.choices.items():
            yield from commands(sub, f"{name} {sub_name}")
    if name != "temper" and not subcommands:
        yield name, [option for action in parser._actions for option in action.option_strings
                     if option.startswith("--") and option != "--help"]


def sections(command: str) -> list[str]:
    """The text of every docs section whose heading shows ``command`` in code: the command,
    then its arguments (``[``, ``--`` or an upper-case placeholder), never a subcommand."""
    names = re.compile(r"`%s(?: [^a-z`][^`]*)?`" % re.escape(command))
    found = []
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        for start, line in enumerate(lines):
            heading = HEADING.match(line)
            if heading and names.search(line):
                end = next((i for i in range(start + 1, len(lines)) if (h := HEADING.match(lines[i]))
                            and len(h.group(1)) <= len(heading.group(1))), len(lines))
                found.append("\n".join(lines[start:end]))
    return found


COMMANDS = list(commands(build_parser()))


def test_every_command_of_the_parser_is_here():
    names = [name for name, _ in COMMANDS]
    assert {"temper train", "temper eval", "temper sandbox serve", "temper rm train"} <= set(names)
    assert len(names) >= 12


@pytest.mark.parametrize("command, options", COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_command_has_a_section_naming_each_of_its_options(command, options):
    own = sections(command)
    assert own, f"no docs heading names `{command}`"
    parent = sections(command.rsplit(" ", 1)[0]) if command.count(" ") > 1 else []
    text = "\n".join(own + parent)
    missing = [o for o in options if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(o), text)]
    assert not missing, f"`{command}`: {missing} are not in its docs section"
