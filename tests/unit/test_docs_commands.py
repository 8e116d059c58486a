"""Every ``temper`` command has a section of the handbook whose heading names it, and every
option the real parser takes is written in that section (or in the section of the command
it belongs to, such as ``temper sandbox``'s ``--workers``), so an option added to the CLI
without a word in the docs, or a page that loses a command, fails here. And every ``temper``
command line the README and the handbook show is accepted by the real parser, its config
and overrides by the real config loader, so a renamed option or key cannot linger in them."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from tempering import cli
from tempering.cli import build_parser
from tempering.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
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


def shown_commands() -> list[tuple[str, str]]:
    """(file, line) of every ``temper ...`` line in the code blocks of the README and the
    handbook (its ``#`` comment and a trailing ``&`` cut; ``temper train: ...``, a command's
    output, left out), and every inline ```temper ...``` span of the README of three words or
    more (a command with what it runs, not a bare name such as ``temper report``)."""
    found = []
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = path.read_text()
        for line in text.splitlines():
            if re.match(r" {4,}temper [a-z]+ ", line + " "):
                found.append((path.name, line.split("  #")[0].strip().rstrip("&").strip()))
        if path.name == "README.md":
            found += [(path.name, span) for span in re.findall(r"`(temper [^`]*)`", text) if len(span.split()) >= 3]
    return list(dict.fromkeys(found))


SHOWN = shown_commands()


def test_the_readme_and_the_handbook_show_commands():
    assert sum(name == "README.md" for name, _ in SHOWN) >= 5 and len(SHOWN) >= 15


@pytest.mark.parametrize("name, line", SHOWN, ids=[f"{name}: {line}" for name, line in SHOWN])
def test_every_command_shown_parses_and_its_config_loads(name, line):
    args = build_parser().parse_args(shlex.split(line)[1:])
    if args.command in ("train", "explain"):
        assert load_config(*cli._split_config_args(args.config_and_overrides))
    elif args.command == "eval":
        _, config, overrides = cli._eval_inputs(args)
        assert load_config(config, overrides)
