"""Every reasoning-gym task type as its own tempering task, graded by reasoning-gym's own scorer.

``rg:<type>`` (e.g. ``rg:basic_arithmetic``) is one domain; :func:`rg_types` lists them all.
Another name under the prefix with a ``type`` option (``rg:arith-hard``, ``type:
basic_arithmetic``) makes a second domain of the same type with other settings. This module,
and with it the ``reasoning_gym`` reward, is loaded when the first ``rg:`` task is built,
because importing reasoning-gym takes seconds that a run without it should not pay.
Items are generated lazily, one at a time, when the mixture asks for them: reasoning-gym
generators are procedural and most take well under a millisecond, but a few (``knight_swap``,
``intermediate_integration``, ``zebra_puzzles``) take 0.1-1 s per item, so building all 105
types up front would stall a run's start for nothing. There is no background generation
worker; a slow type costs its time inside the sampling step.

Determinism and the split: reasoning-gym seeds item ``i`` of a dataset seeded ``s`` with
``s + i``, so two datasets with nearby seeds share items. Training item ``i`` therefore uses
the item seeded ``seed * 10**7 + 100 * i`` (kept below ``EVAL_SEED``) and the held-out split
items seeded from ``EVAL_SEED`` up; on top of that, a training item whose question text equals
a held-out one is replaced by the next seed (up to 99 times), so the split is disjoint by text
even for types with small problem spaces.
Datasets are built in blocks of ``BLOCK`` items, because a few types pre-generate a pool or
refuse a large virtual size.

Grading: the ``reasoning_gym`` reward takes the completion's last ``<answer>...</answer>``, else
its ``answer:`` line, and calls the type's ``score_answer`` with the full item (metadata
included), which is what the types whose answers are *validated* need (``graph_color``,
``rubiks_cube``, ``propositional_logic``, ``boxnet``, ``rush_hour``: any valid answer scores).
For those the problem's ``answer`` is an example valid answer where reasoning-gym gives one
(:data:`EXAMPLE_KEYS`), else empty (:data:`NO_REFERENCE`).

Difficulty: with ``curriculum: true`` a type that has a reasoning-gym curriculum exposes
``levels`` (its global levels) and a settable ``level`` that the scheduler raises.

The reward is reasoning-gym's score as is, so partial credit (e.g. 0.05 for a well-formed
wrong answer in some types) counts partially in accuracy too.

Not done here: the ``composite`` dataset (a mixture is the scheduler's job).
"""

from __future__ import annotations

import json
from typing import Any

from tempering.rewards.base import register_reward
from tempering.rewards.basic import extract_answer
from tempering.types import Problem

PREFIX = "rg:"
EVAL_SEED = 4_000_000_000
"""Held-out items are seeded from here up (reasoning-gym seeds must stay below 2**32)."""
BLOCK = 1000
EXAMPLE_KEYS = {"graph_color": "possible_answer", "rubiks_cube": "example_correct_answer",
                "propositional_logic": "example_answer"}
"""Types whose answer is validated, and the metadata field holding one valid answer."""
NO_REFERENCE = frozenset({"boxnet", "rush_hour"})
"""Validated types for which reasoning-gym keeps no valid answer at all."""
_SKIP_TRIES = 100


def _rg():
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ValueError("reasoning-gym tasks need the reasoning-gym package: pip install 'reasoning-gym>=0.1.25,<0.2'") from exc
    return reasoning_gym


def rg_types() -> list[str]:
    """Every reasoning-gym task type, except the ``composite`` mixture."""
    _rg()
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != "composite")


def reference_answer(rg_type: str, entry: dict[str, Any]) -> str:
    """The item's answer, or an example valid answer for the validated types ("" if none)."""
    if rg_type in EXAMPLE_KEYS:
        example = entry["metadata"].get(EXAMPLE_KEYS[rg_type])
        return example if isinstance(example, str) else json.dumps(example)
    return "" if entry.get("answer") is None else str(entry["answer"])


class ReasoningGymTask:
    """One reasoning-gym type. ``config``: keyword options for the type's config dataclass;
    ``style``: ``raw`` (question then a newline) or ``chat`` (a user message asking for
    ``<answer>`` tags); ``eval_size``: held-out items, all excluded from training by text."""

    def __init__(self, name: str, seed: int, type: str = "", config: dict[str, Any] | None = None,
                 style: str = "chat", eval_size: int = 64, curriculum: bool = False, domain: str = "",
                 rewards: dict[str, float] | None = None):
        rg = _rg()
        self.rg_type = type or name.removeprefix(PREFIX)
        if self.rg_type not in rg_types():
            raise ValueError(f"unknown reasoning-gym type {self.rg_type!r}; see tempering.tasks.reasoning_gym.rg_types()")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        self.name, self.seed, self.style, self.eval_size = name, seed, style, eval_size
        self.domain = domain or name
        self.rewards = dict(rewards or {"reasoning_gym": 1.0})
        self.metric = "reasoning_gym"
        self.config = dict(config or {})
        self._curriculum = None
        if curriculum:
            from reasoning_gym.factory import CURRICULA, create_curriculum

            if self.rg_type not in CURRICULA:
                raise ValueError(f"reasoning-gym type {self.rg_type!r} has no curriculum; set curriculum: false")
            self._curriculum = create_curriculum(self.rg_type)
            self.levels = max(len(attr.levels) for attr in self._curriculum.attributes.values())
        self.level = 0
        self._rg = rg
        self._held_out: set[str] | None = None
        self._blocks: dict[tuple[int, int], Any] = {}

    def _dataset(self, seed: int, size: int):
        try:
            if self._curriculum is None:
                return self._rg.create_dataset(self.rg_type, seed=seed, size=size, **self.config)
            self._curriculum.set_global_level(self.level)
            config = self._curriculum.generate_configuration({"seed": seed, "size": size, **self.config})
            from reasoning_gym.factory import DATASETS

            return DATASETS[self.rg_type][0](config=config)
        except (TypeError, AssertionError) as exc:
            raise ValueError(f"reasoning-gym type {self.rg_type!r}: bad config {self.config}: {exc}") from exc

    def _item(self, seed_index: int) -> dict[str, Any]:
        block, offset = divmod(seed_index, BLOCK)
        key = (block, self.level)
        if key not in self._blocks:
            if len(self._blocks) >= 2:  # a stream moves forward: the oldest block is done
                del self._blocks[next(iter(self._blocks))]
            self._blocks[key] = self._dataset(block * BLOCK, BLOCK)
        return self._blocks[key][offset]

    def _eval_entries(self) -> list[dict[str, Any]]:
        dataset = self._dataset(EVAL_SEED, self.eval_size)
        return [dataset[i] for i in range(self.eval_size)]

    def held_out_questions(self) -> set[str]:
        if self._held_out is None:
            self._held_out = {entry["question"] for entry in self._eval_entries()}
        return self._held_out

    def _problem(self, entry: dict[str, Any], id: str) -> Problem:
        question = entry["question"]
        if self.style == "raw":
            prompt: Any = f"{question}\n"
        else:
            prompt = [{"role": "user", "content": f"{question}\n\nGive your final answer inside <answer></answer> tags."}]
        return Problem(task=self.name, id=id, prompt=prompt, answer=reference_answer(self.rg_type, entry),
                       domain=self.domain, meta={"rg_type": self.rg_type, "entry": entry})

    def train_problem(self, index: int) -> Problem:
        held_out = self.held_out_questions()
        base = (self.seed * 10**7 + index * _SKIP_TRIES) % (EVAL_SEED - _SKIP_TRIES)
        for attempt in range(_SKIP_TRIES):
            entry = self._item(base + attempt)
            if entry["question"] not in held_out:
                return self._problem(entry, f"L{self.level}:{index}")
        raise ValueError(f"reasoning-gym type {self.rg_type!r}: {_SKIP_TRIES} training items in a row repeat "
                         f"held-out questions; the problem space is too small for eval_size={self.eval_size}")

    def eval_problems(self, n: int) -> list[Problem]:
        if n > self.eval_size:
            raise ValueError(f"{self.name}: {n} eval problems asked, eval_size is {self.eval_size}")
        return [self._problem(entry, f"eval:{i}") for i, entry in enumerate(self._eval_entries()[:n])]


def build_rg_task(name: str, seed: int, **options: Any) -> ReasoningGymTask:
    """The factory behind ``rg:<type>`` names (see ``tempering.tasks.base.LAZY_TASKS``)."""
    return ReasoningGymTask(name, seed, **options)


@register_reward("reasoning_gym")
def reasoning_gym_score(problem: Problem, completion: str) -> float:
    """reasoning-gym's own score of the last ``<answer>`` (else the ``answer:`` line), 0..1."""
    from reasoning_gym.utils import extract_answer as extract_tag

    found = extract_tag(completion)
    if found is None:
        found = extract_answer(completion)
    scorer = _rg().get_score_answer_fn(problem.meta["rg_type"])
    return float(scorer(found, problem.meta["entry"]))

