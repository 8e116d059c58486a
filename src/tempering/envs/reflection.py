"""Reflection: the model answers with code, the code runs against the problem's tests, and the
first failing test (or the error) comes back as the next user turn, until it passes or the
episode's ``max_turns`` run out.

Grading is the code reward's, unchanged: the same tests (``problem.meta["tests"]`` or a
HumanEval record), the same program (``code_prefix``, the fenced block), the same sandbox, and
the verdict from the trusted parent. So an episode ends exactly when the task's own reward
would score its last turn as passing, and that reward grades the episode (``Rollout.text``);
the environment adds nothing unless ``turn_penalty`` charges for each turn.

The feedback says what one failing test says and no more: the first failing case's call and
expected value (or input and expected output) with what came back, or the error's last line
(a syntax error, an exception, a timeout), or that no code block was found. It never shows
the other cases, the reference solution or the test source beyond the failing assert.

For a raw problem (the built-in model's: ``code_prefix`` ends with the ``def`` line and the
answer is the body, unfenced) the feedback ends with that ``def`` line again instead of asking
for a fenced block, so the next answer is a body as the first was. :func:`feedback_for` writes
the same turn for case results computed elsewhere: the ``code`` task's pre-training corpus runs
its own (trusted) buggy programs in-process and writes reflection transcripts with it, so the
model sees in pre-training exactly the text this environment sends.

Not done here: feedback from several failing cases at once, hints beyond the test.
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Sequence
from typing import Any, Optional

from tempering.envs.base import Step
from tempering.rewards.base import build_reward
from tempering.rewards.code import CodeReward, problem_tests
from tempering.sandbox.spec import CallCase, CaseResult, TestResult, TestSpec
from tempering.types import Problem, Prompt

_MAX_SHOWN = 300  # characters of one value, call or error line in the feedback
_TRACEBACK_LINE = re.compile(r'File "solution\.py", line (\d+)')
_GRADERS: dict[tuple, CodeReward] = {}
_GRADERS_LOCK = threading.Lock()


def shared_grader(name: str, options: dict[str, Any]) -> CodeReward:
    """The code reward ``name`` with ``options``, one per process: every episode's environment
    runs its tests on the same sandbox pool instead of starting one of its own."""
    key = (name, tuple(sorted((k, repr(v)) for k, v in options.items())))
    with _GRADERS_LOCK:
        if key not in _GRADERS:
            grader = build_reward(name, options)
            if not isinstance(grader, CodeReward):
                raise ValueError(f"reflection: grader {name!r} is not a code reward (code, humaneval)")
            atexit.register(grader.close)
            _GRADERS[key] = grader
        return _GRADERS[key]


class ReflectionEnv:
    """Run each answer's code; on failure ask again with the first failing test.

    ``grader``: the code reward whose tests and program the episode uses (``code``,
    ``humaneval``); empty = ``humaneval`` for HumanEval problems, else ``code``.
    ``grader_options``: that reward's options (``timeout_s``, ``workers``, ``url``, ...).
    ``turn_penalty``: subtracted for every model turn, as the reward part ``env/turn_penalty``
    (0 = none), so that a solution found earlier earns more.
    """

    stop: tuple[str, ...] = ()

    def __init__(self, grader: str = "", turn_penalty: float = 0.0, grader_options: Optional[dict] = None):
        if not turn_penalty >= 0:
            raise ValueError(f"reflection: turn_penalty must be 0 or more, got {turn_penalty!r}")
        self.grader_name, self.turn_penalty = grader, float(turn_penalty)
        self.grader_options = dict(grader_options or {})
        shared_grader(grader or "code", self.grader_options)  # a bad name or option fails here, not mid-episode
        self._problem: Optional[Problem] = None
        self._grader: Optional[CodeReward] = None
        self._turns = 0

    def reset(self, problem: Problem) -> Prompt:
        name = self.grader_name or ("humaneval" if "humaneval" in problem.meta else "code")
        self._problem, self._grader, self._turns = problem, shared_grader(name, self.grader_options), 0
        return problem.prompt

    def step(self, completion: str) -> Step:
        if self._problem is None or self._grader is None:
            raise RuntimeError("reflection: step() before reset()")
        self._turns += 1
        problem, rewards = self._problem, ({"turn_penalty": -self.turn_penalty} if self.turn_penalty else {})
        code = self._grader.code_of(problem, completion)
        spec = self._grader.spec(problem, code or "")

        def retry(message: str) -> Step:
            text = retry_text(problem, message, spec)
            return Step([{"role": "user", "content": text}], rewards, done=False, info={"rounds": 1.0, "passed": 0.0})

        if code is None:
            return retry(f"No ```{spec.language} code block found in your answer.")
        error = _syntax_error(spec)
        if error:
            return retry(f"Your code has a syntax error: {error}.")
        result = self._grader.sandbox().test(spec)
        if result.status == "passed":
            fixed = {"fixed": 1.0} if self._turns > 1 else {}  # passed after feedback: a step's env/fixed is their share
            return Step(None, rewards, done=True, info={"rounds": 1.0, "passed": 1.0, **fixed})
        if result.status == "error":  # a sandbox fault says nothing about the code: stop asking
            return Step(None, rewards, done=True, info={"rounds": 1.0, "passed": 0.0, "sandbox_errors": 1.0})
        return retry(failure_message(spec, result))


def retry_text(problem: Problem, message: str, spec: TestSpec) -> str:
    """``message`` and what to do: for a raw problem, the prompt's ``def`` line to continue
    after; else a request for the whole function (call tests, HumanEval) or program in a block."""
    prefix = problem.meta.get("code_prefix", "")
    if not problem.meta.get("code_fenced", True) and prefix.strip():
        return f"{message} Fix it.\n{prefix.rstrip().splitlines()[-1]}"
    function = spec.tests.kind == "call" or "humaneval" in problem.meta
    what = "the whole function" if function else "the whole program"
    return f"{message} Fix it; answer with {what} in a ```{spec.language} block."


def feedback_for(problem: Problem, cases: Sequence[CaseResult]) -> Optional[str]:
    """The user turn this environment sends after an answer to ``problem`` (call or stdio
    tests, Python) whose cases came out as ``cases``, or None when every case passed. The
    verdicts are the caller's: the corpus computes them for its own programs in-process."""
    spec = TestSpec("python", "", problem_tests(problem))
    result = TestResult.from_cases(cases)
    if result.status == "passed":
        return None
    return retry_text(problem, failure_message(spec, result), spec)


def _syntax_error(spec: TestSpec) -> str:
    """Python's own description of a syntax error in the program, found by compiling it here
    (compiling runs nothing), or "" when it compiles or is not Python."""
    if spec.language != "python":
        return ""
    try:
        compile(spec.code, "<answer>", "exec")
    except SyntaxError as err:
        where = f" in `{_shorten(err.text.strip())}`" if err.text and err.text.strip() else ""
        return f"{err.msg}{where}"
    except (ValueError, RecursionError, MemoryError):  # null bytes, absurd nesting: the sandbox judges
        return ""
    return ""


def failure_message(spec: TestSpec, result: TestResult) -> str:
    """The first failing case as one sentence: what was asked, what was expected, what came back."""
    index = next(i for i, case in enumerate(result.cases) if case.status != "passed")
    outcome = _outcome(result.cases[index], spec)
    if spec.tests.kind == "call":
        return f"Your code failed this test: {_assertion(spec.tests.entry_point, spec.tests.cases[index])} ({outcome})."
    if spec.tests.kind == "stdio":
        case = spec.tests.cases[index]
        return (f"Your program failed this test: input {_shorten(repr(case.stdin))}, "
                f"expected output {_shorten(repr(case.stdout))} ({outcome}).")
    return f"Your code failed the tests: {_failed_assert(result.cases[index].detail, spec.code) or outcome}."


def _assertion(entry_point: str, case: CallCase) -> str:
    """The case as the assert a person would write (``assert f(3) == 9``)."""
    call = _shorten(f"{entry_point}({', '.join(repr(arg) for arg in case.args)})")
    if case.compare == "truthy":
        return f"assert {call}"
    if case.compare == "falsy":
        return f"assert not {call}"
    if case.compare == "approx":
        return f"assert abs({call} - {case.expected!r}) < {case.tolerance:g}"
    if case.compare == "root":  # HumanEval/32's check, in the words of its prompt's poly()
        return f"assert abs(poly({_shorten(repr(case.expected))}, {call})) < {case.tolerance:g}"
    return f"assert {call} == {_shorten(repr(case.expected))}"


def _outcome(case: CaseResult, spec: TestSpec) -> str:
    if case.status == "timeout":
        return f"it ran past the time limit of {spec.timeout_s:g} s"
    if case.status == "memory_limit":
        return "it ran out of memory"
    if case.status == "output_limit":
        return "it wrote too much output"
    if case.status == "wrong_answer":
        return _shorten(case.detail) or "wrong answer"
    return _last_line(case.detail) or case.status.replace("_", " ")


def _failed_assert(detail: str, code: str) -> str:
    """The failing assert's line of the program, read here from the line number the traceback
    names (the sandbox runs code without its source), with the error; else the error's last line."""
    found = _TRACEBACK_LINE.findall(detail)
    lines = code.splitlines()
    if found and _last_line(detail).startswith("AssertionError") and int(found[-1]) <= len(lines):
        source = lines[int(found[-1]) - 1].strip()
        if source.startswith("assert "):
            return f"{_shorten(source)} ({_last_line(detail)})"
    return _last_line(detail)


def _last_line(text: str) -> str:
    return _shorten(next((line.strip() for line in reversed(text.splitlines()) if line.strip()), ""))


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."
