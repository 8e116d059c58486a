"""Typed requests and results of the sandbox, and their JSON forms.

The JSON shapes are a contract shared by the CLI, the HTTP service and the client:
``RunResult.to_dict`` is what ``temper sandbox run --json`` prints, ``TestSpec.from_dict``
reads what ``temper sandbox test`` reads and ``TestResult.to_dict`` is what it prints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Union

RUN_STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit",
                "compile_error", "sandbox_error")
CASE_STATUSES = ("passed", "wrong_answer", "runtime_error", "timeout", "memory_limit",
                 "output_limit", "compile_error", "sandbox_error")
COMPARE_MODES = ("json", "eq", "approx", "truthy", "falsy", "root")
MAX_NESTING = 100  # list/object levels in a case's arguments or expected value
MAX_COEFFICIENTS = 1000  # of a ``root`` case's polynomial: bounds the parent's work per case
TAMPERING = ("result_channel", "early_exit")
"""What the parent can see a program do to its harness (``TestResult.tampering``):
``result_channel``: lines on the result channel that the sandbox's runner did not send in
that order (fake reports, a ``done`` message in a call or stdio run; programs started by
``execve`` do not have the channel open); ``early_exit``: the program ended its process with status 0 before its
checks had all run (cases of a call run left unreported, a program check that never
reached its end)."""


class SpecError(ValueError):
    """A request or spec that cannot be run as given; the message names the field."""


class SandboxUnavailable(RuntimeError):
    """No isolation mechanism is usable here and an unisolated run was not asked for."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. Memory is the address-space cap of each process of the run."""

    timeout_s: float = 5.0  # wall clock per run (per case for call tests); CPU gets as much
    memory_mb: int = 512  # address space per process, MiB
    output_bytes: int = 1 << 20  # stdout + stderr together, before the run is stopped
    processes: int = 32  # processes and threads of the slot's uid, the program included
    open_files: int = 256
    file_size_mb: int = 32  # largest file the program may write

    def __post_init__(self):
        if not (_is_number(self.timeout_s) and 0 < self.timeout_s <= 600):
            raise SpecError(f"timeout_s must be a number of seconds in (0, 600], got {self.timeout_s!r}")
        if not (type(self.memory_mb) is int and 16 <= self.memory_mb <= 65536):
            raise SpecError(f"memory_mb must be an integer in [16, 65536], got {self.memory_mb!r}")
        for name in ("output_bytes", "processes", "open_files", "file_size_mb"):
            if not (type(getattr(self, name)) is int and getattr(self, name) > 0):
                raise SpecError(f"{name} must be a positive integer, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class RunRequest:
    """One program run: source code, language, standard input and limits."""

    code: str
    language: str = "python"
    stdin: str = ""
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self):
        check_text("code", self.code)
        check_text("stdin", self.stdin)


def check_text(name: str, value: Any) -> None:
    """A SpecError naming ``name`` unless ``value`` is text a program can be given: a string
    that encodes to UTF-8 (a lone surrogate such as ``"\\ud800"``, which JSON can carry, does
    not).

    >>> check_text("stdin", "\\ud800")
    Traceback (most recent call last):
    ...
    tempering.sandbox.spec.SpecError: stdin must be UTF-8 text: it holds a lone surrogate '\\ud800' at character 0
    """
    if not isinstance(value, str):
        raise SpecError(f"{name} must be a string, got {type(value).__name__} {value!r:.40}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise SpecError(f"{name} must be UTF-8 text: it holds a lone surrogate "
                        f"{value[err.start:err.end]!r} at character {err.start}") from None


@dataclass(frozen=True)
class RunResult:
    """What happened to one run, as the parent observed it."""

    status: str
    exit_code: Union[int, None]
    signal: Union[str, None]
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunResult":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class StdioCase:
    stdin: str
    stdout: str

    def __post_init__(self):
        check_text("stdin", self.stdin)
        check_text("stdout", self.stdout)


@dataclass(frozen=True)
class CallCase:
    """Arguments for the entry point and the value it must return.

    ``compare``: ``json`` (equal as JSON data: tuples read as lists, ``true`` is not ``1``),
    ``eq`` (Python ``==`` on plain data), ``approx`` (numbers within ``tolerance``),
    ``truthy`` / ``falsy`` (``expected`` unused), ``root`` (a number ``x`` where the
    polynomial whose coefficients ``expected`` lists, constant first, is within
    ``tolerance`` of 0: for problems with many right answers, judged by a property).
    """

    args: list
    expected: Any = None
    compare: str = "json"
    tolerance: float = 1e-6


@dataclass(frozen=True)
class Tests:
    """``kind`` is ``stdio`` (cases: StdioCase), ``call`` (entry_point + CallCase) or
    ``program`` (no cases: the code must run to its end, a weaker, in-sandbox verdict)."""

    __test__ = False  # not a pytest test class

    kind: str
    cases: tuple = ()
    entry_point: str = ""


@dataclass(frozen=True)
class TestSpec:
    __test__ = False  # not a pytest test class

    language: str
    code: str
    tests: Tests
    timeout_s: float = 5.0
    memory_mb: int = 512

    @property
    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, memory_mb=self.memory_mb)

    @classmethod
    def from_dict(cls, data: dict) -> "TestSpec":
        if not isinstance(data, dict):
            raise SpecError("a test spec must be a JSON object")
        for key in ("code", "tests"):
            if key not in data:
                raise SpecError(f"test spec is missing {key!r}")
        check_text("code", data["code"])
        if not isinstance(data.get("language", "python"), str):
            raise SpecError("'language' must be a string such as 'python'")
        spec = cls(language=data.get("language", "python"), code=data["code"],
                   tests=_tests_from_dict(data["tests"]),
                   timeout_s=data.get("timeout_s", 5.0), memory_mb=data.get("memory_mb", 512))
        Limits(timeout_s=spec.timeout_s, memory_mb=spec.memory_mb)  # raises SpecError naming the field
        return spec

    def to_dict(self) -> dict:
        tests = {"kind": self.tests.kind,
                 "cases": [dataclasses.asdict(case) for case in self.tests.cases]}
        if self.tests.kind == "call":
            tests["entry_point"] = self.tests.entry_point
        return {"language": self.language, "code": self.code, "timeout_s": self.timeout_s,
                "memory_mb": self.memory_mb, "tests": tests}


def _tests_from_dict(tests: Any) -> Tests:
    if not isinstance(tests, dict) or tests.get("kind") not in ("stdio", "call", "program"):
        raise SpecError("'tests.kind' must be 'stdio', 'call' or 'program'")
    kind, cases = tests["kind"], tests.get("cases", [])
    if not isinstance(cases, list):
        raise SpecError("'tests.cases' must be a list")
    if kind == "stdio":
        return Tests(kind, tuple(_stdio_case(i, c) for i, c in enumerate(cases)))
    if kind == "call":
        entry = tests.get("entry_point")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise SpecError("'tests.entry_point' must name a function")
        return Tests(kind, tuple(_call_case(i, c) for i, c in enumerate(cases)), entry)
    return Tests(kind)


def _stdio_case(index: int, case: Any) -> StdioCase:
    if not isinstance(case, dict) or not isinstance(case.get("stdout"), str):
        raise SpecError(f"tests.cases[{index}] needs a string 'stdout'")
    check_text(f"tests.cases[{index}].stdin", case.get("stdin", ""))
    check_text(f"tests.cases[{index}].stdout", case["stdout"])
    return StdioCase(case.get("stdin", ""), case["stdout"])


def _call_case(index: int, case: Any) -> CallCase:
    if not isinstance(case, dict) or not isinstance(case.get("args"), list):
        raise SpecError(f"tests.cases[{index}] needs a list 'args'")
    compare = case.get("compare", "json")
    if compare not in COMPARE_MODES:
        raise SpecError(f"tests.cases[{index}].compare must be one of {', '.join(COMPARE_MODES)}")
    if "expected" not in case and compare not in ("truthy", "falsy"):
        raise SpecError(f"tests.cases[{index}] needs 'expected'")
    tolerance = case.get("tolerance", 1e-6)
    if not (_is_number(tolerance) and 0 <= tolerance < math.inf):
        raise SpecError(f"tests.cases[{index}].tolerance must be a non-negative number, got {tolerance!r}")
    if compare == "approx" and not _is_number(case["expected"]):
        raise SpecError(f"tests.cases[{index}].expected must be a number to compare 'approx'")
    if compare == "root" and not _is_polynomial(case["expected"]):
        raise SpecError(f"tests.cases[{index}].expected must be a list of 1 to {MAX_COEFFICIENTS} numbers "
                        "(the polynomial's coefficients, constant first) to compare 'root'")
    for name in ("args", "expected"):
        if _nesting(case.get(name)) > MAX_NESTING:
            raise SpecError(f"tests.cases[{index}].{name} is nested deeper than {MAX_NESTING} levels")
    return CallCase(case["args"], case.get("expected"), compare, float(tolerance))


def _is_polynomial(value: Any) -> bool:
    return (isinstance(value, list) and 0 < len(value) <= MAX_COEFFICIENTS
            and all(_is_number(c) for c in value))


def _nesting(value: Any) -> int:
    """How many list/object levels a JSON value has, counted without recursion.

    >>> _nesting(1), _nesting([[], {"a": [2]}])
    (0, 3)
    """
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


@dataclass(frozen=True)
class CaseResult:
    status: str
    wall_s: float
    detail: str = ""  # why it failed, for people; not part of the JSON contract

    def to_dict(self) -> dict:
        return {"status": self.status, "wall_s": self.wall_s}


@dataclass(frozen=True)
class TestResult:
    """``status`` is ``error`` when any case hit a sandbox fault: leave it out of rewards.

    ``verdict`` is ``parent`` when the trusted parent compared every output, ``program``
    when only the program's own run-to-the-end signal was available (weaker: code in the
    sandbox could forge it). ``tampering`` lists the kinds of :data:`TAMPERING` the parent
    saw in the runs: facts about what the program did, for monitors; they never make a
    case pass, and a program that hides its tampering (a report in the runner's exact form
    and order) is judged on its values all the same.
    """

    __test__ = False  # not a pytest test class

    status: str
    passed: int
    total: int
    cases: tuple
    verdict: str = "parent"
    tampering: tuple = ()

    def to_dict(self) -> dict:
        return {"status": self.status, "passed": self.passed, "total": self.total,
                "cases": [case.to_dict() for case in self.cases], "tampering": list(self.tampering)}

    @classmethod
    def from_dict(cls, data: dict) -> "TestResult":
        cases = tuple(CaseResult(c["status"], c["wall_s"]) for c in data["cases"])
        tampering = tuple(kind for kind in data.get("tampering", ()) if kind in TAMPERING)
        return cls(data["status"], data["passed"], data["total"], cases,
                   data.get("verdict", "parent"), tampering)

    @classmethod
    def from_cases(cls, cases, verdict: str = "parent", tampering=()) -> "TestResult":
        cases = tuple(cases)
        passed = sum(case.status == "passed" for case in cases)
        if any(case.status == "sandbox_error" for case in cases):
            status = "error"
        else:
            status = "passed" if cases and passed == len(cases) else "failed"
        return cls(status, passed, len(cases), cases, verdict,
                   tuple(kind for kind in TAMPERING if kind in tampering))


def values_match(case: CallCase, actual: Any) -> bool:
    """Compare a decoded return value (plain data, parent-side) with the case's expectation."""
    mode = case.compare
    if mode == "truthy":
        return bool(actual)
    if mode == "falsy":
        return not actual
    if mode == "approx":
        return (_is_number(actual) and _is_number(case.expected)
                and abs(actual - case.expected) <= case.tolerance)
    if mode == "eq":
        return actual == case.expected
    if mode == "root":
        return _is_number(actual) and abs(_polynomial(case.expected, actual)) <= case.tolerance
    return _json_equal(case.expected, actual)


def _polynomial(coefficients: list, x) -> float:
    """The polynomial's value at ``x``, as ``sum(c * math.pow(x, i))`` (HumanEval's ``poly``);
    inf when it overflows, so that no tolerance accepts it.

    >>> _polynomial([1, 2], -0.5), _polynomial([0, 0, 1], 1e200)
    (0.0, inf)
    """
    try:
        value = sum(c * math.pow(x, i) for i, c in enumerate(coefficients))
    except (OverflowError, ValueError):
        return math.inf
    return math.inf if math.isnan(value) else value


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and not (type(value) is float and math.isnan(value))


def _json_equal(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, list) and isinstance(actual, (list, tuple)):
        return len(expected) == len(actual) and all(
            _json_equal(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _json_equal(expected[k], actual[k]) for k in expected)
    if _is_number(expected) and _is_number(actual):
        return expected == actual
    return type(expected) is type(actual) and expected == actual


class SandboxAPI:
    """The interface shared by the local Executor and the HTTP SandboxClient.

    Subclasses provide ``run``, ``test``, ``run_many``, ``test_many`` and a thread pool in
    ``_threads``; the async methods here run the blocking calls on that pool, so that an
    event loop can keep every sandbox slot busy without blocking.
    """

    _threads = None

    async def arun(self, request: RunRequest) -> RunResult:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self.run, request)

    async def atest(self, spec: TestSpec) -> TestResult:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self.test, spec)

    async def arun_many(self, requests) -> list:
        return await asyncio.gather(*(self.arun(request) for request in requests))

    async def atest_many(self, specs) -> list:
        return await asyncio.get_running_loop().run_in_executor(self._threads, self.test_many, list(specs))
