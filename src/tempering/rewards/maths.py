"""The ``math`` outcome reward: extract the final answer, decide equivalence with math-verify.

math-verify parses LaTeX and plain expressions into sympy and compares them (fractions,
decimals, sets, intervals, equations, percent, ``\\text{}`` units). Its own timeouts use
SIGALRM, which works only on a process's main thread, and reward code runs in worker
threads; so its timeouts are turned off and each comparison runs in a separate process
(a small spawned pool) that is killed when it overruns ``timeout_s``. Plain numbers on both
sides (no percent sign) are compared in-process, without the pool, where that settles it:
equal values, or unequal integers.

Not done here: answers that need the problem text to interpret (e.g. "the second option").
"""

from __future__ import annotations

import atexit
import multiprocessing
import re
import threading
from typing import Optional

from tempering.rewards.base import RewardResult, register_reward
from tempering.rewards.basic import final_answer, parse_number
from tempering.types import Problem


def _as_latex(text: str) -> str:
    """Math mode for math-verify's LaTeX reader, unless the text already has its own ``$``."""
    text = text.strip()
    return text if re.search(r"(?<!\\)\$", text) else f"${text}$"


def _verify_in_worker(gold: str, answer: str) -> bool:
    """Runs in a pool process: parse both sides and compare, with math-verify's alarms off."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that timeouts are off
    from math_verify import parse, verify

    gold_parsed = parse(_as_latex(gold), parsing_timeout=None)
    answer_parsed = parse(_as_latex(answer), parsing_timeout=None)
    return bool(gold_parsed and answer_parsed and verify(gold_parsed, answer_parsed, timeout_seconds=None))


class Verifier:
    """A lazily started process pool for math-verify, restarted after a timeout."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _get_pool(self):
        if self._pool is None:
            try:
                import math_verify  # noqa: F401  (fail here, in the caller, with a clear message)
            except ImportError:
                raise RuntimeError("the math reward needs math-verify: pip install 'math-verify>=0.9,<1'") from None
            self._pool = multiprocessing.get_context("spawn").Pool(self.workers)
        return self._pool

    def equivalent(self, gold: str, answer: str, timeout_s: float) -> Optional[bool]:
        """True/False, or None when the comparison overran ``timeout_s`` (its worker is killed)."""
        with self._lock:
            pending = self._get_pool().apply_async(_verify_in_worker, (gold, answer))
            try:
                return pending.get(timeout_s)
            except multiprocessing.TimeoutError:
                self.close()
                return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


VERIFIER = Verifier()


@register_reward("math")
def math_answer(problem: Problem, completion: str, *, timeout_s: float = 5.0,
                last_number: bool = True) -> RewardResult:
    """1 when the final answer is mathematically equivalent to the reference, else 0.

    The answer is read from an ``answer:`` line, else ``\\boxed{}``, else (``last_number``)
    the last number in the text. A comparison that overruns ``timeout_s`` scores 0 and says
    so in ``diagnostics["timeout"]``: the hard expression is the completion's doing.

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
    verdict = VERIFIER.equivalent(problem.answer, answer, timeout_s)
    if verdict is None:
        return RewardResult(0.0, diagnostics={"extracted": answer, "timeout": 1})
    return RewardResult(float(verdict), diagnostics={"extracted": answer})
