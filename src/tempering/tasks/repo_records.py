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
:func:`apply_patch` applies one, both the grader's own (``tempering.rewards.repo_patch``), so a
record's reference patch is read exactly as a model's submission is: every context and removed
line must match, and a hunk is placed where its text is, nearest the line its header names.

A test id is ``path::name`` (``tests/test_stock.py::test_restock``), a top-level test function
of a file in ``files`` or ``hidden_tests``. Paths are relative, ``/``-separated, with no ``..``
and no leading ``/``.

Not here: generating instances (``tempering.tasks.repo``), playing one (``tempering.envs.repo``)
or grading a patch (``tempering.rewards.repo``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from tempering.rewards.repo_patch import PatchError, make_patch
from tempering.rewards.repo_patch import apply_patch as _apply_patch

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

def apply_patch(files: dict[str, str], diff: str) -> dict[str, str]:
    """``files`` with the unified diff ``diff`` applied (a new dict), as the grader applies it
    (:func:`tempering.rewards.repo_patch.apply_patch`); a RecordError naming the file and hunk
    that do not apply.

    >>> apply_patch({"m.py": "a\\nb\\nc\\n"}, "--- a/m.py\\n+++ b/m.py\\n@@ -2 +2 @@\\n-b\\n+B\\n")
    {'m.py': 'a\\nB\\nc\\n'}
    """
    try:
        return _apply_patch(files, diff)
    except PatchError as exc:
        raise RecordError(f"patch: {exc}") from None
