"""SandboxFusion's ``/run_code`` on this sandbox: the request, the job that runs it, the answer.

Request and answer follow SandboxFusion's server and its official client (``sandbox-fusion``),
so that code written against them (that client, verl's reward functions) scores the same here:

- ``run_result.status`` is ``Finished`` whenever the program ended, by itself or by a
  signal, whatever its exit status; ``TimeLimitExceeded`` (no return code) when it was
  stopped at ``run_timeout``; ``Error`` only when the sandbox failed. The top ``status`` is
  ``Success`` for a clean exit, ``Failed`` otherwise, and ``SandboxError`` for a sandbox
  failure (on which the official client raises, after retrying).
- a program ended by a signal has ``return_code`` minus its number (-11 for a segfault,
  -9 for SIGKILL), as SandboxFusion reports a killed process. Output past 1 MiB (stdout
  and stderr together) is left out and the program goes on, its run reported as it ended,
  ``message`` saying so (``sandbox_status`` is ``output_limit``, what the local executor,
  which stops such a run, reports); whenever a run is not clean, ``message`` carries this sandbox's
  finer status (``memory_limit``, ``timeout``...).
- ``compile_result`` comes with compiled languages (cpp, java), the compiler bounded by
  ``compile_timeout``; a failed compile has no ``run_result``.
- ``memory_limit_MB`` that is not positive (SandboxFusion's default, -1, is unlimited
  there) means the service's cap (``temper sandbox serve --max-memory-mb``), and a larger
  one is lowered to it; the official client cannot send the field at all, so its calls
  always get the cap.
- ``stdin`` and ``code`` must be UTF-8 text: a lone surrogate (``"\\ud800"``, which JSON
  carries) is a SpecError naming the field, answered 400 before any slot is taken.
- ``args`` (a list of strings) are added to pytest's command line, as SandboxFusion does;
  the other languages take none.
- ``files`` (relative path -> base64) are written into the program's folder before it is
  compiled and run (a Python program's folder is first on its ``sys.path``, as for
  ``python solution.py``, so a module sent there imports); ``fetch_files`` come back in ``files``, base64, up to 8 MiB in all
  (those that do not fit are named in ``message``). Both are done by short runs of fixed
  code inside the job's jail, as the slot's uid, so a hostile path, or a file the program
  swapped for a link, reaches no further than the program itself could.
- a language SandboxFusion knows that this machine cannot run is answered ``Failed``, with
  a message and no results, rather than with an HTTP error, which the official client
  retries for about 17 s before it raises.

``run_result`` also carries ``sandbox_status``, ``signal`` and ``cpu_time``, this
sandbox's finer result, which :class:`~tempering.sandbox.client.SandboxClient` reads.
"""

from __future__ import annotations

import base64
import binascii
import json
import signal
from dataclasses import dataclass

from tempering.sandbox.harness import _budget, _job
from tempering.sandbox.languages import get_language, offered
from tempering.sandbox.spec import Limits, RunRequest, SpecError, check_text

FETCH_BYTES = 8 << 20
_HELPER_LIMITS = Limits(timeout_s=30.0, memory_mb=1024, output_bytes=16 << 20)
# Every language SandboxFusion's server or client names; those this machine lacks are
# answered in SandboxFusion's shape instead of an HTTP error.
FUSION_LANGUAGES = frozenset((
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash",
    "typescript", "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia",
    "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift",
    "racket", "gtest", "react"))
# This sandbox's names for languages that SandboxFusion's client names otherwise.
_FUSION_NAMES = {"javascript": "nodejs"}


def offered_names() -> list:
    """The languages this machine runs, as SandboxFusion's client names them (its
    ``language`` field takes ``nodejs``, not ``javascript``)."""
    return [_FUSION_NAMES.get(name, name) for name in offered()]

# Fixed programs run in the jail before and after the user's: their data comes on stdin.
_WRITE_FILES = """
import base64, json, os, sys
for name, data in json.load(sys.stdin).items():
    if os.path.dirname(name):
        os.makedirs(os.path.dirname(name), exist_ok=True)
    with open(name, "wb") as handle:
        handle.write(base64.b64decode(data))
"""
_FETCH_FILES = """
import base64, json, os, sys
request = json.load(sys.stdin)
budget, found, over = request["limit"], {}, []
for name in request["names"]:
    if not os.path.isfile(name):
        continue
    with open(name, "rb") as handle:
        data = handle.read(budget + 1)
    if len(data) > budget:
        over.append(name)
        continue
    budget -= len(data)
    found[name] = base64.b64encode(data).decode()
print(json.dumps({"files": found, "over": over}))
"""


class LanguageMissing(Exception):
    """A SandboxFusion language this machine cannot run; answered ``Failed``, not refused."""


@dataclass(frozen=True)
class FusionRequest:
    run: RunRequest
    compile_timeout_s: float
    files: dict  # relative path -> base64 text, as sent
    fetch: tuple  # relative paths to send back
    args: tuple = ()  # extra arguments of the program's command (pytest's)


@dataclass(frozen=True)
class FusionJob:
    job: dict  # the worker job
    steps: tuple  # what each of the job's runs is: "write", "compile", "program", "fetch"

    @property
    def budget_s(self) -> float:
        """How long the worker may take over the whole job before it counts as hung."""
        return _budget(self.job)


def _relative_path(field: str, name) -> str:
    parts = name.split("/") if isinstance(name, str) else [""]  # a leading '/' gives an empty part
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise SpecError(f"{field}: {name!r} must be a relative path inside the program's folder "
                        "(no leading '/', no '.' or '..' parts)")
    return name


def _files(body: dict, language: str) -> dict:
    files = body.get("files") or {}
    if not isinstance(files, dict):
        raise SpecError("'files' must be an object mapping relative paths to base64 content")
    source = get_language(language).filename if get_language(language).tool else None
    kept = {}
    for name, data in files.items():
        _relative_path(f"files[{name!r}]", name)
        if name == source:
            raise SpecError(f"files[{name!r}] would replace the program's own source file")
        if data is None:  # SandboxFusion skips entries without content
            continue
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, TypeError, ValueError) as err:
            raise SpecError(f"files[{name!r}] must be base64 text: {err}") from None
        kept[name] = data
    return kept


def _fetch(body: dict) -> tuple:
    names = body.get("fetch_files") or []
    if not isinstance(names, list):
        raise SpecError("'fetch_files' must be a list of relative paths")
    return tuple(_relative_path(f"fetch_files[{i}]", name) for i, name in enumerate(names))


def _args(body: dict, language: str) -> tuple:
    """``args``: pytest's extra command-line arguments, as SandboxFusion passes them; the
    other languages' runs take none (SandboxFusion ignores the field for them)."""
    args = body.get("args") or []
    if not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        raise SpecError("'args' must be a list of strings (pytest's command-line arguments)")
    for index, arg in enumerate(args):
        check_text(f"args[{index}]", arg)
    return tuple(args) if get_language(language).name == "pytest" else ()


def _memory(body: dict, max_memory_mb: int):
    """``memory_limit_MB`` as this service applies it: not positive (SandboxFusion's -1,
    unlimited) or over ``max_memory_mb``, the cap; a value of another type is left for
    :class:`Limits` to refuse, naming the field."""
    memory = body.get("memory_limit_MB", -1)
    if type(memory) is int and (memory <= 0 or memory > max_memory_mb):
        return max_memory_mb
    return memory


def parse_request(body, max_memory_mb: int) -> FusionRequest:
    """Read a ``/run_code`` body; ``max_memory_mb`` caps ``memory_limit_MB`` and stands in for
    a missing or non-positive one. Raises SpecError naming the field, or LanguageMissing."""
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        raise SpecError("/run_code needs a JSON object with a string 'code'")
    language = body.get("language", "python")
    if not isinstance(language, str):
        raise SpecError("'language' must be a string such as 'python'")
    try:
        get_language(language)
    except SpecError as err:
        if language in FUSION_LANGUAGES:
            raise LanguageMissing(f"language {language!r} cannot run on this sandbox service "
                                  f"(no toolchain for it here); it runs: {', '.join(offered_names())}") from err
        raise
    stdin = body.get("stdin")
    check_text("stdin", "" if stdin is None else stdin)
    compile_timeout = body.get("compile_timeout", 10.0)
    if isinstance(compile_timeout, bool) or not (isinstance(compile_timeout, (int, float))
                                                 and 0 < compile_timeout <= 600):
        raise SpecError(f"'compile_timeout' must be a number of seconds in (0, 600], got {compile_timeout!r}")
    limits = Limits(timeout_s=body.get("run_timeout", 10.0), memory_mb=_memory(body, max_memory_mb))
    return FusionRequest(RunRequest(body["code"], language, stdin or "", limits), float(compile_timeout),
                         _files(body, language), _fetch(body), _args(body, language))


def _helper(code: str, stdin) -> dict:
    return _job("python", code, [json.dumps(stdin)], _HELPER_LIMITS)["runs"][0]


def build_job(request: FusionRequest) -> FusionJob:
    run = request.run
    job = _job(run.language, run.code, [run.stdin], run.limits)
    program = job["runs"][0]
    program["truncate_output"] = True  # SandboxFusion keeps the first output_bytes and lets it run
    if request.args:
        program["argv"] = [*program["argv"], *request.args]
    if job["compile"]:
        job["compile"].update(timeout_s=request.compile_timeout_s,
                              total_timeout_s=request.compile_timeout_s)
    steps = []
    if request.files:
        steps.append(("write", _helper(_WRITE_FILES, request.files)))
        if job["compile"]:
            # The files must be in place before the compiler runs, so it becomes a run too.
            steps.append(("compile", job["compile"]))
            job["compile"] = None
    steps.append(("program", program))
    if request.fetch:
        steps.append(("fetch", _helper(_FETCH_FILES, {"names": list(request.fetch), "limit": FETCH_BYTES})))
    job["runs"] = [step for _, step in steps]
    return FusionJob(job, tuple(name for name, _ in steps))


def command_result(outcome: dict) -> dict:
    """One compile or run outcome as SandboxFusion's CommandRunResult (plus finer keys)."""
    status = outcome["status"]
    timed_out = status == "timeout"
    code = outcome["exit_code"]
    if code is None and outcome["signal"]:
        code = -signal.Signals[outcome["signal"]].value
    label = "Error" if status == "sandbox_error" else "TimeLimitExceeded" if timed_out else "Finished"
    return {"status": label, "execution_time": outcome["wall_s"],
            "return_code": None if timed_out else code,
            "stdout": outcome["stdout"], "stderr": outcome["stderr"],
            "sandbox_status": status, "signal": outcome["signal"], "cpu_time": outcome["cpu_s"]}


def answer(status: str, message: str, **results) -> dict:
    """A ``/run_code`` answer in SandboxFusion's RunCodeResponse shape."""
    return {"status": status, "message": message, "compile_result": results.get("compile_result"),
            "run_result": results.get("run_result"), "files": results.get("files", {}),
            "executor_pod_name": None}


def _fetched(outcome, notes: list) -> dict:
    if outcome is None:
        return {}
    try:
        found = json.loads(outcome["stdout"]) if outcome["status"] == "ok" else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        notes.append(f"fetch_files could not be read ({outcome['status']}): {outcome['stderr'][-300:]}")
        return {}
    if found["over"]:
        notes.append(f"fetch_files over {FETCH_BYTES} bytes in all, left out: {', '.join(found['over'])}")
    return found["files"]


def response(job: FusionJob, reply: dict) -> dict:
    """The SandboxFusion answer to one job's raw reply."""
    if "error" in reply:
        return answer("SandboxError", reply["error"])
    outcomes = dict(zip(job.steps, reply["runs"]))
    compiled = reply.get("compile") or outcomes.get("compile")
    for outcome in [compiled, *outcomes.values()]:
        if outcome and outcome["status"] == "sandbox_error":
            return answer("SandboxError", outcome["stderr"][-2000:])
    written = outcomes.get("write")
    if written and written["status"] != "ok":
        return answer("Failed", f"the request's files could not be written ({written['status']}): "
                                f"{written['stderr'][-300:]}")
    notes = []
    results = {"compile_result": command_result(compiled) if compiled else None}
    if compiled and compiled["status"] != "ok":
        notes.append("compile_error")
    elif "program" in outcomes:
        results["run_result"] = command_result(outcomes["program"])
        if outcomes["program"]["status"] != "ok":
            notes.append(outcomes["program"]["status"])
    status = "Failed" if notes else "Success"
    results["files"] = _fetched(outcomes.get("fetch"), notes)
    if outcomes.get("program", {}).get("truncated"):
        # The finer status says what the local executor would (it stops such a run), so
        # SandboxClient reads the same verdict; SandboxFusion's own fields tell how it ended.
        results["run_result"]["sandbox_status"] = "output_limit"
        notes.append(f"output past {job.job['runs'][job.steps.index('program')]['output_bytes']} "
                     "bytes was left out")
    return answer(status, "; ".join(notes), **results)
