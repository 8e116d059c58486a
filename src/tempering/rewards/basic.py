"""Outcome and format rewards for tasks whose completions end in an ``answer: X`` line."""

from __future__ import annotations

import re
from typing import Optional

from tempering.rewards.base import register_reward
from tempering.types import Problem

# [^\S\n] is whitespace other than a newline: an answer is read from its own line, never the next.
ANSWER_LINE = re.compile(r"^[^\S\n]*answer:[^\S\n]*(.*?)[^\S\n]*$", re.IGNORECASE | re.MULTILINE)


def extract_answer(completion: str) -> Optional[str]:
    """The text of the last ``answer:`` line, or None.

    >>> extract_answer("7+8=15\\n4+3+1=8\\nanswer: 85")
    '85'
    >>> extract_answer("no final line") is None
    True
    """
    found = ANSWER_LINE.findall(completion)
    return found[-1] if found else None


def _normalize(text: str) -> str:
    return text.strip().rstrip(".").replace(",", "").lower()


@register_reward("exact_match")
def exact_match(problem: Problem, completion: str) -> float:
    """1 when the final answer equals the reference after trimming, else 0.

    >>> p = Problem(task="t", id="0", prompt="", answer="1,024")
    >>> exact_match(p, "answer: 1024."), exact_match(p, "answer: 1025"), exact_match(p, "1024")
    (1.0, 0.0, 0.0)
    """
    answer = extract_answer(completion)
    return float(answer is not None and _normalize(answer) == _normalize(problem.answer))


@register_reward("format")
def answer_format(problem: Problem, completion: str) -> float:
    """1 when the completion ends with exactly one non-empty ``answer:`` line, else 0.

    >>> p = Problem(task="t", id="0", prompt="", answer="3")
    >>> answer_format(p, "1+2=3\\nanswer: 3"), answer_format(p, "answer: 3\\nanswer: 4")
    (1.0, 0.0)
    >>> answer_format(p, "answer: 3\\nmore text"), answer_format(p, "answer:")
    (0.0, 0.0)
    """
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    answers = ANSWER_LINE.findall(completion)
    return float(
        len(answers) == 1 and bool(answers[0]) and bool(lines) and ANSWER_LINE.match(lines[-1]) is not None
    )
