"""The ``math`` outcome reward: extract the final answer, decide equivalence with math-verify.

math-verify parses LaTeX and plain expressions into sympy and compares them (fractions,
decimals, sets, intervals, equations, percent, ``\\text{}`` units). Its own timeouts use
SIGALRM, which works only on a process's main thread, and reward code runs in worker
threads; so its timeouts are turned off and each comparison runs in a separate checker
process that is killed when it overruns ``timeout_s``. Plain numbers on both sides (no
percent sign) are compared in-process, without the checker, where that settles it: equal
values, or unequal integers.

The checker imports math-verify and compares once before it says it is ready, and a case's
clock starts only then: its start-up (seconds on a busy machine) never counts against a
case. A case that overruns, or whose checker dies, is tried again on a fresh checker; if
that fails too the result is a grader failure (``error``), which the loop drops and counts
instead of scoring a possibly right answer 0. A hostile completion (a power tower such as
``9^{9^{9}}``) therefore earns neither credit nor penalty, and costs two timeouts.

Not done here: answers that need the problem text to interpret (e.g. "the second option");
a memory limit on the checker.
"""

from __future__ import annotations

import atexit
import importlib.util
import multiprocessing
import re
import threading

from tempering.rewards.base import RewardResult, register_reward
from tempering.rewards.basic import final_answer, parse_number
from tempering.types import Problem

STARTUP_S = 300.0
"""How long a checker may take to import math-verify and say it is ready."""


def _as_latex(text: str) -> str:
    """Math mode for math-verify's LaTeX reader, unless the text already has its own ``$``."""
    text = text.strip()
    return text if re.search(r"(?<!\\)\$", text) else f"${text}$"


def _verify_in_worker(gold: str, answer: str) -> bool:
    """Runs in the checker: parse both sides and compare, with math-verify's alarms off."""
    from math_verify import parse, verify

    gold_parsed = parse(_as_latex(gold), parsing_timeout=None)
    answer_parsed = parse(_as_latex(answer), parsing_timeout=None)
    return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None))


def _serve(conn) -> None:
    """The checker's loop: warm up, say ready, then answer ``(gold, answer)`` pairs until the
    parent closes the pipe. Each reply is ``(verdict, None)`` or ``(None, exception text)``."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that timeouts are off
    # Imports and first-use set-up, before any case's clock: a number and, since sympy's first
    # symbolic comparison alone takes 0.3-0.45 s (a third of a 1 s case on a busy machine), an
    # expression in a variable.
    _verify_in_worker(r"\frac{1}{2}", "0.5")
    _verify_in_worker("x^2-1", "(x-1)(x+1)")
    conn.send("ready")
    while True:
        try:
            gold, answer = conn.recv()
        except EOFError:
            return
        try:
            conn.send((_verify_in_worker(gold, answer), None))
        except Exception as exc:  # noqa: BLE001  (reported to the parent as the checker's failure)
            conn.send((None, f"{type(exc).__name__}: {exc}"))


class CheckerFailed(RuntimeError):
    """No verdict: ``reason`` is ``timeout`` (the case or the start-up overran), ``died`` (the
    checker exited) or ``exception`` (math-verify raised)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"math checker {reason}{': ' + detail if detail else ''}")
        self.reason = reason


class Verifier:
    """One checker process, started on first use and replaced after any failure; see the
    module docstring. ``retries``: extra attempts, each on a fresh checker."""

    def __init__(self, retries: int = 1, startup_s: float = STARTUP_S):
        self.retries, self.startup_s = retries, startup_s
        self._process = self._conn = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    @property
    def pid(self) -> int | None:
        """The checker's process id, or None when none runs."""
        return None if self._process is None else self._process.pid

    def _receive(self, limit_s: float):
        if not self._conn.poll(limit_s):
            raise CheckerFailed("timeout")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise CheckerFailed("died") from None

    def _start(self) -> None:
        if importlib.util.find_spec("math_verify") is None:  # a clear message, in the caller
            raise RuntimeError("the math reward needs math-verify: pip install 'math-verify>=0.9,<1'")
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), name="math-verify", daemon=True)
        self._process.start()
        child.close()  # so the pipe reads as closed once the checker exits
        self._receive(self.startup_s)

    def _compare(self, gold: str, answer: str, timeout_s: float) -> bool:
        if self._process is None:
            self._start()
        self._conn.send((gold, answer))
        verdict, error = self._receive(timeout_s)
        if error is not None:
            raise CheckerFailed("exception", error)
        return verdict

    def equivalent(self, gold: str, answer: str, timeout_s: float) -> bool:
        """Whether math-verify finds the two equivalent; CheckerFailed when no attempt could tell."""
        with self._lock:
            for attempt in range(self.retries + 1):
                try:
                    return self._compare(gold, answer, timeout_s)
                except CheckerFailed:
                    self.close()
                    if attempt == self.retries:
                        raise

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._conn.close()
            self._process = self._conn = None


VERIFIER = Verifier()


@register_reward("math")
def math_answer(problem: Problem, completion: str, *, timeout_s: float = 5.0,
                last_number: bool = True) -> RewardResult:
    """1 when the final answer is mathematically equivalent to the reference, else 0.

    The answer is read from an ``answer:`` line, else ``\\boxed{}``, else (``last_number``)
    the last number in the text. When the checker gives no verdict (``timeout_s`` overrun
    twice, a crash) the result is a grader failure: ``error`` is ``checker_<reason>`` and
    ``diagnostics`` has ``<reason>: 1``.

    >>> p = Problem(task="t", id="0", prompt="", answer="1,024")
    >>> math_answer(p, "so the total is 1024.").score, math_answer(p, "answer: 1023").score
    (1.0, 0.0)
    """
    answer = final_answer(completion, fallback_last_number=last_number)
    if answer is None:
        return RewardResult(0.0, diagnostics={"extracted": None})
    got, want = parse_number(answer), parse_number(problem.answer)
    if got is not None and want is not None and "%" not in answer + problem.answer:
        if got == want:
            return RewardResult(1.0, diagnostics={"extracted": answer})
        if got.denominator == want.denominator == 1:  # unequal integers: no rounding can join them
            return RewardResult(0.0, diagnostics={"extracted": answer})
    try:
        verdict = VERIFIER.equivalent(problem.answer, answer, timeout_s)
    except CheckerFailed as failure:
        return RewardResult(0.0, diagnostics={"extracted": answer, failure.reason: 1},
                            error=f"checker_{failure.reason}")
    return RewardResult(float(verdict), diagnostics={"extracted": answer})
