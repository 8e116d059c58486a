"""Repository instances: a small code base, an issue against it, and the tests that judge a fix.

One instance is what the ``repo`` task family generates and what a user's own repository
dataset holds, in the fields SWE-bench and SWE-Gym use, so a record written for either loads
here:

- ``instance_id``: unique within a dataset;
- ``problem_statement``: the issue text the agent is given;
- ``files``: the repository before the fix, ``{relative path: text}`` (visible tests included),
  or ``snapshot``: a folder holding it (read when the record is loaded);
- ``hidden_tests``: test files the agent never sees, ``{relative path: text}``, put back over
  the patched repository when it is graded (a file of the same path the agent wrote is
  replaced, one it deleted is restored);
- ``FAIL_TO_PASS``: test ids that fail before the fix and must pass after it;
- ``PASS_TO_PASS``: test ids that pass before and must keep passing (the other modules'
  tests: the knock-on check);
- ``test_command``: how the repository's own tests are run, kept for records that come with
  one and for people reading them; neither the agent's test runs nor the grader use it: both
  import each test file and call its top-level ``test*`` functions themselves in the sandbox
  (``tempering.rewards.repo``), so no runner the repository ships can report a pass;
- ``patch``: a reference fix as a unified diff against ``files`` (optional; the generator
  writes one, and a test applies it to show every instance is solvable);
- ``meta``: anything else (family, level, the module the fix belongs in).

:func:`make_patch` writes the unified diff between two versions of a repository's files and
:func:`apply_patch` applies one, strictly: every context and removed line must match exactly
(no fuzz); a hunk found a few lines away from where its header says is applied there, as
``patch`` does, so a diff written by hand need not count lines exactly.

A test id is ``path::name`` (``tests/test_stock.py::test_restock``), a top-level test function
of a file in ``files`` or ``hidden_tests``. Paths are relative, ``/``-separated, with no ``..``
and no leading ``/``.

Not here: generating instances (``tempering.tasks.repo``), playing one (``tempering.envs.repo``)
or grading a patch (``tempering.rewards.repo``).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Optional

MAX_FILE_BYTES = 1 << 20
"""Largest file a record may hold; a repository of this kind is small."""


class RecordError(ValueError):
    """A repository record that cannot be used; the message names the field."""


def check_path(path: str, field_name: str) -> str:
    """``path`` if it is a relative, normalised, ``/``-separated path; else a RecordError.

    >>> check_path("pkg/stock.py", "files")
    'pkg/stock.py'
    >>> check_path("../etc/passwd", "files")
    Traceback (most recent call last):
    ...
    tempering.tasks.repo_records.RecordError: files: path '../etc/passwd' must be relative, without '..' or '.' parts
    """
    if not isinstance(path, str) or not path:
        raise RecordError(f"{field_name}: a path must be a non-empty string, got {path!r}")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or "\\" in path or any(part in ("..", ".") for part in path.split("/")) \
            or "/".join(parts) != path:
        raise RecordError(f"{field_name}: path {path!r} must be relative, without '..' or '.' parts")
    return path


def split_test_id(test_id: str) -> tuple[str, str]:
    """``(path, function)`` of a ``path::name`` test id.

    >>> split_test_id("tests/test_stock.py::test_restock")
    ('tests/test_stock.py', 'test_restock')
    """
    path, sep, name = test_id.partition("::")
    if not sep or not name.isidentifier():
        raise RecordError(f"test id {test_id!r} must be 'path::function_name'")
    return path, name


def _files(value: Any, field_name: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise RecordError(f"{field_name}: expected an object of path -> text, got {type(value).__name__}")
    for path, text in value.items():
        check_path(path, field_name)
        if not isinstance(text, str):
            raise RecordError(f"{field_name}[{path!r}]: expected text, got {type(text).__name__}")
        if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
            raise RecordError(f"{field_name}[{path!r}]: over {MAX_FILE_BYTES} bytes")
    return dict(value)


def read_snapshot(folder: Path) -> dict[str, str]:
    """The text files under ``folder`` as ``{relative path: text}`` (hidden folders skipped)."""
    if not folder.is_dir():
        raise RecordError(f"snapshot: {str(folder)!r} is not a folder")
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in relative.split("/")) \
                and "__pycache__" not in relative.split("/"):
            try:
                found[relative] = path.read_text()
            except UnicodeDecodeError:
                raise RecordError(f"snapshot: {str(path)!r} is not UTF-8 text") from None
    return found


@dataclass(frozen=True)
class RepoInstance:
    """One repository task (see the module docstring for each field)."""

    instance_id: str
    problem_statement: str
    files: dict[str, str]
    hidden_tests: dict[str, str]
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...] = ()
    test_command: str = "python -m pytest -q"
    patch: Optional[str] = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.FAIL_TO_PASS:
            raise RecordError(f"{self.instance_id}: FAIL_TO_PASS is empty: nothing would tell a fix from no fix")
        known = {**self.files, **self.hidden_tests}
        for name, ids in (("FAIL_TO_PASS", self.FAIL_TO_PASS), ("PASS_TO_PASS", self.PASS_TO_PASS)):
            for test_id in ids:
                path, _ = split_test_id(test_id)
                if path not in known:
                    raise RecordError(f"{self.instance_id}: {name} names {test_id!r}, whose file is in "
                                      "neither files nor hidden_tests")

    @classmethod
    def from_record(cls, record: dict[str, Any], base: Optional[Path] = None) -> "RepoInstance":
        """An instance from a JSON record; ``snapshot`` paths are read relative to ``base``."""
        if not isinstance(record, dict):
            raise RecordError(f"a repository record is a JSON object, got {type(record).__name__}")
        for key in ("instance_id", "problem_statement", "FAIL_TO_PASS"):
            if key not in record:
                raise RecordError(f"missing field {key!r}")
        if ("files" in record) == ("snapshot" in record):
            raise RecordError("give exactly one of 'files' (path -> text) and 'snapshot' (a folder)")
        if "snapshot" in record:
            folder = Path(record["snapshot"]).expanduser()
            files = read_snapshot(folder if folder.is_absolute() or base is None else base / folder)
        else:
            files = _files(record["files"], "files")
        ids = {}
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            value = record.get(key, [])
            if isinstance(value, str):  # SWE-bench stores these lists as JSON text
                try:
                    value = json.loads(value)
                except ValueError:
                    raise RecordError(f"{key}: not a JSON list of test ids") from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RecordError(f"{key}: expected a list of test ids")
            ids[key] = tuple(value)
        for key in ("instance_id", "problem_statement", "test_command"):
            if key in record and not isinstance(record[key], str):
                raise RecordError(f"{key}: expected text, got {type(record[key]).__name__}")
        for key in ("instance_id", "problem_statement"):
            if not record[key].strip():
                raise RecordError(f"{key}: must be non-empty text")
        if record.get("patch") is not None and not isinstance(record["patch"], str):
            raise RecordError("patch: expected a unified diff as text")
        meta = record.get("meta", {})
        if not isinstance(meta, dict):
            raise RecordError("meta: expected an object")
        return cls(instance_id=record["instance_id"], problem_statement=record["problem_statement"],
                   files=files, hidden_tests=_files(record.get("hidden_tests", {}), "hidden_tests"),
                   FAIL_TO_PASS=ids["FAIL_TO_PASS"], PASS_TO_PASS=ids["PASS_TO_PASS"],
                   test_command=record.get("test_command", cls.test_command),
                   patch=record.get("patch"), meta=meta)

    def to_record(self) -> dict[str, Any]:
        """The JSON record :meth:`from_record` reads back."""
        record: dict[str, Any] = {
            "instance_id": self.instance_id, "problem_statement": self.problem_statement,
            "files": dict(self.files), "hidden_tests": dict(self.hidden_tests),
            "FAIL_TO_PASS": list(self.FAIL_TO_PASS), "PASS_TO_PASS": list(self.PASS_TO_PASS),
            "test_command": self.test_command, "meta": dict(self.meta)}
        if self.patch is not None:
            record["patch"] = self.patch
        return record


# -- unified diffs ----------------------------------------------------------------------------

NO_NEWLINE = "\\ No newline at end of file\n"
_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def split_lines(text: str) -> list[str]:
    """``text``'s lines, each with its ``\\n``; only ``\\n`` ends a line (a ``\\r`` stays in it).

    >>> split_lines("a\\nb"), split_lines("a\\n"), split_lines("")
    (['a\\n', 'b'], ['a\\n'], [])
    """
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def make_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """The unified diff (git's ``a/``, ``b/`` form, three lines of context) from ``before`` to
    ``after``, files in path order; a created file is diffed from ``/dev/null``, a deleted one
    to it. An empty file created or deleted has no lines to show and is left out.

    >>> print(make_patch({"m.py": "x = 1\\n"}, {"m.py": "x = 2\\n"}), end="")
    --- a/m.py
    +++ b/m.py
    @@ -1 +1 @@
    -x = 1
    +x = 2
    """
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        check_path(path, "patch")
        diff = difflib.unified_diff(split_lines(old or ""), split_lines(new or ""),
                                    "/dev/null" if old is None else f"a/{path}",
                                    "/dev/null" if new is None else f"b/{path}")
        out += [line if line.endswith("\n") else line + "\n" + NO_NEWLINE for line in diff]
    return "".join(out)


@dataclass
class _Hunk:
    header: str
    old_start: int
    old: list[str]
    new: list[str]


def _header_path(line: str, prefix: str, where: str) -> Optional[str]:
    """The path of a ``---``/``+++`` line (a timestamp after a tab dropped, git's ``a/``/``b/``
    taken off); None for ``/dev/null``."""
    path = line[4:].rstrip("\n").split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    return check_path(path[2:] if path.startswith(prefix) else path, f"patch: {where}")


def _read_hunk(lines: list[str], i: int, where: str) -> tuple[_Hunk, int]:
    """The hunk whose ``@@`` header is ``lines[i]``, and the index after it."""
    header = lines[i].rstrip("\n")
    match = _HUNK.match(header)
    if not match:
        raise RecordError(f"patch: {where}: {header!r} is not a hunk header '@@ -l,s +l,s @@'")
    old_left = 1 if match[2] is None else int(match[2])
    new_left = 1 if match[4] is None else int(match[4])
    hunk, body = _Hunk(header, int(match[1]), [], []), []
    i += 1
    while old_left or new_left or (i < len(lines) and lines[i] == NO_NEWLINE):
        line = lines[i] if i < len(lines) else ""
        op, text = (" ", "\n") if line == "\n" else (line[:1], line[1:])  # a context line stripped of its space
        if line == NO_NEWLINE and body:
            body[-1] = (body[-1][0], body[-1][1].removesuffix("\n"))
        elif op in " -" and old_left and (op == "-" or new_left):
            body.append((op, text))
            old_left, new_left = old_left - 1, new_left - (op == " ")
        elif op == "+" and new_left:
            body.append((op, text))
            new_left -= 1
        else:
            raise RecordError(f"patch: {where}: hunk {header!r} ends early: {old_left} old and {new_left} new "
                              f"lines still to come, then {line.rstrip(chr(10))!r}")
        i += 1
    hunk.old = [text for op, text in body if op in " -"]
    hunk.new = [text for op, text in body if op in " +"]
    return hunk, i


def _find(lines: list[str], old: list[str], want: int, start: int) -> Optional[int]:
    """Where ``old`` occurs in ``lines`` at or after ``start``, nearest to ``want``."""
    last = len(lines) - len(old)
    for at in sorted(range(start, last + 1), key=lambda at: (abs(at - want), at)):
        if lines[at:at + len(old)] == old:
            return at
    return None


def _apply_hunks(path: str, text: str, hunks: list[_Hunk]) -> str:
    lines, out, cursor = split_lines(text), [], 0
    for number, hunk in enumerate(hunks, start=1):
        want = hunk.old_start - 1 if hunk.old else hunk.old_start
        at = _find(lines, hunk.old, want, cursor) if hunk.old else (want if cursor <= want <= len(lines) else None)
        if at is None:
            found = lines[want:want + len(hunk.old)]
            differs = next((f"line {want + k + 1} is {got!r}, the hunk has {old!r}" for k, (got, old)
                            in enumerate(zip(found, hunk.old)) if got != old), "the file is shorter")
            raise RecordError(f"patch: {path}: hunk {number} ({hunk.header}) does not apply: {differs}")
        out += lines[cursor:at] + hunk.new
        cursor = at + len(hunk.old)
    return "".join(out + lines[cursor:])


def apply_patch(files: dict[str, str], diff: str) -> dict[str, str]:
    """``files`` with the unified diff ``diff`` applied (a new dict; ``files`` is left as it is).

    Lines outside a file's ``---``/``+++`` header and hunks (git's ``diff --git``, ``index``,
    prose) are skipped. A RecordError names the file and hunk that do not apply, a file the
    diff modifies that is not there, or creates that is; renames are not supported.

    >>> apply_patch({"m.py": "a\\nb\\nc\\n"}, "--- a/m.py\\n+++ b/m.py\\n@@ -2 +2 @@\\n-b\\n+B\\n")
    {'m.py': 'a\\nB\\nc\\n'}
    >>> apply_patch({"m.py": "a\\n"}, "--- a/m.py\\n+++ b/m.py\\n@@ -1 +1 @@\\n-z\\n+B\\n")
    Traceback (most recent call last):
    ...
    tempering.tasks.repo_records.RecordError: patch: m.py: hunk 1 (@@ -1 +1 @@) does not apply: line 1 is 'a\\n', the hunk has 'z\\n'
    """
    result, seen, lines, i = dict(files), set(), split_lines(diff), 0
    while i < len(lines):
        if lines[i].startswith(("+++ ", "@@")):
            raise RecordError(f"patch: line {i + 1}: {lines[i].rstrip(chr(10))!r} comes before any '--- path' line")
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise RecordError(f"patch: line {i + 1}: '---' is not followed by a '+++' line")
        old, new = _header_path(lines[i], "a/", f"line {i + 1}"), _header_path(lines[i + 1], "b/", f"line {i + 2}")
        path = new or old
        if path is None or (old and new and old != new):
            raise RecordError(f"patch: line {i + 1}: {old!r} -> {new!r}: a file is modified, created or deleted, "
                              "not renamed")
        if path in seen:
            raise RecordError(f"patch: {path} has two '---'/'+++' sections; give each file one")
        seen.add(path)
        if old is None and path in result:
            raise RecordError(f"patch: creates {path}, which is already there")
        if old is not None and path not in result:
            raise RecordError(f"patch: modifies {path}, which is not in the repository")
        i += 2
        hunks = []
        while i < len(lines) and lines[i].startswith("@@"):
            hunk, i = _read_hunk(lines, i, path)
            hunks.append(hunk)
        if not hunks:
            raise RecordError(f"patch: {path}: a '---'/'+++' header without hunks")
        text = _apply_hunks(path, result.get(path, ""), hunks)
        if new is None:
            if text:
                raise RecordError(f"patch: deletes {path}, but its hunks leave {len(split_lines(text))} lines")
            del result[path]
        else:
            result[path] = text
    return result
