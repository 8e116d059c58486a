"""The ``math`` reward on a written-down equivalence set, its extraction, and its checker's failures.

Each case is (reference, completion, expected verdict, why). The verdicts are what a
grader of final answers should say; where math-verify is lenient or strict in a way worth
knowing, the reason says so. The comparisons run in the reward's checker process, as in
training.
"""

import os
import signal
import threading
import time

import pytest

from tempering.rewards.maths import VERIFIER, CheckerFailed, Verifier, math_answer
from tempering.types import Problem

CASES = [
    # fractions
    ("1/2", "answer: 0.5", 1.0, "a fraction equals its decimal"),
    ("0.5", r"answer: \frac{1}{2}", 1.0, "LaTeX fraction against a decimal"),
    (r"\frac{1}{2}", r"answer: \frac12", 1.0, "the brace-less \\frac12 shorthand"),
    (r"\dfrac{3}{4}", "answer: 0.75", 1.0, "\\dfrac is \\frac"),
    ("3/2", "answer: 1.5", 1.0, "improper fraction and decimal"),
    ("1/3", "answer: 0.333", 0.0, "a decimal rounded to 3 places is not 1/3"),
    ("1/3", "answer: 0.3333333", 1.0, "math-verify rounds to 6 places: 7 threes pass"),
    # decimals and integers
    ("0.5", "answer: 0.50", 1.0, "trailing zeros"),
    ("2", "answer: 2.0", 1.0, "an integer written as a decimal"),
    ("12", "answer: 12.5", 0.0, "a different number"),
    ("3", "answer: -3", 0.0, "sign matters"),
    # thousands separators
    ("1000", "answer: 1,000", 1.0, "comma thousands separator"),
    ("1000", "answer: 1{,}000", 1.0, "LaTeX {,} separator"),
    ("1000000", "answer: 1,000,000", 1.0, "several separators"),
    ("1000", "answer: 1e3", 0.0, "e-notation is read as 1*e*3 (Euler's e), not 10^3"),
    # intervals
    ("(1,2]", "answer: (1,2]", 1.0, "the same half-open interval"),
    ("(1,2]", "answer: [1,2]", 0.0, "closed at 1 is a different interval"),
    (r"[0,\infty)", r"answer: [0,\infty)", 1.0, "an unbounded interval"),
    (r"(1,2)\cup(3,4)", r"answer: (3,4)\cup(1,2)", 1.0, "a union in either order"),
    # sets and tuples
    (r"\{1,2\}", r"answer: \{2,1\}", 1.0, "sets are unordered"),
    (r"\{1,2\}", r"answer: \{1,3\}", 0.0, "a different set"),
    ("1, 2", "answer: 2, 1", 1.0, "a bare list of answers is read as a set"),
    # expressions
    ("2x+1", "answer: 1+2x", 1.0, "commuted terms"),
    ("x^2-1", "answer: (x-1)(x+1)", 1.0, "factored and expanded forms are equal"),
    (r"\sqrt{2}/2", r"answer: \frac{1}{\sqrt{2}}", 1.0, "rationalised and not"),
    ("2^{10}", "answer: 1024", 1.0, "a power is evaluated"),
    (r"10^{100}", r"answer: 10^{100}+1", 0.0, "huge but different"),
    ("x=5", "answer: 5", 1.0, "the value of a one-variable equation"),
    (r"\pi", "answer: 3.14159", 0.0, "a decimal approximation of pi is not pi"),
    (r"e^{i\pi}", "answer: -1", 0.0, "math-verify does not simplify Euler's identity (a miss, kept visible)"),
    # percent
    ("50", r"answer: 50\%", 1.0, "a percent sign on the same number"),
    ("0.5", r"answer: 50\%", 1.0, "math-verify also reads 50% as 0.5 (lenient either way)"),
    # units
    ("5", r"answer: 5\text{ cm}", 1.0, "a \\text{} unit is dropped"),
    ("10", r"answer: 10 \text{m}", 1.0, "a unit after a space"),
    ("5", r"answer: \$5", 1.0, "a currency sign is dropped"),
    ("5", "answer: 5 dollars", 0.0, "a unit in plain words is read as variables: not equal"),
    ("7", "answer: seven", 0.0, "number words are not read"),
    # where the answer is found
    ("42", r"so the result is \boxed{42}.", 1.0, "a boxed answer"),
    ("42", "we get 40 and then 42", 1.0, "the last number when nothing else marks the answer"),
    ("42", "answer: 41\nno wait, 42", 0.0, "the answer line wins over a later number"),
    ("42", "", 0.0, "nothing to read"),
]


@pytest.mark.parametrize("reference, completion, expected, why", CASES, ids=[c[3] for c in CASES])
def test_math_equivalence(reference, completion, expected, why):
    problem = Problem(task="math", id="0", prompt="", answer=reference)
    assert math_answer(problem, completion).score == expected, why


def test_the_equivalence_set_is_large_enough():
    assert len(CASES) >= 30


HOSTILE = "answer: 9^{9^{9}}"
"""A power tower math-verify evaluates digit by digit: it runs until the checker is killed."""


def test_a_hostile_comparison_is_a_grader_failure_and_later_correct_answers_score_one():
    problem = Problem(task="math", id="0", prompt="", answer="x^2-1")
    hostile = math_answer(problem, HOSTILE, timeout_s=1.0)
    assert hostile.error == "checker_timeout" and hostile.diagnostics["timeout"] == 1
    # the checker restarts; its start-up (seconds) must not count against these 1 s cases
    for _ in range(3):
        result = math_answer(problem, "answer: (x-1)(x+1)", timeout_s=1.0)
        assert (result.score, result.error) == (1.0, None)


def test_start_up_does_not_count_against_the_first_case():
    VERIFIER.close()
    problem = Problem(task="math", id="0", prompt="", answer=r"\frac{1}{2}")
    assert math_answer(problem, "answer: 0.5", timeout_s=0.5).score == 1.0


def test_a_checker_killed_between_cases_is_replaced():
    problem = Problem(task="math", id="0", prompt="", answer="x^2-1")
    assert math_answer(problem, "answer: (x-1)(x+1)").score == 1.0
    os.kill(VERIFIER.pid, signal.SIGKILL)
    result = math_answer(problem, "answer: (x-1)(x+1)", timeout_s=1.0)
    assert (result.score, result.error) == (1.0, None)


def test_a_checker_that_dies_mid_case_is_retried_then_reported_as_a_grader_failure():
    verifier = Verifier(retries=1)
    try:
        killed = []

        def kill_each_worker():
            while len(killed) < 2:
                pid = verifier.pid  # each checker, starting or comparing
                if pid is not None and pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                time.sleep(0.01)

        killer = threading.Thread(target=kill_each_worker)
        killer.start()
        with pytest.raises(CheckerFailed) as failed:
            verifier.equivalent("5", "9^{9^{9}}", timeout_s=600)
        killer.join()
        assert failed.value.reason == "died" and len(killed) == 2
        assert verifier.equivalent("x^2-1", "(x-1)(x+1)", timeout_s=1.0) is True
    finally:
        verifier.close()


def test_plain_numbers_are_compared_without_the_checker():
    VERIFIER.close()
    problem = Problem(task="add", id="0", prompt="", answer="85")
    assert math_answer(problem, "7+8=15\n4+3+1=8\nanswer: 85").score == 1.0
    assert VERIFIER.pid is None
