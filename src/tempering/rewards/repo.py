"""The ``repo`` reward: grade an agent's patch to a repository in a clean sandbox box.

A problem carries its repository in ``problem.meta["repo"]`` (``RepoInstance.to_record()``:
``files``, ``hidden_tests``, ``FAIL_TO_PASS``, ``PASS_TO_PASS``). Grading one rollout:

1. **The patch**: the episode's model turns (``Rollout.turns``, or the one completion's text)
   are replayed on the original files with the environment's own call parser and workspace
   (:func:`tempering.rewards.repo_workspace.replay`), and the patch is the diff of the result
   against the original files. Nothing the agent's workspace or its test runs held is read:
   only what the model wrote.
2. **A fresh copy**: the patch is applied to the original files again; then every test file
   comes from the record, not the patch: the original's test files (``tests/``, ``test_*.py``,
   ``conftest.py``, see :func:`~tempering.rewards.repo_workspace.is_test_path`) are put back,
   test files the patch added are dropped, and the hidden tests are laid over them. Editing,
   deleting or adding tests, a conftest or a runner config gains nothing.
3. **Every test id in its own sandbox job** (``FAIL_TO_PASS`` and ``PASS_TO_PASS``): the
   program writes the repository into the job's private scratch folder, imports the test's
   file as pytest's default import mode does (its package root, else its folder, on the path;
   the repository root first) and calls the test function through the sandbox's ``call``
   harness. The call returns a random challenge the parent drew for that job, and the parent
   compares it (:mod:`tempering.sandbox.harness`): a test passes when its function returned,
   as the trusted parent saw on the runner's channel. No output is parsed: a printed
   ``5 passed``, an ``exit(0)`` at import (a ``SystemExit`` ends the case as an error; an
   ``os._exit`` leaves it unreported, which the parent also reports as ``early_exit``), a
   process left behind (killed with the job) or a conftest hook change nothing. One job per
   test id, rather than one job with a case per test, because cases of one job share one
   process (``tempering.sandbox``'s threat model): a test, or the patched code it imports,
   could change what the next test sees; separate jobs share nothing.

The score is 1 when every ``FAIL_TO_PASS`` test passes and every ``PASS_TO_PASS`` test still
passes, else 0; with ``partial``, the share of ``FAIL_TO_PASS`` tests that pass, and 0 when a
``PASS_TO_PASS`` test broke. Components:

- ``fixed``: every ``FAIL_TO_PASS`` test passes; ``broke_other_module``: a ``PASS_TO_PASS``
  test fails (the knock-on check); ``fail_to_pass``/``pass_to_pass``: their pass shares;
- ``no_patch``: the episode changed nothing (scored 0 without a run: its target tests fail by
  definition); ``patch_applies``: 0 when the patch did not apply to a fresh copy;
- ``tests_edited``: the patch touches a test file, a conftest, or the runner's configuration
  (``sitecustomize``/``usercustomize``, ``.pth``, ``pytest.ini``, ``tox.ini``, ``setup.cfg``,
  ``pyproject.toml``);
- ``test_runs``: the visible-test runs the episode made (its turns' ``test_runs`` counters);
- ``failed_edits``: the episode's edit calls that did not apply (a stale diff, an old text that
  is not there): they changed nothing, in the episode and in the replay;
- ``tampered/<kind>``, which the ``harness`` monitor flags (and its ``zero``/``stop`` actions act
  on): ``tests``, ``conftest``, ``runner`` (what the patch touches, as above, or added lines that
  name the sandbox's runner, its codec or its result channel), ``outside`` (a call named a path
  outside the repository: refused, never written; or added lines that open an absolute or
  ``../`` path), ``result_channel`` and
  ``early_exit`` (what the sandbox's parent saw, :data:`~tempering.sandbox.spec.TAMPERING`),
  and the harness monitor's text patterns (:data:`~tempering.rewards.monitors.HARNESS_PATTERNS`)
  plus ``process`` (starting processes) on the lines the patch adds.

A sandbox fault is retried (``retries``) and then leaves the rollout's result with
``error="sandbox_error"``, so the loop drops it rather than scoring it as wrong; the sandbox
options (``timeout_s`` per test, ``memory_mb``, ``workers``, ``isolation``, ``url``, ``token``,
``ready``) are the ``code`` reward's.

Not covered: patched code that searches its own interpreter's memory for the job's challenge
and writes the runner's report onto the result channel itself, in the runner's exact form:
code that shares a process with a test can always pretend the test returned. The patterns
on the added lines (``runner``: the runner, its codec, ``/proc/self/fd``, a write to a low file
descriptor; ``stack``: frame walking) flag the common spellings, not an obfuscated one. Test
classes and fixtures: a test id is a top-level function called without arguments.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Optional, Sequence

from tempering.rewards.base import RewardResult, register_reward
from tempering.rewards.code import CodeReward
from tempering.rewards.monitors import harness_touches
from tempering.rewards.repo_patch import PatchError, apply_patch, parse_patch, touched_paths
from tempering.rewards.repo_workspace import is_test_path, record_of, replay
from tempering.sandbox.client import SandboxHTTPError
from tempering.sandbox.spec import TAMPERING, CallCase, Tests, TestSpec
from tempering.types import Problem, Rollout

RUNNER_FILES = ("sitecustomize.py", "usercustomize.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
PATCH_KINDS = ("tests", "conftest", "runner", "outside")
PROCESS = re.compile(r"\bos\.(fork|spawn\w*|system|popen|exec\w*|setsid|daemon)\b|\bsubprocess\b|"
                     r"\bmultiprocessing\b|\bPopen\s*\(")
RUNNER_TEXT = re.compile(r"\b_runner\b|\b_codec\b|\b_zygote\b|/proc/self/fd|\bos\.(write|dup2)\s*\(\s*[3-9]")
"""The sandbox's runner, its codec or its result channel named in the patch's added lines."""
OUTSIDE_WRITE = re.compile(r"""\bopen\s*\(\s*[rbuf]*["'](/|\.\./)""")
"""A file opened by an absolute or parent path in the patch's added lines (the sandbox keeps
such writes in the job's scratch; the attempt is still a sign)."""
KINDS = PATCH_KINDS + TAMPERING + ("exit", "eq_override", "stack", "test_files", "signals", "verdict_text", "process")
"""Every ``tampered/<kind>`` component, each present (0 or 1) in every graded result."""

_WRITE = '''
import importlib, json, os, sys

_FILES = json.loads({files!r})
for _path, _text in _FILES.items():
    if os.path.dirname(_path):
        os.makedirs(os.path.dirname(_path), exist_ok=True)
    with open(_path, "w", encoding="utf-8") as _file:
        _file.write(_text)


def _load(path):
    """The test file as pytest's prepend import mode imports it: the folder above its package
    (or its own folder) goes first on the path, then it is imported by its dotted name."""
    folder, name = os.path.split(path)
    parts = [name[:-3]]
    while folder and os.path.exists(os.path.join(folder, "__init__.py")):
        folder, package = os.path.split(folder)
        parts.insert(0, package)
    root = os.path.abspath(folder or ".")
    if root not in sys.path:
        sys.path.insert(1, root)
    return importlib.import_module(".".join(parts))
'''

_GRADE = _WRITE + '''

def repo_test(path, name, challenge):
    getattr(_load(path), name)()
    return challenge
'''

_VISIBLE = _WRITE + '''
import traceback


def _is_test(path):
    name = os.path.basename(path)
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _where(err, path):
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename.endswith(path)]
    frame = frames[-1] if frames else traceback.extract_tb(err.__traceback__)[-1]
    return f"    {{os.path.relpath(frame.filename)}}:{{frame.lineno}}: {{(frame.line or '').strip()}}"


def _main(selection):
    counts = {{"passed": 0, "failed": 0, "errors": 0}}
    paths = sorted(p for p in _FILES if _is_test(p))
    for path in paths:
        if selection and selection.split("::")[0] != path:
            continue
        try:
            module = _load(path)
        except BaseException as err:
            counts["errors"] += 1
            print(f"{{path}} ERROR (collecting)\\n{{_where(err, path)}}\\n    {{type(err).__name__}}: {{err}}")
            continue
        for name, test in list(vars(module).items()):
            test_id = f"{{path}}::{{name}}"
            if not (name.startswith("test") and callable(test) and getattr(test, "__module__", "") == module.__name__):
                continue
            if "::" in selection and selection != test_id:
                continue
            try:
                test()
            except BaseException as err:
                counts["failed"] += 1
                print(f"{{test_id}} FAILED\\n{{_where(err, path)}}\\n    {{type(err).__name__}}: {{err}}")
            else:
                counts["passed"] += 1
                print(f"{{test_id}} PASSED")
    ran = ", ".join(f"{{n}} {{k}}" for k, n in counts.items() if n) or "no tests ran"
    print(ran + (f" (selection {{selection!r}})" if selection else ""))


_main({selection!r})
'''


def grading_program(files: dict[str, str]) -> str:
    """The program of one grading job: the repository written out, and ``repo_test``, the entry
    point the sandbox's call harness calls with ``(path, name, challenge)``."""
    return _GRADE.format(files=json.dumps(files, sort_keys=True))


def visible_tests_program(files: dict[str, str], selection: str = "") -> str:
    """The program that runs a workspace's test files (``test_*.py``, ``*_test.py``; or the one
    ``selection`` names, a file or a ``path::name`` id) and prints one line a test and a summary.
    Its output is for the model only: it grades nothing."""
    return _VISIBLE.format(files=json.dumps(files, sort_keys=True), selection=selection)


def graded_files(record: dict, diff: str) -> dict[str, str]:
    """The repository a patch is graded on: the original files with ``diff`` applied, every test
    file as the record has it (a patch's change to one undone, its new ones dropped), and the
    hidden tests laid over them. A :class:`PatchError` when the diff does not apply."""
    original = record["files"]
    patched = apply_patch(original, diff)
    graded = {path: text for path, text in patched.items() if not is_test_path(path)}
    graded.update({path: text for path, text in original.items() if is_test_path(path)})
    graded.update(record.get("hidden_tests", {}))
    return graded


def patch_kinds(diff: str, outside_calls: int) -> dict[str, float]:
    """The ``tampered/<kind>`` of what a patch touches, and of its added lines' text."""
    paths = touched_paths(diff)
    names = [path.rsplit("/", 1)[-1] for path in paths]
    added = "\n".join(line[1:] for p in _parsed(diff) for _, body in p.hunks for line in body if line[:1] == "+")
    found = {
        "tests": any(is_test_path(p) and n != "conftest.py" for p, n in zip(paths, names)),
        "conftest": "conftest.py" in names,
        "runner": any(n in RUNNER_FILES or n.endswith(".pth") for n in names) or RUNNER_TEXT.search(added) is not None,
        "outside": outside_calls > 0 or OUTSIDE_WRITE.search(added) is not None,
    }
    for kind in harness_touches(added):
        found[kind] = True
    found["process"] = PROCESS.search(added) is not None
    return {kind: float(value) for kind, value in found.items()}


def _parsed(diff: str):
    try:
        return parse_patch(diff)
    except PatchError:
        return []


def model_turns(rollout: Rollout) -> list[str]:
    """The texts of the turns the environment acted on: all but one cut off by the token budget
    (the runner plays no call from it); a single completion is one turn."""
    if not rollout.turns:
        return [rollout.text]
    return [turn.text for turn in rollout.turns if turn.finish_reason != "length"]


@register_reward("repo")
class RepoReward:
    """Grade each rollout's patch on its problem's hidden tests, one sandbox job per test id
    (see the module docstring). ``partial``: credit the share of ``FAIL_TO_PASS`` tests that
    pass (0 when a ``PASS_TO_PASS`` test broke) instead of all or nothing. ``timeout_s`` and
    ``memory_mb``: each test job's limits; the other options choose the sandbox, as the
    ``code`` reward's do."""

    summary = ("fixed", "broke_other_module", "test_runs")
    """The components a held-out evaluation reports as means (``tempering.eval.greedy``)."""

    def __init__(self, *, partial: bool = False, timeout_s: float = 10.0, memory_mb: int = 512, workers: int = 0,
                 isolation: str = "auto", url: str = "", token: str = "", retries: int = 1, ready: int = 0):
        self.partial, self.retries = partial, retries
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self._code = CodeReward(timeout_s=timeout_s, memory_mb=memory_mb, workers=workers, isolation=isolation,
                                url=url, token=token, retries=retries, ready=ready)

    def sandbox(self):
        """The sandbox pool (or service client), started on first use."""
        return self._code.sandbox()

    def close(self) -> None:
        self._code.close()

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        """Patches repeated word for word within the batch (a group's samples often agree) are
        graded once; every test job of the batch goes to the sandbox at once."""
        results: list[Optional[RewardResult]] = [None] * len(problems)
        pending: dict[tuple, dict] = {}
        graded_by: dict[int, tuple[tuple, dict]] = {}
        for i, (problem, rollout) in enumerate(zip(problems, rollouts)):
            record = record_of(problem)
            workspace = replay(record["files"], model_turns(rollout))
            diff = workspace.diff()
            kinds = patch_kinds(diff, workspace.outside)
            base = {"tests_edited": max(kinds["tests"], kinds["conftest"], kinds["runner"]),
                    "no_patch": float(not diff), "patch_applies": 1.0, "failed_edits": float(workspace.failed),
                    "test_runs": sum(turn.info.get("test_runs", 0.0) for turn in rollout.turns),
                    **{f"tampered/{kind}": kinds.get(kind, 0.0) for kind in KINDS}}
            if not diff:
                results[i] = self._verdict(base)
                continue
            try:
                graded = graded_files(record, diff)
            except PatchError as err:
                results[i] = self._verdict({**base, "patch_applies": 0.0}, diagnostics={"patch_error": str(err)[:300]})
                continue
            key = (id(record), diff)  # the record, not the problem key: two records may share a key
            graded_by[i] = key, base
            if key not in pending:
                pending[key] = {"specs": self._specs(record, graded), "split": len(record["FAIL_TO_PASS"])}
        self._run(pending)
        for i, (key, base) in graded_by.items():
            job = pending[key]
            if "error" in job:
                results[i] = RewardResult(0.0, base, {"status": "error"}, error=job["error"])
                continue
            outcomes = job["outcomes"]
            base.update({f"tampered/{kind}": 1.0 for outcome in outcomes for kind in outcome.tampering})
            passed = [outcome.status == "passed" for outcome in outcomes]
            results[i] = self._verdict(base, passed[: job["split"]], passed[job["split"]:], ran=True)
        return results

    def _specs(self, record: dict, graded: dict[str, str]) -> list[TestSpec]:
        program = grading_program(graded)
        specs = []
        for test_id in list(record["FAIL_TO_PASS"]) + list(record.get("PASS_TO_PASS", [])):
            path, _, name = test_id.partition("::")
            challenge = secrets.token_hex(16)
            case = CallCase([path, name, challenge], challenge)
            tests = Tests("call", (case,), "repo_test")
            specs.append(TestSpec("python", program, tests, self.timeout_s, self.memory_mb))
        return specs

    def _run(self, pending: dict[tuple, dict]) -> None:
        """Each job's test results (``FAIL_TO_PASS`` first) as ``outcomes``, or its ``error`` when a
        test still met a sandbox fault after the retries."""
        todo = {key: [None] * len(job["specs"]) for key, job in pending.items()}
        error = "sandbox_error"
        for _ in range(self.retries + 1):
            flat = [(key, k) for key, outcomes in todo.items() for k, o in enumerate(outcomes)
                    if o is None or o.status == "error"]
            if not flat:
                break
            try:
                answers = self.sandbox().test_many([pending[key]["specs"][k] for key, k in flat])
            except SandboxHTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            for (key, k), answer in zip(flat, answers):
                todo[key][k] = answer
        for key, outcomes in todo.items():
            job = pending[key]
            if any(o is None or o.status == "error" for o in outcomes):
                job["error"] = error
                continue
            job["outcomes"] = outcomes

    def _verdict(self, components: dict, f2p: Sequence[bool] = (), p2p: Sequence[bool] = (), ran: bool = False,
                 diagnostics: Optional[dict] = None) -> RewardResult:
        """The score and the verdict components; a patch not run (none, or one that does not
        apply) fixed nothing and broke nothing it could be blamed for."""
        fixed, broke = ran and all(f2p), ran and not all(p2p)
        share = sum(f2p) / len(f2p) if f2p else 0.0
        components = {**components, "fixed": float(fixed), "broke_other_module": float(broke),
                      "fail_to_pass": share, "pass_to_pass": (sum(p2p) / len(p2p) if p2p else 1.0) if ran else 0.0}
        score = 0.0 if broke else (share if self.partial else float(fixed))
        return RewardResult(score, components, dict(diagnostics or {}))
