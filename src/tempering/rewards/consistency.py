"""The ``consistency`` reward: pay an answer for citing the statements it rests on, not only for its value.

A long answer names where each fact came from on ``cite:`` lines before its ``answer:`` line:

    cite: "The code of QM-897 was changed to 1250."
    cite: 12
    answer: 1250

A cite is a quote of one whole sentence of the document (quotes and a final full stop
optional, spaces and case as in the document up to runs of spaces) or a line number (``12``
or ``[12]``, for documents numbered one sentence per line). Each cite is checked against the
document the problem carries (``problem.meta["sentences"]``): a quote that is no sentence of
it, or a number beyond its lines, is *fabricated*. Of the cites that name a sentence, those
among the statements the answer rests on (``meta["evidence"]``) are right; a near miss or a
value overwritten later (``meta["decoys"]``) or filler is wrong. The ``long_context`` task
fills these fields on every problem.

Grounding is the F1 of precision (right cites over all cites, fabricated ones included) and
recall (evidence cited over evidence); a cite repeated counts once. ``combine`` (a registry of
plain functions, :data:`COMBINES`) joins it with the outcome (the ``answer:`` line against the
reference, after normalisation): ``mix`` (``(1 - weight) * outcome + weight * grounding``),
``gate`` (outcome x grounding: nothing for a grounded wrong answer or an ungrounded right one)
or ``grounding`` (grounding alone, to weigh beside an outcome reward in the task's rewards).

Not done here: paraphrased quotes, partial sentences, cites of facts the model derived itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Literal, Optional

from pydantic import Field

from tempering.rewards.base import register_reward
from tempering.rewards.basic import final_answer, same_answer
from tempering.types import Problem, RewardResult

CITE_LINE = re.compile(r"^[^\S\n]*cite:[^\S\n]*(.*?)[^\S\n]*$", re.IGNORECASE | re.MULTILINE)
LINE_NUMBER = re.compile(r"\[?(\d+)\]?")

COMBINES: dict[str, Callable[[float, float, float], float]] = {
    "mix": lambda outcome, grounding, weight: (1 - weight) * outcome + weight * grounding,
    "gate": lambda outcome, grounding, weight: outcome * grounding,
    "grounding": lambda outcome, grounding, weight: grounding,
}
"""How grounding joins the outcome: (outcome, grounding, ``weight``) -> score."""


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().strip("\"'\u201c\u201d").strip().rstrip(".").strip()


def cited_sentences(completion: str, sentences: list[str]) -> list[Optional[int]]:
    """The index of the sentence each ``cite:`` line names, in order, repeats once; None for
    a fabricated one (a quote that is no sentence of the document, a line beyond it).

    >>> doc = ["Rain fell.", "The code of AB-123 is 4521.", "Wind rose."]
    >>> cited_sentences('cite: "The code of AB-123 is 4521."\\ncite: [3]\\ncite: 2\\ncite: 9', doc)
    [1, 2, None]
    >>> cited_sentences("cite: The code of AB-123 is 4522.", doc)
    [None]
    """
    index = {_key(s): i for i, s in enumerate(sentences)}
    found: list[Optional[int]] = []
    for cite in CITE_LINE.findall(completion):
        number = LINE_NUMBER.fullmatch(cite)
        if number:
            where = int(number.group(1)) - 1
            resolved = where if 0 <= where < len(sentences) else None
        else:
            resolved = index.get(_key(cite))
        if resolved is None or resolved not in found:
            found.append(resolved)
    return found


def _document(problem: Problem, reward: str = "consistency") -> tuple[list[str], set[int], set[int]]:
    meta = problem.meta
    if "sentences" not in meta or "evidence" not in meta:
        raise ValueError(f"reward {reward!r} checks cites against problem.meta['sentences'] and ['evidence'], "
                         f"which task {problem.task!r} does not provide; use it with the long_context task")
    return list(meta["sentences"]), set(meta["evidence"]), set(meta.get("decoys", ()))


@register_reward("consistency")
def consistency(problem: Problem, completion: str, *, combine: Literal["mix", "gate", "grounding"] = "mix",
                weight: Annotated[float, Field(ge=0, le=1)] = 0.5) -> RewardResult:
    """The outcome joined with the grounding of the answer's cites (see the module docstring).

    Components: ``outcome``, ``grounding`` (F1), ``precision``, ``recall``, ``fabricated`` and
    ``decoys`` (shares of the cites), and ``exact`` (1 when the cites are exactly the evidence).

    >>> doc = ["Rain fell.", "The code of AB-123 is 1111.", "The code of AB-123 was changed to 4521."]
    >>> p = Problem(task="long_context", id="AB-123:4521", prompt="", answer="4521",
    ...             meta={"sentences": doc, "evidence": [2], "decoys": [1]})
    >>> consistency(p, "cite: 3\\nanswer: 4521").score  # right answer, right cite
    1.0
    >>> consistency(p, "answer: 4521").score  # right answer, no cite: half, under mix
    0.5
    >>> r = consistency(p, 'cite: "The code of AB-123 is 1111."\\ncite: 3\\nanswer: 4521')
    >>> round(r.score, 3), r.components["decoys"]  # a stale value cited beside the latest
    (0.833, 0.5)
    >>> consistency(p, 'cite: "The code of AB-123 is 4521."\\nanswer: 4521', combine="gate").score
    0.0
    """
    sentences, evidence, decoys = _document(problem)
    cited = cited_sentences(completion, sentences)
    right = sum(i in evidence for i in cited)
    precision = right / len(cited) if cited else 0.0
    recall = right / len(evidence) if evidence else 1.0
    grounding = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    outcome = same_answer(final_answer(completion), problem.answer)
    share = (lambda count: count / len(cited) if cited else 0.0)
    components = {"outcome": outcome, "grounding": grounding, "precision": precision, "recall": recall,
                  "fabricated": share(cited.count(None)), "decoys": share(sum(i in decoys for i in cited)),
                  "exact": float(set(cited) == evidence)}
    return RewardResult(COMBINES[combine](outcome, grounding, weight), components, {"cites": len(cited)})


@register_reward("cited_match")
def cited_match(problem: Problem, completion: str) -> RewardResult:
    """The outcome alone (the ``answer:`` line against the reference, as :func:`consistency`
    reads it); the component ``cites_right`` is 1 when, beyond that, the answer's cites name
    exactly the statements it rests on.

    The metric of a ``long_context`` task that asks for cites: held-out evaluation then reports
    the share of answers whose cited facts are right (``eval/<task>/cites_right``) beside
    accuracy, which an outcome reward pays the same whatever the cites say.

    >>> doc = ["Rain fell.", "The code of AB-123 is 1111.", "The code of AB-123 was changed to 4521."]
    >>> p = Problem(task="long_context", id="AB-123:4521", prompt="", answer="4521",
    ...             meta={"sentences": doc, "evidence": [2], "decoys": [1]})
    >>> [(r.score, r.components["cites_right"]) for r in (cited_match(p, c) for c in
    ...  ("cite: 3\\nanswer: 4521", "cite: 2\\nanswer: 4521", "answer: 4521", "cite: 3\\nanswer: 1111"))]
    [(1.0, 1.0), (1.0, 0.0), (1.0, 0.0), (0.0, 0.0)]
    """
    sentences, evidence, _ = _document(problem, "cited_match")
    outcome = same_answer(final_answer(completion), problem.answer)
    grounded = outcome == 1.0 and set(cited_sentences(completion, sentences)) == evidence
    return RewardResult(outcome, {"cites_right": float(grounded)})


cited_match.summary = ("cites_right",)
"""The component a held-out evaluation reports as a mean (``tempering.eval.greedy``)."""
