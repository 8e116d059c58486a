"""Pre-training transcripts of the ``repo`` task: episodes of ``env: repo`` written as the
environment plays them, for the built-in character-level model.

A transcript is an agent at work on a generated training instance: it reads the module it is
about to change, replaces the defect's lines with the reference fix, runs the visible tests
and submits. Each call is played through a real :class:`~tempering.envs.repo.RepoEnv` built
with the options the training config gives ``env: repo`` (``corpus_env``), and each result is
the text that environment returned (the test runs are real sandbox runs), so a transcript is
token for token the episode the environment would make of those model turns: the prompt as
``reset`` renders it, then each model turn (the call, ending at its closing tag, the turn's
stop string) followed by its ``<result>...</result>``, up to ``<submit></submit>``.

A share of the transcripts carry the classic mistakes, so that a model pre-trained on them
starts with something for RL to fix:

- ``naive`` (level 2 only): the fix in the shared helper that breaks another module
  (the instance's ``meta["naive_patch"]``); the test run shows the other module failing and
  the agent submits anyway;
- ``untested``: the agent submits without running the tests;
- ``wrong_span``: the replace quotes the fixed lines as the old text, which the file does not
  hold; the environment answers with an error and the agent submits, having changed nothing.

The edits are ``replace`` calls found by a line diff between the files before and after the
patch, each span widened by a line on both sides until it occurs once in its file.

Not done here: transcripts with ``results: messages`` (a chat rendering), recovery after a
failing test run (the agent never reverts a bad edit: that is left for RL), level-3 instances
that need more than a few edits within the turn budget.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from typing import Any

from tempering.envs.repo import RepoEnv
from tempering.rewards.repo_patch import apply_patch
from tempering.rewards.repo_workspace import format_call
from tempering.types import Problem


@dataclass(frozen=True)
class Mistakes:
    """Shares of transcripts with each classic mistake, drawn independently per transcript."""

    naive: float
    """Of level-2 transcripts: the fix that breaks another module."""
    untested: float
    """Submitted without a test run."""
    wrong_span: float
    """The replace quotes text the file does not hold."""

    def check(self) -> None:
        for name in ("naive", "untested", "wrong_span"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"corpus_{name}_share must be a share between 0 and 1, got {getattr(self, name)!r}")


def corpus_env(options: dict[str, Any]) -> RepoEnv:
    """The environment transcripts are played through; a ValueError naming an option it cannot
    write transcripts for."""
    if not isinstance(options, dict):
        raise ValueError(f"corpus_env must be a mapping of env: repo's options, got {options!r}")
    if options.get("results", "inline") != "inline":
        raise ValueError("corpus_env: transcripts are written with results: inline (the raw text form)")
    return RepoEnv(**options)


def _unique_span(lines: list[str], start: int, end: int) -> tuple[int, int]:
    """``lines[start:end]`` widened a line each side until its text occurs once in the file."""
    text = "".join(lines)
    while "".join(lines[start:end]) == "" or text.count("".join(lines[start:end])) != 1:
        if start == 0 and end == len(lines):
            break
        start, end = max(start - 1, 0), min(end + 1, len(lines))
    return start, end


def edit_calls(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``replace`` calls that turn ``before`` into ``after`` (files in both): one call per changed
    file, from its first changed line to its last, widened until the old text occurs once.

    >>> edit_calls({"a.py": "x = 1\\ny = 2\\n"}, {"a.py": "x = 1\\ny = 3\\n"})
    ['<replace path="a.py"><old>\\ny = 2\\n</old><new>\\ny = 3\\n</new></replace>']
    """
    calls = []
    for path in sorted(p for p in before if after.get(p, before[p]) != before[p]):
        old_lines, new_lines = before[path].splitlines(True), after[path].splitlines(True)
        changed = [op for op in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
                   if op[0] != "equal"]
        i1, i2 = changed[0][1], changed[-1][2]
        j1, j2 = changed[0][3], changed[-1][4]
        start, end = _unique_span(old_lines, i1, i2)
        old, new = "".join(old_lines[start:end]), "".join(old_lines[start:i1] + new_lines[j1:j2] + old_lines[i2:end])
        calls.append(format_call("replace", path=path, old=old, new=new))
    return calls


def _wrong_span(call: str) -> str:
    """The call with its old and new texts swapped: it quotes the fixed lines, which the file
    does not hold yet."""
    head, rest = call.split("<old>", 1)
    old, rest = rest.split("</old><new>", 1)
    new = rest.rsplit("</new></replace>", 1)[0]
    return f"{head}<old>{new}</old><new>{old}</new></replace>"


def episode_calls(problem: Problem, rng: random.Random, mistakes: Mistakes) -> list[str]:
    """The model turns of one transcript of ``problem``: read, edit(s), test, submit, with the
    mistakes drawn at their shares."""
    record = problem.meta["repo"]
    files = record["files"]
    naive = problem.meta.get("level") == 2 and "naive_patch" in record["meta"] and rng.random() < mistakes.naive
    diff = record["meta"]["naive_patch"] if naive else record["patch"]
    edits = edit_calls(files, apply_patch(files, diff))
    untested = rng.random() < mistakes.untested
    if rng.random() < mistakes.wrong_span:
        edits = [_wrong_span(edits[0])]
    first = edits[0].split('"', 2)[1]
    calls = [format_call("read", first), *edits]
    if not untested:
        calls.append(format_call("test"))
    return calls + [format_call("submit")]


def render(env: RepoEnv, problem: Problem, calls: list[str]) -> str:
    """The episode's text as ``env`` plays ``calls``: the prompt, then each call and its result,
    up to the call that ends the episode."""
    text = env.reset(problem)
    if not isinstance(text, str):
        raise ValueError("repo corpus: transcripts need a text prompt (the task's style: raw)")
    for call in calls:
        step = env.step(call)
        text += call
        if step.done:
            break
        text += step.observation
    return text
