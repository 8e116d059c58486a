"""Answer extraction, exact and numeric match, and the format reward.

Completions end in a final answer written one of three ways, tried in this order by
:func:`final_answer`: an ``answer: X`` line, a LaTeX ``\\boxed{X}``, or (as a last resort,
only where a reward asks for it) the last number in the text.

Strict and lenient grading. A task asks for its answer in one format (an ``answer:`` line,
``<answer>`` tags), and by default only that format is read: a model that has not learnt the
format scores 0 whatever it knows. A problem whose ``meta["grading"]`` is ``"lenient"`` is
graded the way a reader would take the answer (:func:`lenient_answer`): the asked-for format
when it is there, else ``\\boxed{}``, else the last number (for a numeric reference) or the
last line. The format itself is then the ``format`` reward's business, a separate reward that
RL can teach without the accuracy depending on it. ``meta["answer_format"]`` names the format
the prompt asked for (``"line"``, the default, or ``"tag"``).

Not done here: answers spread over several lines, or natural-language numbers ("seven").
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional, Sequence

from tempering.rewards.base import register_reward
from tempering.types import Problem

# [^\S\n] is whitespace other than a newline: an answer is read from its own line, never the next.
ANSWER_LINE = re.compile(r"^[^\S\n]*answer:[^\S\n]*(.*?)[^\S\n]*$", re.IGNORECASE | re.MULTILINE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_MAX_NUMBER_CHARS = 400  # longer "numbers" are refused rather than parsed


def extract_answer(completion: str) -> Optional[str]:
    """The text of the last ``answer:`` line, or None.

    >>> extract_answer("7+8=15\\n4+3+1=8\\nanswer: 85")
    '85'
    >>> extract_answer("no final line") is None
    True
    """
    found = ANSWER_LINE.findall(completion)
    return found[-1] if found else None


def extract_boxed(completion: str) -> Optional[str]:
    """The contents of the last ``\\boxed{...}`` (or ``\\fbox``), braces balanced, or None.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and done")
    '\\\\frac{1}{2}'
    >>> extract_boxed(r"\\boxed{unclosed") is None
    True
    """
    start = max(completion.rfind("\\boxed{"), completion.rfind("\\fbox{"))
    if start < 0:
        return None
    i = completion.index("{", start) + 1
    depth, begin = 1, i
    while i < len(completion):
        depth += {"{": 1, "}": -1}.get(completion[i], 0)
        if depth == 0:
            return completion[begin:i].strip()
        i += 1
    return None


def last_number(completion: str) -> Optional[str]:
    """The last number in the text (thousands separators kept), or None.

    >>> last_number("it costs 1,250 dollars, or 12.5 each.")
    '12.5'
    """
    found = NUMBER.findall(completion)
    return found[-1].rstrip(",") if found else None


def tagged_answer(completion: str) -> Optional[str]:
    """The contents of the last ``<answer>...</answer>``, stripped, or None.

    >>> tagged_answer("<answer> 4 </answer> then <answer>5</answer>"), tagged_answer("<answer>4")
    ('5', None)
    """
    found = ANSWER_TAG.findall(completion)
    return found[-1].strip() if found else None


def last_line(completion: str) -> Optional[str]:
    """The last non-empty line, or None.

    >>> last_line("work\\nThe answer is Paris.\\n\\n"), last_line("  ")
    ('The answer is Paris.', None)
    """
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


def lenient_answer(completion: str, numeric: bool) -> Optional[str]:
    """The answer as a reader would take it: ``<answer>`` tags, an ``answer:`` line or
    ``\\boxed{}`` when present, else the last number (``numeric``) or the last line.

    >>> lenient_answer("5 + 7 = 12", numeric=True), lenient_answer("So 12.\\nanswer: 13", numeric=True)
    ('12', '13')
    >>> lenient_answer("They are brothers.\\nSo: uncle", numeric=False)
    'So: uncle'
    """
    for found in (tagged_answer(completion), extract_answer(completion), extract_boxed(completion)):
        if found:
            return found
    return last_number(completion) if numeric else last_line(completion)


def is_lenient(problem: Problem) -> bool:
    return problem.meta.get("grading") == "lenient"


def final_answer(completion: str, fallback_last_number: bool = False) -> Optional[str]:
    """The answer line, else the boxed answer, else (if asked) the last number.

    >>> final_answer(r"x = 2 so \\boxed{2}"), final_answer("answer: 3\\n\\\\boxed{4}")
    ('2', '3')
    """
    for found in (extract_answer(completion), extract_boxed(completion)):
        if found:
            return found
    return last_number(completion) if fallback_last_number else None


def _normalize(text: str) -> str:
    return text.strip().rstrip(".").replace(",", "").lower()


def normalize_text(text: str) -> str:
    """Case, spaces, ``$``, ``\\text{}``, a final full stop and thousands commas removed.

    >>> normalize_text(r" $\\text{Paris}$. "), normalize_text("1,024"), normalize_text("−3")
    ('paris', '1024', '-3')
    """
    text = re.sub(r"\\text\{([^{}]*)\}", r"\1", text).replace("$", "").replace("\u2212", "-")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    return re.sub(r"\s+", " ", text).strip().rstrip(".").strip().lower()


def parse_number(text: str) -> Optional[Fraction]:
    """An exact number from ``12``, ``-0.25``, ``3/4``, ``1,000``, ``50%``; None otherwise.

    >>> parse_number("3/4"), parse_number("1,000"), parse_number("50%"), parse_number("abc")
    (Fraction(3, 4), Fraction(1000, 1), Fraction(1, 2), None)
    """
    text = normalize_text(text).replace(" ", "")
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    percent = text.endswith("%")
    text = text.rstrip("%")
    try:
        if re.fullmatch(r"-?\d+/\d+", text):
            value = Fraction(text)
        elif re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", text):
            value = Fraction(text)
        else:
            return None
    except ZeroDivisionError:
        return None
    return value / 100 if percent else value


@register_reward("exact_match")
def exact_match(problem: Problem, completion: str) -> float:
    """1 when the final answer equals the reference after trimming, else 0; a lenient
    problem's answer is :func:`lenient_answer`'s, compared as text or as a number.

    >>> p = Problem(task="t", id="0", prompt="", answer="1,024")
    >>> exact_match(p, "answer: 1024."), exact_match(p, "answer: 1025"), exact_match(p, "1024")
    (1.0, 0.0, 0.0)
    >>> exact_match(Problem(task="t", id="0", prompt="", answer="85", meta={"grading": "lenient"}), "47 + 38 = 85.")
    1.0
    """
    if is_lenient(problem):
        return lenient_match(problem.answer, completion)
    answer = extract_answer(completion)
    return float(answer is not None and _normalize(answer) == _normalize(problem.answer))


@register_reward("match")
def match(problem: Problem, completion: str, *, tolerance: float = 0.0, relative: bool = True,
          last_number: bool = False) -> float:
    """1 when the final answer matches the reference as text or as a number, else 0.

    Text is compared after :func:`normalize_text`; numbers exactly (``0.50`` is ``1/2``), or
    within ``tolerance`` (relative to the reference when ``relative``, else absolute).
    ``last_number`` also reads an answer from the last number when there is no answer line
    or box. Not done: units and expressions (use ``math``).

    >>> p = Problem(task="t", id="0", prompt="", answer="0.5")
    >>> match(p, "answer: 1/2"), match(p, r"\\boxed{0.50}"), match(p, "answer: 0.51")
    (1.0, 1.0, 0.0)
    >>> match(p, "answer: 0.51", tolerance=0.05), match(p, "so 0.5", last_number=True)
    (1.0, 1.0)
    """
    return same_answer(final_answer(completion, fallback_last_number=last_number), problem.answer,
                       tolerance, relative)


def same_answer(answer: Optional[str], reference: str, tolerance: float = 0.0, relative: bool = True) -> float:
    """1 when ``answer`` equals ``reference`` after :func:`normalize_text`, or as a number (within
    ``tolerance``, relative to the reference when ``relative``); 0 for no answer."""
    if answer is None:
        return 0.0
    if normalize_text(answer) == normalize_text(reference):
        return 1.0
    got, want = parse_number(answer), parse_number(reference)
    if got is None or want is None:
        return 0.0
    bound = tolerance * (abs(float(want)) if relative else 1.0)
    return float(got == want or abs(float(got - want)) <= bound)


def lenient_match(reference: str, completion: str) -> float:
    """1 when :func:`lenient_answer` equals ``reference`` as text or exactly as a number."""
    return same_answer(lenient_answer(completion, numeric=parse_number(reference) is not None), reference)


def _tags_well_formed(completion: str, tags: Sequence[str]) -> bool:
    """Each tag once, in order, non-empty, and nothing but whitespace outside them."""
    pattern = r"\s*".join(rf"<{re.escape(t)}>\s*(\S.*?)\s*</{re.escape(t)}>" for t in tags)
    if not re.fullmatch(rf"\s*{pattern}\s*", completion, re.DOTALL):
        return False
    return all(completion.count(f"<{t}>") == 1 and completion.count(f"</{t}>") == 1 for t in tags)


@register_reward("format")
def answer_format(problem: Problem, completion: str, *, tags: Sequence[str] = (),
                  reasoning: bool = False) -> float:
    """1 when the completion has the required structure, else 0.

    Default: it ends with exactly one non-empty ``answer:`` line, or, for a problem whose
    ``meta["answer_format"]`` is ``"tag"``, with exactly one non-empty ``<answer>...</answer>``.
    ``reasoning=True`` also wants at least one other non-empty line before it. ``tags=["think", "answer"]`` instead
    wants exactly those tags, each once, in order, non-empty, with nothing outside them.

    >>> p = Problem(task="t", id="0", prompt="", answer="3")
    >>> answer_format(p, "1+2=3\\nanswer: 3"), answer_format(p, "answer: 3\\nanswer: 4")
    (1.0, 0.0)
    >>> answer_format(p, "answer: 3\\nmore text"), answer_format(p, "answer:")
    (0.0, 0.0)
    >>> answer_format(p, "answer: 3", reasoning=True)
    0.0
    >>> tags = ["think", "answer"]
    >>> answer_format(p, "<think>1+2</think> <answer>3</answer>", tags=tags)
    1.0
    >>> answer_format(p, "<answer>3</answer><think>1+2</think>", tags=tags)
    0.0
    >>> q = Problem(task="t", id="0", prompt="", answer="3", meta={"answer_format": "tag"})
    >>> answer_format(q, "1+2 is 3 <answer>3</answer>"), answer_format(q, "<answer>3</answer> done")
    (1.0, 0.0)
    """
    if tags:
        return float(_tags_well_formed(completion, tags))
    if problem.meta.get("answer_format") == "tag":
        return float(_ends_with_one_tag(completion, reasoning))
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    answers = ANSWER_LINE.findall(completion)
    ends_with_answer = (len(answers) == 1 and bool(answers[0]) and bool(lines)
                        and ANSWER_LINE.match(lines[-1]) is not None)
    return float(ends_with_answer and (not reasoning or len(lines) >= 2))


def _ends_with_one_tag(completion: str, reasoning: bool) -> bool:
    """Exactly one non-empty ``<answer>`` pair, and nothing after it."""
    stripped = completion.strip()
    if completion.count("<answer>") != 1 or not stripped.endswith("</answer>"):
        return False
    answer = tagged_answer(stripped)
    before = stripped[:stripped.index("<answer>")].strip()
    return bool(answer) and (not reasoning or bool(before))
