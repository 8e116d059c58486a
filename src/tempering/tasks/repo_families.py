"""The package families of the procedural ``repo`` task: modules, their tests, and the defects.

A family is one small Python package (an inventory, a ledger, a scheduler, ...) written as
``string.Template`` sources over constants drawn per instance (``$pkg``, the package's name,
and the family's numbers and words), with a test file per module. The sources are the
*right* package; a :class:`Defect` is the change that makes it wrong (edits from right to
wrong text), the issue a user would file about it, and the hidden tests that fail until it
is fixed. So the reference patch of every instance is the diff from the wrong package back
to the right one, and the tests that must keep passing are every module's own tests.

Levels (a defect's ``level``):

1. a one-line slip in one module, at an edge the module's tests do not cover;
2. a defect whose obvious fix, in a helper other modules share, breaks one of them: the
   ``naive`` edits are that fix, and the callers' tests (visible and hidden) catch it;
3. a change across two modules (a feature whose parts live in both).

Expected values in the tests are computed here, in Python, from the drawn constants (each
family's ``draw``), never by running the generated package.

Not done here: other languages, packages with dependencies, tests that need pytest's fixtures
(every test is a plain top-level ``def test_...():`` with asserts, callable without pytest).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass
from string import Template
from typing import Any, Callable

from tempering.tasks.repo_records import RepoInstance, make_patch

Params = dict[str, Any]
Edit = tuple[str, str, str]
"""(module stem, text, replacement): one change to ``$pkg/<stem>.py``, the text found exactly once."""

TEST_COMMAND = "python -m pytest -q tests"


@dataclass(frozen=True)
class Defect:
    """One way a family's package is wrong, and the issue that reports it."""

    name: str
    level: int
    home: str
    """The module the issue is about; its hidden test file ``tests/test_<home>_issue.py`` holds
    the tests that must turn from failing to passing."""
    issue: str
    bug: tuple[Edit, ...]
    """Edits from the right package to the wrong one."""
    tests: str
    naive: tuple[Edit, ...] = ()
    """Edits to the wrong package: the plausible fix that breaks another module (level 2)."""


@dataclass(frozen=True)
class RepoFamily:
    name: str
    summary: str
    packages: tuple[str, ...]
    draw: Callable[[random.Random], Params]
    modules: dict[str, str]
    """Module stem -> source template (``$pkg/<stem>.py``)."""
    tests: dict[str, str]
    """Module stem -> its test file's template (``tests/test_<stem>.py``, and the same tests
    hidden as ``tests/test_<stem>_hidden.py``)."""
    defects: tuple[Defect, ...]


def _fill(template: str, params: Params) -> str:
    return Template(template).substitute(params)


def _edited(files: dict[str, str], edits: tuple[Edit, ...], params: Params, where: str) -> dict[str, str]:
    """``files`` with ``edits`` made; an edit whose text is not there exactly once is a fault
    of the family's templates (an AssertionError naming it)."""
    out = dict(files)
    for stem, old, new in edits:
        path, old, new = f"{params['pkg']}/{stem}.py", _fill(old, params), _fill(new, params)
        count = out[path].count(old)
        if count != 1:
            raise AssertionError(f"{where}: the edit of {path} finds its text {count} times, not once: {old!r}")
        out[path] = out[path].replace(old, new)
    return out


def find_tests(source: str) -> list[str]:
    """The top-level test functions of a test file, in order.

    >>> find_tests("def test_a():\\n    assert 1\\n\\ndef helper():\\n    pass\\ndef test_b():\\n    pass\\n")
    ['test_a', 'test_b']
    """
    return re.findall(r"^def (test_\w+)\(\):", source, re.M)


def split_key(family: RepoFamily, defect: Defect, params: Params) -> str:
    """What an instance is, apart from its package's name: the held-out split is made on this,
    so a held-out fix is never trained on under another name."""
    rest = {k: v for k, v in params.items() if k != "pkg"}
    return f"{family.name}:{defect.name}:{json.dumps(rest, sort_keys=True)}"


def build_instance(family: RepoFamily, defect: Defect, params: Params) -> RepoInstance:
    """The instance of ``defect`` with ``params``: the wrong package and its visible tests,
    the hidden tests, the reference patch and, at level 2, the naive patch in ``meta``."""
    where = f"{family.name}/{defect.name}"
    pkg = params["pkg"]
    right = {f"{pkg}/__init__.py": f'"""{_fill(family.summary, params)}"""\n'}
    right.update({f"{pkg}/{stem}.py": _fill(source, params) for stem, source in family.modules.items()})
    right.update({f"tests/test_{stem}.py": _fill(source, params) for stem, source in family.tests.items()})
    files = _edited(right, defect.bug, params, where)
    hidden = {f"tests/test_{stem}_hidden.py": _fill(source, params) for stem, source in family.tests.items()}
    issue_file = f"tests/test_{defect.home}_issue.py"
    hidden[issue_file] = _fill(defect.tests, params)
    fail_to_pass = [f"{issue_file}::{name}" for name in find_tests(hidden[issue_file])]
    pass_to_pass = [f"{path}::{name}" for path in sorted(hidden) if path != issue_file
                    for name in find_tests(hidden[path])]
    statement = _fill(defect.issue, params)
    content = json.dumps([statement, files, hidden], sort_keys=True)
    meta = {"family": family.name, "level": defect.level, "defect": defect.name, "module": defect.home,
            "params": params, "modules_changed": sorted({f"{pkg}/{stem}.py" for stem, _, _ in defect.bug})}
    if defect.naive:
        meta["naive_patch"] = make_patch(files, _edited(files, defect.naive, params, where + " (naive)"))
    return RepoInstance(instance_id=f"{family.name}-{defect.name}-{zlib.crc32(content.encode()):08x}",
                        problem_statement=statement, files=files, hidden_tests=hidden,
                        FAIL_TO_PASS=tuple(fail_to_pass), PASS_TO_PASS=tuple(pass_to_pass),
                        test_command=TEST_COMMAND, patch=make_patch(files, right), meta=meta)


# -- drawing constants ----------------------------------------------------------------------

WORDS = ("bolt", "nut", "gear", "valve", "hinge", "spring", "lamp", "cable", "brush", "clamp", "drill",
         "glove", "hose", "latch", "mallet", "nail", "pliers", "rivet", "saw", "tape", "washer", "wrench")


def words(rng: random.Random, n: int, pool: tuple[str, ...] = WORDS) -> list[str]:
    """``n`` distinct words of ``pool``, in a drawn order."""
    return rng.sample(pool, n)


def search(rng: random.Random, low: int, high: int, ok: Callable[[int], bool]) -> int:
    """A drawn value in ``low..high`` for which ``ok`` holds (the first such when none is drawn)."""
    for _ in range(200):
        value = rng.randint(low, high)
        if ok(value):
            return value
    return next(v for v in range(low, high + 1) if ok(v))
