"""Process rewards: score how a completion reasons, not only what it answers.

- ``steps``: every ``expression = value`` line is checked exactly (by :mod:`.arith`, never
  ``eval``), and the final answer must follow from the steps.
- ``exact_steps``: the outcome (``exact_match``) as the score, and as a component whether the
  whole solution is sound (``steps_right``): a held-out metric that tells a right answer
  reached by right steps from one reached by luck.
- ``repetition``: repeated word n-grams and repeated lines or sentences.
- ``length``: DAPO's soft overlong penalty, and optional shaping towards a target length.

Not done here: algebra with variables, natural-language steps, learned process reward models.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal, Optional

from tempering.algorithms.dapo import overlong_penalty
from tempering.rewards.arith import try_evaluate
from tempering.rewards.base import RewardResult, register_reward
from tempering.rewards.basic import ANSWER_LINE, exact_match, final_answer, parse_number
from tempering.types import Problem, Rollout

_BARE_NUMBER = re.compile(r"\s*-?\d+(\.\d+)?\s*")


def check_steps(completion: str) -> tuple[list[bool], list[Optional[Fraction]]]:
    """Whether each step line holds, and the value each one claims to arrive at.

    A step is a line with ``=``; every side must evaluate, and all sides must be equal
    (chains ``a = b = c`` are allowed). A line with ``=`` that does not parse counts as a
    wrong step with no value, so writing steps in an uncheckable form earns nothing.
    Restatements with a bare number on the left (``15 = 15``) are not steps. The answer
    line is not a step.

    >>> check_steps("7+8=15\\n4+3=8\\nanswer: 85")
    ([True, False], [Fraction(15, 1), Fraction(8, 1)])
    >>> check_steps("seven = 7\\n15 = 15")
    ([False], [None])
    """
    verdicts, values = [], []
    for line in completion.splitlines():
        if "=" not in line or ANSWER_LINE.match(line):
            continue
        sides = line.split("=")
        if _BARE_NUMBER.fullmatch(sides[0]) and len(sides) == 2:
            continue
        results = [try_evaluate(side) for side in sides]
        parsed = all(r is not None for r in results)
        verdicts.append(parsed and all(r == results[0] for r in results))
        values.append(results[-1] if parsed else None)
    return verdicts, values


def column_total(values: list[Optional[Fraction]]) -> Optional[Fraction]:
    """The number written from column results, least significant first: the last digit of
    each column, the top column in full (how column arithmetic assembles its answer).

    >>> column_total([Fraction(15), Fraction(8)]), column_total([Fraction(42), Fraction(28)])
    (Fraction(85, 1), Fraction(282, 1))
    """
    if not values or any(v is None or v.denominator != 1 or v < 0 for v in values):
        return None
    *low, top = (int(v) for v in values)
    return Fraction(int(str(top) + "".join(str(v % 10) for v in reversed(low))))


@register_reward("steps")
def steps(problem: Problem, completion: str, *,
          combine: Literal["last", "columns", "either"] = "either") -> RewardResult:
    """Half the fraction of correct steps, plus half when the final answer follows from them.

    "Follows" means the answer equals the value the last step claims (``combine="last"``),
    the column assembly of the claimed values (``"columns"``, for column arithmetic), or
    either; a step that does not parse claims nothing.
    No steps scores 0. The answer is not compared with the reference: pair this with an
    outcome reward.

    >>> p = Problem(task="add", id="47+38", prompt="47+38\\n", answer="85")
    >>> steps(p, "7+8=15\\n4+3+1=8\\nanswer: 85").score
    1.0
    >>> steps(p, "7+8=15\\n4+3+1=9\\nanswer: 85").score  # a wrong step, then a jump to 85
    0.25
    >>> steps(p, "answer: 85").score, steps(p, "7+8=15\\n4+3+1=8\\nanswer: 95").score
    (0.0, 0.5)
    """
    verdicts, values = check_steps(completion)
    if not verdicts:
        return RewardResult(0.0, {"correct": 0.0, "leads": 0.0}, {"steps": 0})
    correct = sum(verdicts) / len(verdicts)
    answer = final_answer(completion)
    claimed = parse_number(answer) if answer is not None else None
    candidates = []
    if combine in ("last", "either"):
        candidates.append(values[-1])
    if combine in ("columns", "either"):
        candidates.append(column_total(values))
    leads = float(claimed is not None and claimed in candidates)  # None candidates never equal a number
    return RewardResult(0.5 * correct + 0.5 * leads, {"correct": correct, "leads": leads},
                        {"steps": len(verdicts), "wrong_steps": verdicts.count(False)})


@register_reward("exact_steps")
def exact_steps(problem: Problem, completion: str) -> RewardResult:
    """``exact_match``'s score; the component ``steps_right`` is 1 when, beyond that, the
    solution has steps, every one holds, and the answer follows from them (``steps`` scores 1).

    As a task's ``metric`` it makes held-out evaluation report the share of fully correct
    solutions (``eval/<task>/steps_right``) beside accuracy, which outcome-only training
    cannot tell apart from answers reached through a wrong step.

    >>> p = Problem(task="add", id="47+38", prompt="47+38\\n", answer="85")
    >>> [exact_steps(p, c).components["steps_right"] for c in ("7+8=15\\n4+3+1=8\\nanswer: 85",
    ...                                                       "7+8=15\\n4+3=8\\nanswer: 85", "answer: 85")]
    [1.0, 0.0, 0.0]
    """
    right = exact_match(problem, completion)
    sound = right == 1.0 and steps(problem, completion).score == 1.0
    return RewardResult(right, {"steps_right": float(sound)})


exact_steps.summary = ("steps_right",)
"""The component a held-out evaluation reports as a mean (``tempering.eval.greedy``)."""


def _repeated_share(items: list) -> float:
    """Share of items that already occurred earlier in the list."""
    seen: set = set()
    repeats = 0
    for item in items:
        repeats += item in seen
        seen.add(item)
    return repeats / len(items) if items else 0.0


@register_reward("repetition")
def repetition(problem: Problem, completion: str, *, ngram: int = 3, min_line_chars: int = 12) -> RewardResult:
    """1 minus the worse of two repetition rates: repeated word ``ngram``-grams, and lines or
    sentences of at least ``min_line_chars`` characters that restate an earlier one.

    Short lines are exempt because short checkable steps legitimately repeat (``1+1=2``
    twice in ``11+11``). Empty text scores 1: there is nothing repeated.

    >>> p = Problem(task="t", id="0", prompt="", answer="")
    >>> repetition(p, "add the units first, then the tens, and finally carry").score
    1.0
    >>> round(repetition(p, "so the answer is 4\\nso the answer is 4\\nso the answer is 4").score, 3)
    0.333
    """
    words = completion.lower().split()
    grams = [tuple(words[i:i + ngram]) for i in range(len(words) - ngram + 1)]
    pieces = [" ".join(p.lower().split()) for p in re.split(r"[\n]|(?<=[.!?])\s", completion)]
    lines = [p for p in pieces if len(p) >= min_line_chars]
    gram_share, line_share = _repeated_share(grams), _repeated_share(lines)
    return RewardResult(1.0 - max(gram_share, line_share), {"ngram": gram_share, "lines": line_share})


@register_reward("length", needs_rollout=True)
def length(problem: Problem, rollout: Rollout, *, max_tokens: int, buffer_tokens: int = 0,
           target_tokens: int = 0) -> RewardResult:
    """A length penalty in [-2, 0]: DAPO's soft overlong term plus optional target shaping.

    Overlong: DAPO's soft penalty, :func:`tempering.algorithms.dapo.overlong_penalty` (0 up
    to ``max_tokens - buffer_tokens`` completion tokens, then falling linearly to -1 at
    ``max_tokens``; ``buffer_tokens=0`` turns it off), here as a reward a task can weigh
    (``algorithm.overlong_buffer`` applies it to every task instead). Target:
    ``-|n - target_tokens| / target_tokens``, floored at -1; 0 turns it off.

    >>> from tempering.types import Rollout
    >>> r = lambda n: Rollout(None, [], [0] * n, [0.0] * n, "", "stop", 0)
    >>> [length(None, r(n), max_tokens=20, buffer_tokens=10).score for n in (5, 10, 15, 20)]
    [0.0, 0.0, -0.5, -1.0]
    >>> length(None, r(15), max_tokens=64, target_tokens=10).components
    {'overlong': 0.0, 'target': -0.5}
    """
    n = len(rollout.completion_ids)
    overlong = overlong_penalty(n, max_tokens, buffer_tokens)
    target = -min(1.0, abs(n - target_tokens) / target_tokens) if target_tokens else 0.0
    return RewardResult(overlong + target, {"overlong": overlong, "target": target}, {"tokens": n})
