"""The ``code`` outcome reward: run the completion's program against unit tests in the sandbox.

A problem carries its tests in ``problem.meta["tests"]``: a :class:`~tempering.sandbox.Tests`
or its JSON form (``{"kind": "stdio", "cases": [{"stdin": "1 2\\n", "stdout": "3\\n"}]}`` or
``{"kind": "call", "entry_point": "add", "cases": [{"args": [1, 2], "expected": 3}]}``),
and optionally ``meta["code_prefix"]`` (e.g. a HumanEval prompt the completion continues),
``meta["language"]``, ``meta["code_fenced"] = False`` when the whole completion is the
program (no fenced block expected), and ``meta["credit"]`` to override the reward's ``credit``
for that problem (a task's ``partial`` option). Verdicts come from the sandbox's trusted parent, never from the
program; see :mod:`tempering.sandbox` for the threat model.

The program is the completion's last fenced block (:func:`extract_code`); a reward built with
``unfenced=True`` also runs the code of an answer that forgot its fence (a chat model's
``def`` written as plain text, or closed by a fence it never opened), so a model that knows the
function is not paid nothing for its markup; the ``code_format`` reward then pays for the
fence itself, separately.

A ``program`` verdict (a user's ``{"kind": "program"}`` tests, which the parent cannot
split into calls) comes from inside the sandbox and can be forged: such results carry the
component ``forgeable = 1`` (so a run logs the share of them), and ``forgeable_credit``
scales their score: 0 by default (they earn nothing), and a reward built with more says so
in a warning at start-up. Every built-in task's tests are judged by the parent.

What the sandbox's parent saw the program do to its harness (``TestResult.tampering``: fake
messages on the result channel, an exit before the checks ran) becomes the components
``tampered/<kind>`` (1 when seen), which the ``harness`` monitor flags, whatever the
program's source looks like.

A sandbox fault (``TestResult.status == "error"``) says nothing about the program: it is
retried, and if it persists the rollout's result carries ``error="sandbox_error"`` so the
loop drops it from the batch and counts it, instead of scoring a right answer as wrong. A
sandbox service (``url``) that cannot be reached or answers with an error is such a fault
too, its error naming why. The first reward built for a ``url`` in a process (a run's or an
evaluation's, before any model work) asks the service for ``/health`` and is refused with a
``ValueError`` naming the URL when nothing answers; rewards built later for the same URL
(a run's evaluations) do not ask again, so a service that goes away mid-run costs grader
errors there, not the run. The check also sends a request that needs the token and runs
nothing, so a wrong or missing token is that ``ValueError``, naming the token, at start-up
rather than a grader outage after the first round's retries.

``isolation: none`` (a local pool only) runs the model's programs unisolated, with the
caller's rights: the reward warns so when it is built.

Not done here: compiling once per problem, partial credit by test weight.
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
import warnings
from typing import Literal, Optional, Sequence

from tempering.rewards.base import RewardResult, register_reward
from tempering.sandbox.client import SandboxClient, SandboxHTTPError
from tempering.sandbox.executor import ISOLATION_MODES, MAX_READY, MAX_WORKERS
from tempering.sandbox.languages import LANGUAGES, get_language, is_known
from tempering.sandbox.spec import TAMPERING, Limits, Tests, TestSpec
from tempering.types import Problem, Rollout

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)
_ALIASES = {"py": "python", "python3": "python", "c++": "cpp", "js": "javascript", "sh": "bash"}
HEALTH_TIMEOUT_S = 10.0
"""How long the start-up check waits for a sandbox service's ``/health``."""
_ANSWERED: set[str] = set()
"""Sandbox URLs whose service answered the start-up check in this process."""


def extract_code(completion: str, language: str = "python", entry_point: str = "") -> Optional[str]:
    """The last fenced block in ``language`` (or untagged), else the last fenced block of any
    tag, else None. An unclosed final fence (a completion cut off mid-block) counts. Given an
    ``entry_point``, the last of those blocks that defines it comes first, so that a usage
    example fenced after the function is not taken for the program.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nand\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_code("```cpp\\nint main(){}\\n```\\n```py\\nx = 1\\n```")
    'x = 1\\n'
    >>> extract_code("no code here") is None, extract_code("```python\\nprint(3)\\n")
    (True, 'print(3)\\n')
    >>> extract_code("```python\\ndef f(): return 1\\n```\\nUse it:\\n```python\\nprint(f())\\n```", entry_point="f")
    'def f(): return 1\\n'
    """
    text = completion if completion.count("```") % 2 == 0 else completion + "```"
    blocks = [(_ALIASES.get(tag.lower(), tag.lower()), body) for tag, body in _FENCE.findall(text)]
    ours = [body for tag, body in blocks if tag in (language, "")] or [body for _, body in blocks]
    if entry_point and (defining := [body for body in ours if defines(body, entry_point)]):
        return defining[-1]
    return ours[-1] if ours else None


_TOP_LEVEL = re.compile(r"(?:async\s+def|def|class|import|from)\s|@\w")
"""A line that starts a top-level Python statement an answer's program may begin with."""


def unfenced_code(completion: str) -> Optional[str]:
    """The Python program in an answer written without fences: from the first line that starts
    a top-level ``def``, ``class``, ``import``, ``from`` or decorator, through the lines that
    continue it (indented, blank, or another such statement), up to the first other line (prose
    or a stray fence); None when no line starts one.

    >>> unfenced_code("Sure:\\ndef f(x):\\n    return x\\n\\nThis returns x.")
    'def f(x):\\n    return x\\n'
    >>> unfenced_code("import math\\ndef g():\\n    return math.pi\\n```\\nDone")
    'import math\\ndef g():\\n    return math.pi\\n'
    >>> unfenced_code("The answer is 4.") is None
    True
    """
    lines = completion.splitlines()
    start = next((i for i, line in enumerate(lines) if _TOP_LEVEL.match(line)), None)
    if start is None:
        return None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace() or _TOP_LEVEL.match(lines[end])):
        end += 1
    return "\n".join(lines[start:end]).rstrip() + "\n"


def defines(code: str, entry_point: str) -> bool:
    """Whether ``code`` has a top-level ``def entry_point(`` line (``async def`` too).

    >>> defines("import os\\ndef add(a, b):\\n    return a + b\\n", "add"), defines("def adder(a): ...", "add")
    (True, False)
    """
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


@register_reward("code_format")
def code_format(problem: Problem, completion: str, *, language: str = "python") -> float:
    """1 when the completion holds a fenced block in ``language`` (or untagged) and, for call
    tests, that block defines the entry point; else 0. Nothing is run: this pays for the
    answer's shape, which the ``code`` reward (with ``unfenced``) does not insist on.

    >>> p = Problem(task="t", id="0", prompt="", answer="", meta={"tests": {"kind": "call", "entry_point": "add",
    ...     "cases": [{"args": [1, 2], "expected": 3}]}})
    >>> code_format(p, "```python\\ndef add(a, b):\\n    return a + b\\n```"), code_format(p, "def add(a, b): ...")
    (1.0, 0.0)
    >>> code_format(p, "```python\\ndef plus(a, b):\\n    return a + b\\n```")
    0.0
    """
    name = entry_point(problem)
    code = extract_code(completion, language, name)
    return float(code is not None and (not name or defines(code, name)))


def check_service(url: str, token: str = "") -> None:
    """A ``ValueError`` naming ``url`` unless a sandbox service answers its ``/health`` there
    (asked once per URL and process, see the module docstring)."""
    if url in _ANSWERED:
        return
    with SandboxClient(url, token or None, timeout_s=HEALTH_TIMEOUT_S) as client:
        try:
            client.health()
        except SandboxHTTPError as exc:
            raise ValueError(f"no sandbox service answers at url {url} ({exc}); start one there "
                             "(temper sandbox serve --port PORT) or set url to one that runs") from None
        try:
            client.authenticate()
        except SandboxHTTPError as exc:
            if exc.status != 401:
                raise ValueError(f"the sandbox service at url {url} refused a request that runs "
                                 f"nothing: {exc}") from None
            given = "a token that is not its own" if token else "no token"
            raise ValueError(f"the sandbox service at url {url} refuses this reward's token: the reward "
                             f"sent {given}; set the code reward's token option "
                             "(rewards.options.code.token) to the --token (or $TEMPER_SANDBOX_TOKEN) "
                             "that service was started with") from None
    _ANSWERED.add(url)


_PARSED: dict[int, tuple[dict, Tests]] = {}
"""Test dicts parsed so far, by identity: ``id(tests) -> (tests, Tests)``."""
_PARSED_MAX = 2048


def _once(memo: dict, source, make):
    """``make(source)``, made once per object in ``memo``. An entry holds its object, so
    that id is not reused while the entry lasts."""
    hit = memo.get(id(source))
    if hit is not None and hit[0] is source:
        return hit[1]
    made = make(source)
    memo[id(source)] = (source, made)
    return made


def _parse(tests: dict) -> Tests:
    """Each test dict parsed once: a step scores every completion of a group against one
    dict, and a dataset's problems come back step after step."""
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.clear()
    return _once(_PARSED, tests, lambda data: TestSpec.from_dict({"code": "", "tests": data}).tests)


def problem_tests(problem: Problem) -> Tests:
    tests = problem.meta.get("tests")
    if isinstance(tests, Tests):
        return tests
    if tests is None:
        raise ValueError(f"problem {problem.key} has no meta['tests'] for the code reward")
    return _parse(tests)


def entry_point(problem: Problem) -> str:
    """The function a problem's call tests call; '' for other tests or none."""
    tests = problem.meta.get("tests")
    return problem_tests(problem).entry_point if tests is not None else ""


def check_sandbox_options(language: str, timeout_s: float, memory_mb: int, workers: int, isolation: str,
                          url: str, retries: int, ready: int) -> None:
    """A ``ValueError`` naming the first option the sandbox would refuse at the first run (or,
    for ``retries``, never send it), so that a config is refused when it is built, before any
    model work. A local pool must run ``language`` here; a service's languages are its own."""
    Limits(timeout_s=timeout_s, memory_mb=memory_mb)  # a SpecError naming the field
    if url:
        if not is_known(language):
            raise ValueError(f"language {language!r} is not supported; known: {', '.join(LANGUAGES)}")
    else:
        get_language(language)
    if not 0 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be between 0 (one per core) and {MAX_WORKERS}, got {workers!r}")
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {isolation!r}")
    if retries < 0:
        raise ValueError(f"retries must be 0 or more (extra rounds after the first), got {retries!r}")
    if not 0 <= ready <= MAX_READY:
        raise ValueError(f"ready must be between 0 and {MAX_READY}, got {ready!r}")


@register_reward("code")
class CodeReward:
    """Score programs by the share of test cases they pass, a batch at a time.

    ``credit``: ``all`` (1 only when every case passes) or ``fraction`` (cases passed /
    cases). ``url``: a ``temper sandbox serve`` address to use instead of a local pool of
    ``workers`` slots (0 = one per core) with ``isolation``, each forking ``ready`` children
    ahead of their runs while idle (see :class:`tempering.sandbox.Executor`). ``retries``: extra rounds for
    rollouts whose run hit a sandbox fault, on top of the executor's own retries.
    ``forgeable_credit``: the factor on the score of a forgeable (``program``) verdict;
    above 0 it pays for what a program can claim about itself, and start-up warns.
    ``unfenced``: a completion without a fenced block is run as :func:`unfenced_code` reads it
    (it scores 0 unrun by default).
    """

    def __init__(self, *, credit: Literal["all", "fraction"] = "all", language: str = "python",
                 timeout_s: float = 5.0, memory_mb: int = 512, workers: int = 0,
                 isolation: str = "auto", url: str = "", token: str = "", retries: int = 1, ready: int = 0,
                 forgeable_credit: float = 0.0, unfenced: bool = False):
        if credit not in ("all", "fraction"):
            raise ValueError(f"credit must be 'all' or 'fraction', got {credit!r}")
        if not 0 <= forgeable_credit <= 1:
            raise ValueError(f"forgeable_credit must be in [0, 1], got {forgeable_credit!r}")
        if forgeable_credit > 0:
            warnings.warn(f"forgeable_credit={forgeable_credit}: 'program' tests are passed on the program's own "
                          "word, which a completion can forge (write the done message, exit 0); such passes earn "
                          "reward. Prefer stdio or call tests, which the parent judges", stacklevel=2)
        check_sandbox_options(language, timeout_s, memory_mb, workers, isolation, url, retries, ready)
        self.credit, self.language, self.retries = credit, language, retries
        self.forgeable_credit, self.unfenced = forgeable_credit, unfenced
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        if isolation == "none" and not url:
            warnings.warn("isolation='none': the code reward runs the model's programs UNISOLATED, as this "
                          "user, with access to its files and network; use it only for trusted code or "
                          "inside a container or VM", stacklevel=2)
        self._connect = (url, token, workers, isolation, ready)
        self._sandbox = None
        self._lock = threading.Lock()
        if url:
            check_service(url, token)

    def sandbox(self):
        """The executor or client, started on first use (so building a config costs nothing)."""
        with self._lock:
            if self._sandbox is None:
                url, token, workers, isolation, ready = self._connect
                if url:
                    self._sandbox = SandboxClient(url, token or None)
                else:
                    from tempering.sandbox import Executor

                    self._sandbox = Executor(workers or None, isolation, ready=ready)
            return self._sandbox

    def code_of(self, problem: Problem, completion: str) -> Optional[str]:
        """The program a completion answers with, None when it holds no code block."""
        if not problem.meta.get("code_fenced", True):
            return completion
        language = problem.meta.get("language", self.language)
        code = extract_code(completion, language, entry_point(problem))
        if code is None and self.unfenced and language == "python":
            return unfenced_code(completion)
        return code

    def spec(self, problem: Problem, code: str) -> TestSpec:
        language = problem.meta.get("language", self.language)
        return TestSpec(language, problem.meta.get("code_prefix", "") + code, problem_tests(problem),
                        self.timeout_s, self.memory_mb)

    def score_batch(self, problems: Sequence[Problem], rollouts: Sequence[Rollout]) -> list[RewardResult]:
        """Each distinct (problem, sandbox job) of the batch runs once, every test in one
        sandbox run, and each rollout that wrote it gets that verdict: a group's samples often
        repeat a program word for word, the more so as the policy sharpens. The job (program,
        tests, limits) is part of the key because two problems with other hidden tests may
        share a problem key."""
        results: list[Optional[RewardResult]] = [None] * len(problems)
        runnable, first_of, copies, reprs = {}, {}, [], {}
        for i, (problem, rollout) in enumerate(zip(problems, rollouts)):
            code = self.code_of(problem, rollout.text)
            if code is None:
                results[i] = RewardResult(0.0, {"pass_fraction": 0.0}, {"no_code": 1})
                continue
            spec = self.spec(problem, code)
            # The tests are part of the key (their cases hold lists: no hash, but a full repr,
            # made once per Tests object in the batch), the program and its limits the rest.
            job = problem.key, _once(reprs, spec.tests, repr), spec.language, spec.code, spec.timeout_s, spec.memory_mb
            if job in first_of:
                copies.append((i, first_of[job]))
            else:
                first_of[job] = i
                runnable[i] = spec
        error = "sandbox_error"
        for _ in range(self.retries + 1):
            if not runnable:
                break
            indices = list(runnable)
            try:
                outcomes = self.sandbox().test_many([runnable[i] for i in indices])
            except SandboxHTTPError as exc:  # the service is down or refused the batch
                error = f"{type(exc).__name__}: {exc}"
                continue
            for i, outcome in zip(indices, outcomes):
                if outcome.status != "error":
                    results[i] = self._result(outcome, problems[i].meta.get("credit", self.credit))
                    del runnable[i]
        for i in runnable:
            results[i] = RewardResult(0.0, {"pass_fraction": 0.0}, {"status": "error"}, error=error)
        for i, original in copies:  # a copy each, so that no later change to one reaches another
            first = results[original]
            results[i] = replace(first, components=dict(first.components), diagnostics=dict(first.diagnostics))
        return results

    def _result(self, outcome, credit: str) -> RewardResult:
        fraction = outcome.passed / outcome.total if outcome.total else float(outcome.status == "passed")
        value = fraction if credit == "fraction" else float(outcome.status == "passed")
        forgeable = outcome.verdict == "program"
        if forgeable:
            value *= self.forgeable_credit
        components = {"pass_fraction": fraction, "forgeable": float(forgeable)}
        components.update({f"tampered/{kind}": float(kind in outcome.tampering) for kind in TAMPERING})
        return RewardResult(value, components, {"status": outcome.status, "verdict": outcome.verdict})

    def close(self) -> None:
        """Stop the pool (or drop the client); a later call starts a new one, a second close
        does nothing."""
        with self._lock:
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None and hasattr(sandbox, "close"):
            sandbox.close()
