"""The examples in the foundation's docstrings run and give what they show.

Modules are found by their source holding an example and imported through the package, not
collected with --doctest-modules, so nothing is imported blindly. The sandbox is left to its
own suite.
"""

import doctest
import importlib
from pathlib import Path

import pytest

import tempering

ROOT = Path(tempering.__file__).parent


def modules_with_examples() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] != "sandbox" and ">>>" in path.read_text():
            names.append(".".join(("tempering",) + parts).removesuffix(".__init__"))
    return names


def test_the_modules_that_promise_examples_are_found():
    assert {"tempering.learner.optim", "tempering.reporting.metrics", "tempering.rewards.basic",
            "tempering.tasks.arithmetic"} <= set(modules_with_examples())


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name):
    results = doctest.testmod(importlib.import_module(name))
    assert results.attempted > 0
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples in {name} failed (see output)"
