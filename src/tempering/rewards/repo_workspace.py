"""The repository workspace an agent edits, and the tool calls it edits it with.

One module for both sides of ``env: repo``: the environment (:mod:`tempering.envs.repo`)
plays the calls as the model writes them, and the ``repo`` reward
(:mod:`tempering.rewards.repo`) replays the same calls from the episode's model turns to find
the patch it grades, so the grade depends on what the model wrote and on nothing an episode
kept. Both use :func:`parse_call` and :class:`Workspace`, so the two cannot disagree.

The call syntax, one call per model turn (its closing tag is a stop string, so the sampler
stops the turn right after it):

- ``<ls>FOLDER</ls>``: the files under ``FOLDER`` (empty: all of them), one path a line;
- ``<read>PATH</read>``: the file's text;
- ``<replace path="PATH"><old>OLD</old><new>NEW</new></replace>``: ``OLD`` (which must occur
  exactly once in the file) becomes ``NEW``; an empty ``OLD`` with a ``PATH`` that does not
  exist creates the file. One newline right after ``<old>`` and ``<new>`` is dropped, so each
  text may start on its own line; the rest is taken exactly;
- ``<patch>DIFF</patch>``: a unified diff (:mod:`tempering.rewards.repo_patch`) applied to the
  workspace;
- ``<test>SELECTION</test>``: run the visible tests (empty: all; else a test file or a
  ``path::name`` id) in the sandbox;
- ``<submit></submit>``: the workspace as it stands is the answer.

The workspace is a dict of path -> text in the caller's memory: nothing is written to the
host's disk, and a path outside the repository (absolute, ``..``) is refused and counted.

Not done here: running the tests (the environment), grading (the reward), several calls in
one turn (the last one counts, as in the tools environment).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from tempering.rewards.repo_patch import PatchError, apply_patch, make_patch, outside

TOOLS = ("ls", "read", "replace", "patch", "test", "submit")
EDITS = ("replace", "patch")
STOP = tuple(f"</{tool}>" for tool in TOOLS)
"""The closing tags: the environment's stop strings."""

_CALL = re.compile(r"<(ls|read|patch|test|submit)>(.*?)</\1>|<replace(\s[^>]*)?>(.*?)</replace>", re.DOTALL)
_PATH_ATTRIBUTE = re.compile(r'\s*path\s*=\s*"([^"]*)"\s*$')
_OLD_NEW = re.compile(r"\s*<old>\n?(.*?)</old>\s*<new>\n?(.*?)</new>\s*$", re.DOTALL)


class ToolError(ValueError):
    """A call that failed; its message becomes the ``error: ...`` observation."""


@dataclass(frozen=True)
class Call:
    """One parsed tool call; ``error`` says why a call of a known tool is malformed."""

    tool: str
    argument: str = ""
    path: str = ""
    old: str = ""
    new: str = ""
    error: str = ""


def parse_call(text: str) -> Optional[Call]:
    """The last tool call in a model turn, None when it holds none.

    >>> parse_call('fix: <replace path="pkg/a.py"><old>\\nx = 1\\n</old><new>\\nx = 2\\n</new></replace>')
    Call(tool='replace', argument='', path='pkg/a.py', old='x = 1\\n', new='x = 2\\n', error='')
    >>> parse_call("<read>pkg/a.py</read>").argument, parse_call("no call here")
    ('pkg/a.py', None)
    """
    calls = list(_CALL.finditer(text))
    if not calls:
        return None
    match = calls[-1]
    if match.group(1):
        argument = match.group(2)
        return Call(match.group(1), argument if match.group(1) == "patch" else argument.strip())
    path = _PATH_ATTRIBUTE.match(match.group(3) or "")
    body = _OLD_NEW.match(match.group(4))
    if not path or not body:
        return Call("replace", error='replace is <replace path="PATH"><old>OLD</old><new>NEW</new></replace>')
    return Call("replace", path=path.group(1).strip(), old=body.group(1), new=body.group(2))


def format_call(tool: str, argument: str = "", path: str = "", old: str = "", new: str = "") -> str:
    """A call as :func:`parse_call` reads it (for transcripts and prompts).

    >>> format_call("read", "pkg/a.py"), format_call("submit")
    ('<read>pkg/a.py</read>', '<submit></submit>')
    >>> parse_call(format_call("replace", path="a.py", old="x\\n", new="y\\n")).new
    'y\\n'
    """
    if tool == "replace":
        return f'<replace path="{path}"><old>\n{old}</old><new>\n{new}</new></replace>'
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; tools: {', '.join(TOOLS)}")
    return f"<{tool}>{argument}</{tool}>"


GUIDE = """You are working in a Python repository. Act with one tool call at a time:
<ls>FOLDER</ls> lists the files (empty: all); <read>PATH</read> shows a file;
<replace path="PATH"><old>
OLD TEXT</old><new>
NEW TEXT</new></replace> replaces text that occurs once in the file;
<patch>UNIFIED DIFF</patch> applies a diff; <test></test> runs the visible tests
(or <test>PATH</test> one file); <submit></submit> ends the task with the repository as it is.
Fix the issue without breaking the other modules' tests."""
"""How the tools read, as the environment puts it before the task's prompt."""


@dataclass
class Workspace:
    """A repository's files as an episode has changed them, ``original`` kept beside them."""

    original: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    outside: int = 0
    """Calls refused because they named a path outside the repository."""
    failed: int = 0
    """Edit calls that failed (counted by :func:`replay`)."""

    def __post_init__(self):
        self.files = dict(self.original)

    def path(self, path: str, must_exist: bool = True) -> str:
        if outside(path):
            self.outside += 1
            raise ToolError(f"{path!r} is outside the repository; paths are relative to its root, like "
                            f"{next(iter(sorted(self.original)), 'pkg/module.py')}")
        if must_exist and path not in self.files:
            raise ToolError(f"no file {path!r}; <ls></ls> lists the files")
        return path

    def list(self, folder: str) -> str:
        folder = folder.strip().strip("/")
        prefix = "" if folder in ("", ".") else self.path(folder, must_exist=False) + "/"
        found = [p for p in sorted(self.files) if p.startswith(prefix)]
        if not found:
            raise ToolError(f"no files under {folder!r}")
        return "\n".join(found)

    def read(self, path: str) -> str:
        return self.files[self.path(path)]

    def replace(self, path: str, old: str, new: str) -> str:
        if not old:
            if self.path(path, must_exist=False) in self.files:
                raise ToolError(f"{path} exists: give the text to replace in <old>")
            self.files[path] = new
            return f"created {path}"
        text = self.files[self.path(path)]
        count = text.count(old)
        if count != 1:
            raise ToolError(f"the old text occurs {count} times in {path}; it must occur exactly once "
                            "(quote more lines around it)" if count else
                            f"the old text is not in {path} as written; <read>{path}</read> shows the file")
        self.files[path] = text.replace(old, new)
        return f"replaced in {path}"

    def patch(self, diff: str) -> str:
        try:
            changed = apply_patch(self.files, diff)
        except PatchError as err:
            if "outside the repository" in str(err):
                self.outside += 1
            raise ToolError(str(err)) from None
        touched = sorted(p for p in set(changed) | set(self.files) if changed.get(p) != self.files.get(p))
        self.files = changed
        return "patched " + (", ".join(touched) or "nothing (no change)")

    def edit(self, call: Call) -> str:
        """Apply an edit call (``replace`` or ``patch``); a :class:`ToolError` when it fails."""
        if call.error:
            raise ToolError(call.error)
        if call.tool == "replace":
            return self.replace(call.path, call.old, call.new)
        return self.patch(call.argument)

    def diff(self) -> str:
        """The workspace's change as a unified diff against the original files."""
        return make_patch(self.original, self.files)


def replay(files: dict[str, str], turns: Sequence[str]) -> Workspace:
    """The workspace after the edit calls of ``turns`` (model turns' texts, in order, each one
    the environment acted on), played as the environment plays them; failed edits change
    nothing, as they did in the episode (whose turns end at its ``submit``)."""
    workspace = Workspace(files)
    for text in turns:
        call = parse_call(text)
        if call is None:
            continue
        if call.tool in EDITS:
            try:
                workspace.edit(call)
            except ToolError:
                workspace.failed += 1
        elif call.tool in ("ls", "read"):
            try:  # a read of an outside path is refused and counted as in the episode
                workspace.list(call.argument) if call.tool == "ls" else workspace.read(call.argument)
            except ToolError:
                pass
    return workspace


def record_of(problem) -> dict:
    """The repository record a problem carries in ``meta["repo"]`` (``RepoInstance.to_record()``
    of :mod:`tempering.tasks.repo_records`), or a ValueError naming the problem."""
    record = problem.meta.get("repo")
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise ValueError(f"problem {problem.key} has no repository record in meta['repo'] (a task of "
                         "repository instances puts RepoInstance.to_record() there)")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        if not isinstance(record.get(key, []), (list, tuple)):
            raise ValueError(f"problem {problem.key}: meta['repo'][{key!r}] is not a list of test ids")
    return record


def is_test_path(path: str) -> bool:
    """Whether a path belongs to the tests rather than the code under test: a ``tests``/``test``
    folder, a ``test_*.py`` or ``*_test.py`` file, or a ``conftest.py``.

    >>> [is_test_path(p) for p in ("tests/helpers.py", "pkg/test_stock.py", "pkg/stock.py", "conftest.py")]
    [True, True, False, True]
    """
    *folders, name = path.split("/")
    return (any(part in ("tests", "test", "testing") for part in folders) or name == "conftest.py"
            or (name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))))
