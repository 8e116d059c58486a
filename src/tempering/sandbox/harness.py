"""Harnesses: turn requests and test specs into sandbox jobs, and judge the outcomes.

Everything here runs in the trusted parent. The sandbox reports raw facts (exit status,
output, the values the entry point returned); the verdicts are computed here, against
expected values that never leave this process.

- ``stdio``: each case is one run fed the case's stdin; it passes when the run exits 0 and
  its stdout equals the expected text after normalisation: ``\\r\\n`` reads as ``\\n``,
  whitespace at the end of each line and empty lines at the end are ignored.
- ``call``: one run executes the program, then calls the entry point once per case with
  the case's arguments; returned values travel back as tagged JSON and are compared here.
  When a case kills the run (timeout, crash, memory), that case takes the run's status and
  the remaining cases continue in a fresh run.
- ``program``: the code must run to its end in the sandbox (Python only). This is the
  weaker verdict used for tests that cannot be split into calls; results say so.

Beside the verdicts, the parent reports what it saw a program do to its harness
(``TestResult.tampering``, see :data:`~tempering.sandbox.spec.TAMPERING`): the runner's
messages on the result channel have a fixed order (``start`` then the report of each case,
a ``done`` only after a program check's end, nothing in a stdio run), so lines outside that
order, and an exit with status 0 before the checks all ran, are facts about the program,
however its source spells them. They are reported, never rewarded: cases are judged by
their values as before.

``execute`` is any callable ``(job: dict, timeout_s: float) -> reply dict``: the local
executor or, in tests, anything that speaks the worker protocol.
"""

from __future__ import annotations

import json
import math

from tempering.sandbox import _codec
from tempering.sandbox.languages import get_language
from tempering.sandbox.spec import (CaseResult, Limits, RunRequest, RunResult, SpecError,
                                    TestResult, TestSpec, values_match)

_MIB = 1 << 20
_GRACE_S = 10.0
_COMPILE_LIMITS = {"cpu_s": 60, "file_size": 256 * _MIB, "open_files": 256, "processes": 64,
                   "core": 0, "stack": 16 * _MIB, "locked_memory": 64 << 10, "message_queue": 0}


def has_sandbox_error(reply: dict) -> bool:
    outcomes = [reply.get("compile")] + list(reply.get("runs", []))
    return any(o and o["status"] == "sandbox_error" for o in outcomes)


def normalize_output(text: str) -> str:
    """The stdio comparison form: trailing whitespace per line and trailing blank lines go."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _rlimits(limits: Limits, extra_address_space_mb: int, cpu_budget_s: float) -> dict:
    return {
        "address_space": (limits.memory_mb + extra_address_space_mb) * _MIB,
        "cpu_s": int(math.ceil(cpu_budget_s)) + 1,
        "file_size": limits.file_size_mb * _MIB,
        "open_files": limits.open_files,
        "processes": limits.processes,
        "core": 0,
        "stack": 16 * _MIB,
        "locked_memory": 64 << 10,
        "message_queue": 0,
    }


def _job(language_name: str, code: str, stdins, limits: Limits, call=None, check=False) -> dict:
    """One job: an optional compile step, then one run per stdin (all in one scratch dir)."""
    language = get_language(language_name)
    total = limits.timeout_s * (len(call["cases"]) + 1) if call else limits.timeout_s
    base = {"timeout_s": limits.timeout_s, "total_timeout_s": total,
            "output_bytes": limits.output_bytes,
            "rlimits": _rlimits(limits, language.extra_address_space_mb, total)}
    argv = language.run_argv(limits.memory_mb)
    job = {"files": {}, "compile": None, "runs": []}
    if argv is None:
        base.update(code=code, call=call, check=check)
    else:
        base["argv"] = argv
        job["files"][language.filename] = code
    if language.compile_argv():
        compile_limits = dict(_COMPILE_LIMITS, address_space=language.compile_memory_mb * _MIB)
        job["compile"] = {"argv": language.compile_argv(), "timeout_s": language.compile_timeout_s,
                          "output_bytes": 1 * _MIB, "rlimits": compile_limits}
    job["runs"] = [dict(base, stdin=stdin) for stdin in stdins]
    return job


def _budget(job: dict) -> float:
    runs = sum(run["total_timeout_s"] for run in job["runs"])
    return runs + (job["compile"]["timeout_s"] if job["compile"] else 0) + _GRACE_S


def _result(outcome: dict) -> RunResult:
    return RunResult(outcome["status"], outcome["exit_code"], outcome["signal"],
                     outcome["stdout"], outcome["stderr"], outcome["wall_s"], outcome["cpu_s"])


def _failure(status: str, stderr: str, compiled: dict | None = None) -> RunResult:
    if compiled is None:
        return RunResult(status, None, None, "", stderr, 0.0, 0.0)
    return RunResult(status, compiled["exit_code"], compiled["signal"], compiled["stdout"],
                     compiled["stderr"] or stderr, compiled["wall_s"], compiled["cpu_s"])


def _compile_failure(reply: dict) -> RunResult | None:
    """A RunResult standing for the whole job when it never reached its runs."""
    if "error" in reply:
        return _failure("sandbox_error", reply["error"])
    compiled = reply.get("compile")
    if compiled and compiled["status"] != "ok":
        status = "sandbox_error" if compiled["status"] == "sandbox_error" else "compile_error"
        return _failure(status, f"compilation ended with {compiled['status']}", compiled)
    return None


def run_program(execute, request: RunRequest) -> RunResult:
    """Run one program on its stdin and report what happened."""
    job = _job(request.language, request.code, [request.stdin], request.limits)
    reply = execute(job, _budget(job))
    return _compile_failure(reply) or _result(reply["runs"][0])


def run_tests(execute, spec: TestSpec) -> TestResult:
    """Run a test spec and judge every case here, in the parent."""
    kind = spec.tests.kind
    if kind == "stdio":
        return _run_stdio(execute, spec)
    if get_language(spec.language).name != "python":
        raise SpecError(f"'{kind}' tests need language 'python'; use 'stdio' tests for {spec.language}")
    if kind == "call":
        return _run_call(execute, spec)
    return _run_program_check(execute, spec)


def _run_stdio(execute, spec: TestSpec) -> TestResult:
    cases = spec.tests.cases
    job = _job(spec.language, spec.code, [case.stdin for case in cases], spec.limits)
    reply = execute(job, _budget(job))
    failed = _compile_failure(reply)
    if failed:
        return TestResult.from_cases(CaseResult(failed.status, 0.0, failed.stderr) for _ in cases)
    results, tampering = [], set()
    for case, outcome in zip(cases, reply["runs"]):
        tampering |= _tampering(_messages(outcome), outcome["status"], [])
        status = outcome["status"]
        if status == "ok":
            same = normalize_output(outcome["stdout"]) == normalize_output(case.stdout)
            status = "passed" if same else "wrong_answer"
        detail = f"printed {outcome['stdout'][:200]!r}" if status == "wrong_answer" else outcome["stderr"][-500:]
        results.append(CaseResult(status, outcome["wall_s"], detail))
    return TestResult.from_cases(results, tampering=tampering)


def _run_program_check(execute, spec: TestSpec) -> TestResult:
    job = _job("python", spec.code, [""], spec.limits, check=True)
    reply = execute(job, _budget(job))
    failed = _compile_failure(reply)
    if failed:
        return TestResult.from_cases([CaseResult(failed.status, 0.0, failed.stderr)], "program")
    outcome = reply["runs"][0]
    messages = _messages(outcome)
    done = any(message.get("done") is True for message in messages)
    tampering = _tampering(messages, outcome["status"], [("done", None)], finished=done)
    status = outcome["status"]
    if status == "ok":
        status = "passed" if done else "runtime_error"
    return TestResult.from_cases([CaseResult(status, outcome["wall_s"], outcome["stderr"][-500:])],
                                 "program", tampering)


def _parse(line: str) -> dict:
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _messages(outcome: dict) -> list:
    """The run's result-channel messages, each parsed once ({} for a line that is not one)."""
    return [_parse(line) for _, line in outcome["events"]]


def _tampering(messages: list, status: str, expected: list, finished: bool = True) -> set:
    """The kinds of tampering one run shows, from its parsed ``messages`` and ``status``.
    ``expected``: the ``(kind, case)`` messages the runner sends in this run, in order (a run
    cut short stops anywhere; a ``memory_error`` report may come last); ``finished``: whether
    the run's checks all reported."""
    if messages and messages[-1] == {"memory_error": True}:
        messages = messages[:-1]
    kinds = set()
    if len(messages) > len(expected) or any(_shape(m) != e for m, e in zip(messages, expected)):
        kinds.add("result_channel")
    if status == "ok" and not finished:
        kinds.add("early_exit")
    return kinds


def _shape(message: dict):
    """``(kind, case)`` of a message in a form the runner sends, None for any other."""
    if message == {"done": True}:
        return ("done", None)
    index = message.get("start", message.get("case"))
    if type(index) is not int:
        return None
    if message.keys() == {"start"}:
        return ("start", index)
    if message.keys() in ({"case", "value"}, {"case", "error", "message"}):
        return ("case", index)
    return None


def _run_call(execute, spec: TestSpec) -> TestResult:
    cases = spec.tests.cases
    results = [None] * len(cases)
    pending = list(range(len(cases)))
    tampering: set = set()
    while pending:
        call = {"entry_point": spec.tests.entry_point,
                "cases": [[i, _codec.encode(cases[i].args)] for i in pending]}
        job = _job("python", spec.code, [""], spec.limits, call=call)
        reply = execute(job, _budget(job))
        failed = _compile_failure(reply)
        if failed:
            for i in pending:
                results[i] = CaseResult(failed.status, 0.0, failed.stderr)
            break
        pending = _judge_call_run(spec, reply["runs"][0], pending, results, tampering)
    return TestResult.from_cases(results, tampering=tampering)


def _judge_call_run(spec: TestSpec, outcome: dict, pending: list, results: list, tampering: set) -> list:
    """Fill ``results`` from one run's reports and ``tampering`` with what the run shows;
    return the cases still to run."""
    starts, reports, waiting = {}, {}, set(pending)
    messages = _messages(outcome)
    for (arrived, _), message in zip(outcome["events"], messages):
        index = message.get("start", message.get("case"))
        if type(index) is not int or index not in waiting:
            continue
        if "start" in message:
            starts.setdefault(index, arrived)
        else:
            reports.setdefault(index, (arrived, message))
    expected = [step for index in pending for step in (("start", index), ("case", index))]
    tampering |= _tampering(messages, outcome["status"], expected, finished=len(reports) == len(pending))
    run_status = "runtime_error" if outcome["status"] == "ok" else outcome["status"]
    remaining = []
    for index in pending:
        started = starts.get(index, 0.0)
        if index in reports:
            arrived, message = reports[index]
            results[index] = _judge_report(spec.tests.cases[index], message, arrived - started)
        elif index in starts or not starts:
            # This case was running when the run ended, or the program never reached its
            # first case (it crashed, exited or hung at module level): no fresh run helps.
            wall = outcome["wall_s"] - started if index in starts else outcome["wall_s"]
            detail = outcome["stderr"][-500:] or f"the run ended with {outcome['status']}"
            results[index] = CaseResult(run_status, round(max(wall, 0.0), 6), detail)
        else:
            remaining.append(index)
    return remaining


def _judge_report(case, message: dict, wall_s: float) -> CaseResult:
    wall_s = round(max(wall_s, 0.0), 6)
    if "error" in message:
        status = message["error"] if message["error"] == "memory_limit" else "runtime_error"
        return CaseResult(status, wall_s, str(message.get("message", ""))[:500])
    try:
        actual = _codec.decode(message.get("value"))
    except (ValueError, TypeError, RecursionError):
        return CaseResult("wrong_answer", wall_s, "the returned value could not be decoded")
    if values_match(case, actual):
        return CaseResult("passed", wall_s)
    return CaseResult("wrong_answer", wall_s, f"returned {repr(actual)[:200]}")
