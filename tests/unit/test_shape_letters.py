"""Every shape letter a name in tempering uses is defined, once, in ``tempering.types``."""

import re
from pathlib import Path

import tempering
from tempering import types

SOURCE = Path(tempering.__file__).parent

NOT_SHAPES = {"memory_limit_MB", "do_GET", "do_POST"}
"""Names that end in capitals for another reason: a unit, and http.server's handler methods."""

NAME = re.compile(r"\b_*[a-z][A-Za-z0-9_]*?_([A-Z][A-Z0-9]*)\b")
"""A name with a lower-case part that ends in ``_`` and capitals (all-caps constants excluded)."""


def _defined_letters() -> list[str]:
    """The letters of the table in the module docstring of ``tempering.types``, in order."""
    rows = re.findall(r"^- (``[A-Z]``(?:, ``[A-Z]``)*):", types.__doc__, flags=re.MULTILINE)
    return [letter for row in rows for letter in re.findall(r"``([A-Z])``", row)]


def _undefined(text: str, defined: set[str]) -> list[str]:
    """``name (letters)`` for each name in ``text`` whose shape uses a letter not in ``defined``."""
    found = []
    for match in NAME.finditer(text):
        letters = set(re.sub(r"[0-9]", "", match.group(1)))
        if match.group(0) not in NOT_SHAPES and not letters <= defined:
            found.append(f"{match.group(0)} ({''.join(sorted(letters - defined))})")
    return found


def test_the_table_defines_each_letter_once():
    letters = _defined_letters()
    assert len(letters) > 20
    assert len(letters) == len(set(letters)), sorted(letter for letter in letters if letters.count(letter) > 1)


def test_the_scan_finds_undefined_letters_and_skips_constants():
    defined = {"B", "T"}
    assert _undefined("logprobs_BT = x_B1 + MAX_LEN + self.memory_limit_MB", defined) == []
    assert _undefined("scores_NGS = _pick(logits_XV)", defined) == ["scores_NGS (GNS)", "logits_XV (VX)"]


def test_every_name_in_tempering_uses_defined_letters():
    defined = set(_defined_letters())
    problems = []
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE).as_posix()
        problems += [f"{relative}: {name}" for name in dict.fromkeys(_undefined(path.read_text(), defined))]
    assert not problems, "letters not defined in tempering/types.py:\n" + "\n".join(problems)
