"""Every reasoning-gym task type as its own tempering task, graded by reasoning-gym's own scorer.

``rg:<type>`` (e.g. ``rg:basic_arithmetic``) is one domain; :func:`rg_types` lists them all.
Another name under the prefix with a ``type`` option (``rg:arith-hard``, ``type:
basic_arithmetic``) makes a second domain of the same type with other settings. This module,
and with it the ``reasoning_gym`` reward, is loaded when the first ``rg:`` task is built,
because importing reasoning-gym takes seconds that a run without it should not pay.
Items are generated lazily, when the mixture asks for them: most reasoning-gym generators
take well under a millisecond, so building all 105 types up front would stall a run's start
for nothing. A few are slow (:data:`SLOW_TYPES`, 40 ms to 0.7 s per training item on a CPU
core), and those generate ahead: with ``prefetch`` (by default on for :data:`SLOW_TYPES` only)
a worker process makes the next training items and the held-out set while the run samples
and learns, and the task takes them in index order, so the stream is item for item the one
generated without it. A process, not a thread: generation is pure Python and a thread would
hold the interpreter lock against the sampling loop (``bench/rg_prefetch.py`` measures both).
The worker gains only where a core is free for it (a GPU run, a CPU with cores to spare); on
a CPU that the run already saturates it competes with sampling for the same cores, which is
what ``prefetch: 0`` avoids. It is on by default for the slow types because there a type's
0.1-0.7 s per item otherwise lands inside every step that draws it.

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
(:data:`EXAMPLE_KEYS`), else empty (:data:`NO_REFERENCE`). Some scorers raise on an answer
they cannot parse (``prime_factorization`` calls ``int()`` on each factor, so a sentence read
leniently as the answer raised ``ValueError``); such an answer scores 0, as a wrong one, rather
than counting as a grader fault that drops the rollout and pauses the task.

Difficulty: with ``curriculum: true`` a type that has a reasoning-gym curriculum exposes
``levels`` (its global levels) and a settable ``level`` that the scheduler raises. The held-out
items follow the level: evaluation uses the current level's, and training skips those.

The reward is reasoning-gym's score as is, so partial credit (e.g. 0.05 for a well-formed
wrong answer in some types) counts partially in accuracy too.

Not done here: the ``composite`` dataset (a mixture is the scheduler's job).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import weakref
from collections.abc import Callable
from typing import Any

from tempering.registry import typed_options
from tempering.rewards.base import register_reward
from tempering.rewards.basic import extract_answer, is_lenient, lenient_answer, parse_number
from tempering.tasks.base import StreamState, check_grading, render
from tempering.types import Problem, domain_of

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
DEFAULT_TEMPLATE = "{question}\n\nGive your final answer inside <answer></answer> tags."
SLOW_TYPES = frozenset({"knight_swap", "sokoban", "futoshiki", "zebra_puzzles", "puzzle24", "intermediate_integration",
                        "quantum_lock", "polynomial_equations", "arc_agi", "group_anagrams", "acre", "figlet_font"})
"""Types that take about 40 ms or more per training item (an item, or a share of building its block
of :data:`BLOCK` seeds; measured on one contended CPU core with ``bench/rg_prefetch.py``)."""
PREFETCH_AHEAD = 8
"""Training items a slow type keeps generated ahead by default: a few steps of its share of the
prompts in a mixture, without making many that a short run never uses."""
WORKER_WAIT_S = 300.0
"""How long to wait for one result of the prefetch worker before generating it here instead
(a worker that died leaves its result pending for ever)."""


ANSWER_ERRORS = (ValueError, TypeError, IndexError, KeyError, AttributeError, ArithmeticError, SyntaxError)
"""What a type's scorer raises when it cannot parse the answer it is given (``int()`` of a word, a
list index past a short answer, a formula that does not parse): such an answer scores 0. Anything
else it raises (a broken install, a missing file) is still a grader fault."""


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


class _Source:
    """Items of one reasoning-gym type and config by seed index and level; the same code runs in
    the task's own process and in its prefetch worker, so both produce identical items."""

    def __init__(self, rg_type: str, config: dict[str, Any], curriculum: bool):
        self.rg_type, self.config, self.curriculum = rg_type, config, curriculum
        self._blocks: dict[tuple[int, int], Any] = {}

    def dataset(self, seed: int, size: int, level: int):
        rg = _rg()
        try:
            if not self.curriculum:
                return rg.create_dataset(self.rg_type, seed=seed, size=size, **self.config)
            from reasoning_gym.factory import DATASETS, create_curriculum

            curriculum = create_curriculum(self.rg_type)
            curriculum.set_global_level(level)
            config = curriculum.generate_configuration({"seed": seed, "size": size, **self.config})
            return DATASETS[self.rg_type][0](config=config)
        except (TypeError, AssertionError) as exc:
            raise ValueError(f"reasoning-gym type {self.rg_type!r}: bad config {self.config}: {exc}") from exc

    def item(self, seed_index: int, level: int) -> dict[str, Any]:
        block, offset = divmod(seed_index, BLOCK)
        key = (block, level)
        if key not in self._blocks:
            if len(self._blocks) >= 2:  # a stream moves forward: the oldest block is done
                del self._blocks[next(iter(self._blocks))]
            self._blocks[key] = self.dataset(block * BLOCK, BLOCK, level)
        return self._blocks[key][offset]

    def eval_entries(self, size: int, level: int) -> list[dict[str, Any]]:
        dataset = self.dataset(EVAL_SEED, size, level)
        return [dataset[i] for i in range(size)]


_WORKER_SOURCES: dict[str, _Source] = {}
"""In a prefetch worker process: the sources it has built, by their spec."""


def _worker_source(spec: str) -> _Source:
    if spec not in _WORKER_SOURCES:
        rg_type, config, curriculum = json.loads(spec)
        _WORKER_SOURCES[spec] = _Source(rg_type, config, curriculum)
    return _WORKER_SOURCES[spec]


def _worker_item(spec: str, seed_index: int, level: int) -> dict[str, Any]:
    return _worker_source(spec).item(seed_index, level)


def _worker_eval(spec: str, size: int, level: int) -> list[dict[str, Any]]:
    return _worker_source(spec).eval_entries(size, level)


class ReasoningGymTask(StreamState):
    """One reasoning-gym type. ``config``: keyword options for the type's config dataclass;
    ``style``: ``raw`` (question then a newline) or ``chat`` (a user message asking for
    ``<answer>`` tags); ``eval_size``: held-out items, all excluded from training by text;
    ``prefetch``: training items generated ahead in a worker process (0 = none; ``None`` =
    :data:`PREFETCH_AHEAD` for :data:`SLOW_TYPES`, none for the others); ``grading``:
    ``strict`` reads only ``<answer>`` tags or an ``answer:`` line, ``lenient`` falls back to
    ``\\boxed{}``, then the last number (numeric answers) or the last line (see
    ``tempering.rewards.basic``); ``template``: the chat prompt, with ``{question}``."""

    def __init__(self, name: str, seed: int, type: str = "", config: dict[str, Any] | None = None,
                 style: str = "chat", eval_size: int = 64, curriculum: bool = False, domain: str = "",
                 rewards: dict[str, float] | None = None, prefetch: int | None = None,
                 grading: str = "strict", template: str = DEFAULT_TEMPLATE):
        _rg()
        self.rg_type = type or name.removeprefix(PREFIX)
        if self.rg_type not in rg_types():
            raise ValueError(f"unknown reasoning-gym type {self.rg_type!r}; see tempering.tasks.reasoning_gym.rg_types()")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        check_grading(grading)
        render(template, question="")  # a bad placeholder fails here, naming itself, not in the first step
        self.grading, self.template = grading, template
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0):
            raise ValueError(f"prefetch must be a count of items >= 0 (0 = off) or null (automatic), got {prefetch!r}")
        self.name, self.seed, self.style, self.eval_size = name, seed, style, eval_size
        self.domain = domain_of(name, domain)
        self.rewards = dict(rewards or {"reasoning_gym": 1.0})
        self.metric = "reasoning_gym"
        self.config = dict(config or {})
        if curriculum:
            from reasoning_gym.factory import CURRICULA, create_curriculum

            if self.rg_type not in CURRICULA:
                raise ValueError(f"reasoning-gym type {self.rg_type!r} has no curriculum; set curriculum: false")
            self.levels = max(len(attr.levels) for attr in create_curriculum(self.rg_type).attributes.values())
        self.level = 0
        self.prefetch = (PREFETCH_AHEAD if self.rg_type in SLOW_TYPES else 0) if prefetch is None else prefetch
        self._source = _Source(self.rg_type, self.config, curriculum)
        self._spec = json.dumps([self.rg_type, self.config, curriculum])
        self._eval: dict[int, list[dict[str, Any]]] = {}
        self._held_out: dict[int, set[str]] = {}
        self._pool = None
        self._ahead: dict[tuple[int, int], Any] = {}
        """(level, seed index) -> pending result of the worker."""
        self._eval_ahead: dict[int, Any] = {}
        if self.prefetch:  # the held-out set is needed first (evaluation before training): start on it now
            self._eval_ahead[0] = self._worker().apply_async(_worker_eval, (self._spec, self.eval_size, 0))

    # -- the prefetch worker -------------------------------------------------------------
    def _worker(self):
        if self._pool is None:
            # a process, not a thread: item generation is pure Python and would hold the GIL
            # against the sampling loop. Forked (where the platform can), not spawned: a spawned
            # worker re-runs the user's main script, which breaks scripts without a __main__
            # guard; the fork happens when the task is built, before the run starts other threads
            methods = multiprocessing.get_all_start_methods()
            self._pool = multiprocessing.get_context("fork" if "fork" in methods else "spawn").Pool(1)
            self._stop_worker = weakref.finalize(self, self._pool.terminate)  # when collected, or at exit
        return self._pool

    def _prefetch_after(self, index: int) -> None:
        """Ask the worker for the ``prefetch`` training items after ``index`` not yet asked; forget
        those before ``index`` and those of another level."""
        stale = [key for key in self._ahead if key[0] != self.level or key[1] < self._seed_index(index, 0)]
        for key in stale:
            del self._ahead[key]
        for i in range(index + 1, index + 1 + self.prefetch):
            key = (self.level, self._seed_index(i, 0))
            if key not in self._ahead:
                self._ahead[key] = self._worker().apply_async(_worker_item, (self._spec, key[1], self.level))

    def close(self) -> None:
        """Stop the prefetch worker, if one runs (also done at exit)."""
        if self._pool is not None:
            self._stop_worker()
            self._pool.join()
            self._pool, self._ahead, self._eval_ahead = None, {}, {}

    # -- items ---------------------------------------------------------------------------
    def _seed_index(self, index: int, attempt: int) -> int:
        return (self.seed * 10**7 + index * _SKIP_TRIES) % (EVAL_SEED - _SKIP_TRIES) + attempt

    def _result(self, pending, make: Callable[[], Any]) -> Any:
        """The worker's result, or ``make()`` here when none was asked or the worker is lost."""
        if pending is None:
            return make()
        try:
            return pending.get(timeout=WORKER_WAIT_S)
        except multiprocessing.TimeoutError:
            self.close()
            self.prefetch = 0
            return make()

    def _item(self, seed_index: int) -> dict[str, Any]:
        return self._result(self._ahead.pop((self.level, seed_index), None),
                            lambda: self._source.item(seed_index, self.level))

    def _eval_entries(self) -> list[dict[str, Any]]:
        if self.level not in self._eval:
            self._eval[self.level] = self._result(self._eval_ahead.pop(self.level, None),
                                                  lambda: self._source.eval_entries(self.eval_size, self.level))
        return self._eval[self.level]

    def held_out_questions(self) -> set[str]:
        """The held-out questions at the current level, which training never serves."""
        if self.level not in self._held_out:
            self._held_out[self.level] = {entry["question"] for entry in self._eval_entries()}
        return self._held_out[self.level]

    def _problem(self, entry: dict[str, Any], id: str) -> Problem:
        question = entry["question"]
        meta = {"rg_type": self.rg_type, "entry": entry, "grading": self.grading}
        if self.style == "raw":
            prompt: Any = f"{question}\n"
        else:  # the chat prompt asks for <answer> tags, so the format reward checks those
            prompt = [{"role": "user", "content": render(self.template, question=question)}]
            meta["answer_format"] = "tag"
        return Problem(task=self.name, id=id, prompt=prompt, answer=reference_answer(self.rg_type, entry),
                       domain=self.domain, meta=meta)

    def train_problem(self, index: int) -> Problem:
        if self.prefetch:
            self._prefetch_after(index)
        held_out = self.held_out_questions()
        self._served(index)
        for attempt in range(_SKIP_TRIES):
            entry = self._item(self._seed_index(index, attempt))
            if entry["question"] not in held_out:
                return self._problem(entry, f"L{self.level}:{index}")
        raise ValueError(f"reasoning-gym type {self.rg_type!r}: {_SKIP_TRIES} training items in a row repeat "
                         f"held-out questions; the problem space is too small for eval_size={self.eval_size}")

    def eval_problems(self, n: int) -> list[Problem]:
        """The first ``n`` held-out items, or all ``eval_size`` of them when that is fewer (the
        held-out set cannot grow: training already excludes exactly these questions)."""
        return [self._problem(entry, f"eval:{i}") for i, entry in enumerate(self._eval_entries()[:n])]

    def corpus_document(self, index: int, wrong_share: float, tool_share: float = 0.0) -> str:
        """A pre-training document: training problem ``index``'s raw prompt and its worked
        solution (``tempering.tasks.rg_corpus``), with the type's classic mistake with
        probability ``wrong_share``; ``tool_share`` does not apply (no calculator here)."""
        if self.style != "raw":
            raise ValueError(f"{self.name}: pre-training documents are written in style 'raw', not {self.style!r}")
        from tempering.tasks.rg_corpus import document_body

        problem = self.train_problem(index)
        buggy = random.Random(f"corpus:{self.seed}:{self.name}:{index}").random() < wrong_share
        return problem.prompt + document_body(self.rg_type, problem.meta["entry"], buggy)

    def _extra_state(self) -> dict[str, Any]:
        return {"level": self.level}

    def _load_extra(self, state: dict[str, Any]) -> None:
        self.level = int(state.get("level", 0))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.prefetch:
            self._prefetch_after(self.next_index - 1)


def build_rg_task(name: str, seed: int, **options: Any) -> ReasoningGymTask:
    """The factory behind ``rg:<type>`` names (see ``tempering.tasks.base.LAZY_TASKS``), its
    options typed by :class:`ReasoningGymTask`'s signature."""
    return ReasoningGymTask(name, seed, **typed_options(ReasoningGymTask, options))


@register_reward("reasoning_gym")
def reasoning_gym_score(problem: Problem, completion: str) -> float:
    """reasoning-gym's own score of the last ``<answer>`` (else the ``answer:`` line), 0..1;
    a lenient problem falls back to the answer a reader would take. An answer the type's scorer
    cannot parse (:data:`ANSWER_ERRORS`) scores 0."""
    from reasoning_gym.utils import extract_answer as extract_tag

    if is_lenient(problem):
        found = lenient_answer(completion, numeric=parse_number(problem.answer) is not None)
    else:
        found = extract_tag(completion)
        if found is None:
            found = extract_answer(completion)
    scorer = _rg().get_score_answer_fn(problem.meta["rg_type"])
    try:
        return float(scorer(found, problem.meta["entry"]))
    except ANSWER_ERRORS:  # the type's parser choked on the model's text: a wrong answer, not a grader fault
        return 0.0

