"""Unified diffs over a repository held in memory: make one, apply one, say what it touches.

A repository here is ``{relative path: text}``. :func:`make_patch` writes the difference of
two such dicts as a unified diff (``a/`` and ``b/`` prefixes, ``/dev/null`` for a file added or
deleted, ``\\ No newline at end of file`` where a last line has none); :func:`apply_patch`
applies one and refuses, with :class:`PatchError` naming the file and hunk, a diff that does
not apply or that names a path outside the repository (absolute, ``..``, a backslash).

Hunks are found by their text, not trusted by their line numbers: a hunk's old lines (context
and removals) must occur in the file, and the occurrence nearest the line its header names is
taken (a model's diff often has the numbers wrong and the text right). Its line counts are
not checked either: a hunk runs to the next hunk or file header. A blank line inside a hunk
reads as an empty context line (editors and models strip the lone space).

Not done here: fuzzy matching of context that differs, renames and binary diffs, modes.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = "\\ No newline at end of file"
NULL = "/dev/null"


class PatchError(ValueError):
    """A diff that cannot be applied; the message names the file and what was wrong."""


def outside(path: str) -> bool:
    """Whether ``path`` leaves a repository's folder (or is not a plain relative path).

    >>> outside("pkg/stock.py"), outside("../etc/passwd"), outside("/etc/passwd"), outside("pkg/../../x")
    (False, True, True, True)
    """
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return True
    parts = path.split("/")
    return any(part in ("", ".", "..") for part in parts) or "/".join(PurePosixPath(path).parts) != path


@dataclass
class FilePatch:
    """One file's part of a diff: its old and new path (``/dev/null`` when added or deleted)."""

    old: str
    new: str
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)
    """(old start line, the hunk's lines with their ``' '``/``'-'``/``'+'`` marks)"""

    @property
    def path(self) -> str:
        return self.old if self.new == NULL else self.new


def _strip_prefix(name: str) -> str:
    name = name.split("\t")[0].strip()
    if name == NULL:
        return name
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_patch(diff: str) -> list[FilePatch]:
    """The files of a unified diff in order, each with its hunks (nothing is checked against
    a repository yet: see :func:`apply_patch`)."""
    lines = diff.split("\n")  # only "\n" ends a line (see _split)
    if lines[-1] == "":
        lines.pop()
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            patches.append(FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])))
            i += 2
            continue
        match = _HUNK.match(line)
        if match and patches:
            body, i = _hunk_body(lines, i + 1)
            patches[-1].hunks.append((int(match.group(1)), body))
            continue
        if match:
            raise PatchError(f"line {i + 1}: a hunk before any '--- a/PATH' / '+++ b/PATH' header")
        i += 1
    if not patches:
        raise PatchError("no file in the diff: it needs '--- a/PATH' and '+++ b/PATH' lines, then '@@' hunks")
    return patches


def _hunk_body(lines: list[str], i: int) -> tuple[list[str], int]:
    body: list[str] = []
    while i < len(lines):
        line = lines[i]
        if _HUNK.match(line) or line.startswith("diff ") or (
                line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            break
        if line.startswith(_NO_NEWLINE[:2]):
            body.append("\\")
        elif line == "" or line[0] in " -+":
            body.append(line or " ")
        else:
            break
        i += 1
    return body, i


def touched_paths(diff: str) -> list[str]:
    """Every path a diff names, old and new, ``/dev/null`` left out (for the checks on what a
    patch touches); a diff that does not parse names none.

    >>> touched_paths("--- a/pkg/a.py\\n+++ b/pkg/a.py\\n@@ -1 +1 @@\\n-x\\n+y\\n")
    ['pkg/a.py']
    """
    try:
        patches = parse_patch(diff)
    except PatchError:
        return []
    return sorted({name for p in patches for name in (p.old, p.new) if name != NULL})


def _split(text: str) -> list[str]:
    """The lines of ``text``, each with its ``\\n`` (the last one may have none). Only ``\\n`` ends a
    line, as in a diff: ``str.splitlines`` also splits at ``\\r``, form feeds and ``\\u2028``,
    which a line of code may hold.

    >>> _split("a\\r\\nb\\u2028c\\nd")
    ['a\\r\\n', 'b\\u2028c\\n', 'd']
    """
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _hunk_lines(body: list[str]) -> tuple[list[str], list[str]]:
    """(old lines, new lines) of a hunk, each with its line ending; a ``\\`` marker takes the
    newline off the line before it."""
    old: list[str] = []
    new: list[str] = []
    last: list[list[str]] = []
    for line in body:
        if line == "\\":
            for side in last:
                side[-1] = side[-1].removesuffix("\n")
            continue
        mark, text = line[0], line[1:] + "\n"
        last = [side for side, wanted in ((old, " -"), (new, " +")) if mark in wanted]
        for side in last:
            side.append(text)
    return old, new


def _find(lines: list[str], block: list[str], near: int, start: int) -> int:
    """The index at or after ``start`` where ``block`` occurs nearest line ``near``, or -1."""
    spots = [i for i in range(start, len(lines) - len(block) + 1) if lines[i:i + len(block)] == block]
    return min(spots, key=lambda i: abs(i - near)) if spots else -1


def _apply_file(text: str, patch: FilePatch) -> str:
    lines, at = _split(text), 0
    for number, (start, body) in enumerate(patch.hunks, 1):
        old, new = _hunk_lines(body)
        if not old:  # pure addition: at the line its header names (0 = the top)
            index = min(max(start, 0), len(lines))
        else:
            index = _find(lines, old, start - 1, at)
            if index < 0:
                raise PatchError(f"{patch.path}: hunk {number} does not apply: its old lines "
                                 "(context and '-' lines) are not in the file as written")
        lines[index:index + len(old)] = new
        at = index + len(new)
    return "".join(lines)


def apply_patch(files: dict[str, str], diff: str) -> dict[str, str]:
    """``files`` with ``diff`` applied (a new dict; ``files`` is not changed).

    >>> apply_patch({"a.py": "x = 1\\ny = 2\\n"}, "--- a/a.py\\n+++ b/a.py\\n@@ -2 +2 @@\\n-y = 2\\n+y = 3\\n")
    {'a.py': 'x = 1\\ny = 3\\n'}
    >>> apply_patch({"a.py": ""}, "--- a/../b.py\\n+++ b/../b.py\\n@@ -0,0 +1 @@\\n+x\\n")
    Traceback (most recent call last):
    ...
    tempering.rewards.repo_patch.PatchError: ../b.py: path outside the repository (relative paths without '..' only)
    """
    result = dict(files)
    for patch in parse_patch(diff):
        for name in (patch.old, patch.new):
            if name != NULL and outside(name):
                raise PatchError(f"{name}: path outside the repository (relative paths without '..' only)")
        if patch.old == NULL and patch.new == NULL:
            raise PatchError("a file header with /dev/null on both sides")
        if patch.old == NULL:
            if patch.new in result:
                raise PatchError(f"{patch.new}: the diff adds it (--- /dev/null), but it exists")
            result[patch.new] = _apply_file("", patch)
            continue
        if patch.old not in result:
            raise PatchError(f"{patch.old}: no such file in the repository")
        text = _apply_file(result[patch.old], patch)
        if patch.new == NULL:
            if text:
                raise PatchError(f"{patch.old}: the diff deletes it (+++ /dev/null) but leaves lines in it")
            del result[patch.old]
            continue
        if patch.new != patch.old:
            if patch.new in result:
                raise PatchError(f"{patch.new}: the diff moves {patch.old} there, but it exists")
            del result[patch.old]
        result[patch.new] = text
    return result


def _diff_lines(before: str, after: str, old: str, new: str) -> list[str]:
    lines = []
    for line in difflib.unified_diff(_split(before), _split(after), old, new):
        lines.append(line if line.endswith("\n") else line + "\n" + _NO_NEWLINE + "\n")
    return lines


def make_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """The unified diff that takes ``before`` to ``after`` ("" when they are the same); files
    in path order. :func:`apply_patch` of it on ``before`` gives ``after`` back.

    >>> print(make_patch({"a.py": "x = 1\\n"}, {"a.py": "x = 2\\n", "b.py": "y"}), end="")
    --- a/a.py
    +++ b/a.py
    @@ -1 +1 @@
    -x = 1
    +x = 2
    --- /dev/null
    +++ b/b.py
    @@ -0,0 +1 @@
    +y
    \\ No newline at end of file
    """
    parts: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        names = (NULL if old is None else f"a/{path}", NULL if new is None else f"b/{path}")
        # an empty file added or deleted has no hunk: its header alone says so
        parts += _diff_lines(old or "", new or "", *names) or [f"--- {names[0]}\n", f"+++ {names[1]}\n"]
    return "".join(parts)
