"""``code``: procedural Python problems, graded by hidden tests that the sandbox's parent judges.

Each problem asks for one small function from a family of :mod:`tempering.tasks.code_families`
(a spec with drawn constants, the signature and one worked example); its hidden tests are
call cases (at least ``tests`` of them, the family's edge cases first: empty input, values on
the boundary, negatives, duplicates), with expected values computed here by the family's
reference body, so the ``code`` reward's verdict comes from the trusted parent and cannot be
forged by the program. ``code`` takes every kind of family; ``code:<kind>`` (``code:filter``,
``code:string``, ...) one kind, so a mixture of those tasks reports accuracy per kind.

``style="raw"``, for the built-in character-level model, writes the spec and the example as
comments above the ``def`` line, and the completion is the function's body::

    # the items of xs that are at least 7, in order
    # at_least([3, 9, 7]) == [9, 7]
    def at_least(xs):

``style="chat"`` asks a chat model for the whole function in a fenced block.

The held-out split is a partition of each family's constants: a problem is held out when its
(family, constants) hash falls in the first of ``EVAL_EVERY`` buckets, so a held-out program is
never asked for in training, nor written in the pre-training corpus; with a hundred constants
per family at level 1, a quarter held out is dozens of distinct functions per family. A family
whose constants all hash outside that bucket holds out its lowest-hashed constants instead.

``corpus_document`` writes a training problem with its solution for ``temper pretrain``; with
probability ``wrong_share`` the solution is one of the family's classic bugs, so a model
pre-trained on it knows the right program and the wrong one, as the arithmetic corpus does.
With ``corpus_reflections``, that share of the documents are reflection episodes as the
``reflection`` environment plays them for a raw problem: an attempt with one of the family's
bugs, the turn's end (:data:`TURN_END`, the tokenizer's end-of-sequence), the environment's
feedback on its first failing hidden case (computed here by running the trusted buggy body
in-process), and a second attempt drawn as any answer is (right, or a bug with probability
``wrong_share``), independent of the feedback. So the model learns the episode's form, and
that an attempt may follow feedback, but not that the feedback says how to fix it: that is
left for RL in the environment.

Not done here: other languages, stdin/stdout programs, problems needing more than one function.
"""

from __future__ import annotations

import functools
import json
import random
import zlib
from typing import Any

from tempering.envs.reflection import feedback_for
from tempering.registry import typed_options
from tempering.rewards.code import problem_tests
from tempering.sandbox.spec import CaseResult, values_match
from tempering.tasks.base import StreamState, register_task
from tempering.tasks.code_families import FAMILIES, FEEDBACK_FAMILIES, KINDS, Family, Params, reference, run_reference
from tempering.types import Problem, domain_of

EVAL_EVERY = 4
"""One (family, constants) pair in EVAL_EVERY, by a stable hash, is held out for evaluation."""

TURN_END = "<eos>"
"""Where a model turn ends inside a corpus document: pre-training encodes it as the end-of-
sequence token (``tempering.pretrain``), which is where the sampler ends a turn."""

_ENUMERATE_DRAWS = 100
"""Draws per level used to find a family's constants when choosing its fallback held-out pair."""


def _bucket(family: Family, params: Params) -> int:
    return zlib.crc32(f"{family.name}:{json.dumps(family.asked(params), sort_keys=True)}".encode())


@functools.lru_cache(maxsize=None)
def _fallback(family: Family) -> str:
    """The constants (as JSON) held out when none of a family's level-1 constants falls in
    the held-out bucket ('' when some do); level 1's constants are drawn at every level."""
    rng = random.Random(f"enumerate:{family.name}")
    seen = {json.dumps(family.asked(family.constants(rng, 1)), sort_keys=True) for _ in range(_ENUMERATE_DRAWS)}
    if any(_bucket(family, json.loads(p)) % EVAL_EVERY == 0 for p in seen):
        return ""
    return min(seen, key=lambda p: _bucket(family, json.loads(p)))


class CodeTask(StreamState):
    """Problems from the families of ``kinds`` (all by default) or the named ``families`` (these
    may name a feedback family, which ``kinds`` alone never draws),
    at ``levels`` (1..3, one drawn per problem), with at least ``tests`` hidden call cases.

    ``partial``: the reward is the share of cases passed instead of 1 only when all pass.
    ``corpus_mistakes``: where pre-training documents may carry a bug: ``any`` problem, or only
    those whose parameter ``k`` is ``odd``, so that a model trained on them is right on the
    rest (as the arithmetic tasks' missing carry shows only on sums that carry) and starts part
    right, with something left for RL to fix; it changes no training or held-out problem.
    ``corpus_wrong_share``: the share of those documents written with a bug, in place of the
    corpus's ``wrong_share`` (null: the corpus's). A bug breaks every hidden test, so greedy
    decoding takes whichever form the model finds likelier: at the corpus's 0.6 on odd ``k``
    alone (0.3 of all documents) a model that half learns the parity writes the right form on
    every problem, and a share near 1 keeps the bug the likelier form where ``k`` is odd.
    ``corpus_reflections``: the share of pre-training documents written as a two-attempt
    reflection episode (see the module docstring); 0 = none.
    """

    corpus_version = 2
    """Of the documents :meth:`corpus_document` writes (2: level-1 constants 0..99, not 0..9);
    part of a pre-trained model's cache key (``tempering.pretrain.cache_key``)."""

    def __init__(self, name: str, seed: int, kinds: list[str] | None = None, families: list[str] | None = None,
                 levels: list[int] | None = None, style: str = "raw", tests: int = 10, partial: bool = False,
                 domain: str = "", rewards: dict[str, float] | None = None, corpus_mistakes: str = "any",
                 corpus_wrong_share: float | None = None, corpus_reflections: float = 0.0):
        kinds = list(kinds or KINDS)
        if corpus_mistakes not in ("any", "odd"):
            raise ValueError(f"corpus_mistakes must be 'any' or 'odd', got {corpus_mistakes!r}")
        self.corpus_mistakes = corpus_mistakes
        if corpus_wrong_share is not None and not 0 <= corpus_wrong_share <= 1:
            raise ValueError(f"corpus_wrong_share must be between 0 and 1 (or null), got {corpus_wrong_share!r}")
        self.corpus_wrong_share = corpus_wrong_share
        if not 0 <= corpus_reflections <= 1:
            raise ValueError(f"corpus_reflections must be a share between 0 and 1, got {corpus_reflections!r}")
        self.corpus_reflections = corpus_reflections
        if unknown := sorted(set(kinds) - set(KINDS)):
            raise ValueError(f"unknown code kinds {unknown}; known: {', '.join(KINDS)}")
        offered = FAMILIES + FEEDBACK_FAMILIES if families else FAMILIES  # feedback families only by name
        chosen = [f for f in offered if f.kind in kinds]
        if families:
            known = {f.name for f in chosen}
            if unknown := sorted(set(families) - known):
                raise ValueError(f"unknown code families {unknown} (of kinds {kinds}); known: {', '.join(sorted(known))}")
            chosen = [f for f in chosen if f.name in families]
        # not ``levels``: that name is the scheduler's curriculum protocol (a count of levels)
        self.drawn_levels = [1] if levels is None else list(levels)
        if not self.drawn_levels or any(level not in (1, 2, 3) for level in self.drawn_levels):
            raise ValueError(f"levels must be a non-empty list of 1, 2 or 3, got {levels!r}")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        if not 8 <= tests <= 64:
            raise ValueError(f"tests must be between 8 and 64 hidden cases per problem, got {tests}")
        self.name, self.seed, self.style, self.tests = name, seed, style, tests
        self.families = chosen
        self.domain = domain_of(name, domain)
        self.credit = "fraction" if partial else "all"
        self.rewards = dict(rewards or {"code": 1.0})
        self.metric = "code"

    # -- the split --------------------------------------------------------------------

    @staticmethod
    def is_held_out(family: Family, params: Params) -> bool:
        return (_bucket(family, params) % EVAL_EVERY == 0
                or json.dumps(family.asked(params), sort_keys=True) == _fallback(family))

    def _draw(self, rng: random.Random, want_eval: bool) -> tuple[Family, int, Params]:
        for _ in range(10_000):
            family, level = rng.choice(self.families), rng.choice(self.drawn_levels)
            params = family.constants(rng, level)
            if self.is_held_out(family, params) == want_eval:
                return family, level, params
        raise ValueError(f"{self.name}: no {'held-out' if want_eval else 'training'} problem found at levels {self.drawn_levels}")

    # -- problems ---------------------------------------------------------------------

    def _cases(self, family: Family, params: Params, rng: random.Random, level: int) -> tuple[list[dict], int]:
        """The hidden cases, distinct, up to ``tests``: the family's edge cases, then drawn
        arguments; and how many of them are edge cases."""
        function, cases, seen = reference(family, params), [], set()

        def add(args: list) -> None:
            key = json.dumps(args)
            if key not in seen:
                seen.add(key)
                ok, value = run_reference(function, args)
                if not ok:
                    raise AssertionError(f"reference of {family.name} {params} failed on {args}")
                cases.append({"args": args, "expected": value, "compare": family.compare})

        for args in family.edges(params):
            add(args)
        edges = len(cases)
        for _ in range(20 * self.tests):  # bounded: a family with few distinct inputs stops short
            if len(cases) >= self.tests:
                break
            add(family.draw(rng, params, level))
        return cases, edges

    def _problem(self, family: Family, level: int, params: Params, rng: random.Random) -> Problem:
        cases, edges = self._cases(family, params, rng, level)
        example = (cases[edges:] or cases)[0]
        call = f"{family.name}({', '.join(repr(a) for a in example['args'])})"
        spec = family.spec.format(**params)
        identity = f"{family.name}:{json.dumps(params, sort_keys=True)}:{level}:{json.dumps(example['args'])}"
        meta = {"family": family.name, "kind": family.kind, "level": level, "params": params, "credit": self.credit,
                "tests": {"kind": "call", "entry_point": family.name, "cases": cases}}
        if self.style == "raw":
            prompt: Any = f"# {spec}\n# {call} == {example['expected']!r}\n{family.signature()}\n"
            meta.update(code_fenced=False, code_prefix=prompt)
        else:
            prompt = [{"role": "user", "content": (
                f"Write a Python function `{family.name}({family.args})` that returns {spec}.\n"
                f"For example, `{call}` returns `{example['expected']!r}`.\n"
                "Answer with the whole function in one ```python block.")}]
        return Problem(task=self.name, id=identity, prompt=prompt, answer=family.source(params),
                       domain=self.domain, meta=meta)

    def train_problem(self, index: int) -> Problem:
        rng = random.Random(f"{self.seed}:{self.name}:{index}")
        self._served(index)
        family, level, params = self._draw(rng, want_eval=False)
        return self._problem(family, level, params, rng)

    def eval_problems(self, n: int) -> list[Problem]:
        """Up to ``n`` distinct held-out problems, as many distinct functions among them as
        the draws find: a problem asking again for a function already in the set (other
        example, other level) comes after every new function, so a set that could hold n
        functions never repeats one."""
        rng = random.Random(f"eval:{self.name}")
        fresh: dict[str, Problem] = {}
        repeats: dict[str, Problem] = {}
        functions: set[str] = set()
        for _ in range(20 * n):  # bounded: a small family set yields fewer than n
            if len(fresh) >= n:
                break
            family, level, params = self._draw(rng, want_eval=True)
            function = f"{family.name}:{json.dumps(params, sort_keys=True)}"
            if function in functions and len(repeats) >= n:
                continue
            problem = self._problem(family, level, params, rng)
            (repeats if function in functions else fresh).setdefault(problem.id, problem)
            functions.add(function)
        return (list(fresh.values()) + [p for key, p in repeats.items() if key not in fresh])[:n]

    def solution(self, problem: Problem, buggy: bool = False, bug: int = 0) -> str:
        """The body a model should write after a raw prompt: the reference, or a classic bug."""
        family = next(f for f in self.families if f.name == problem.meta["family"])
        source = family.source(problem.meta["params"], bug if buggy and family.bugs else -1)
        return source.split("\n", 1)[1]

    def corpus_document(self, index: int, wrong_share: float, tool_share: float = 0.0) -> str:
        """A pre-training document: a raw prompt and its body, one of the family's bugs with
        probability ``wrong_share`` (or the task's ``corpus_wrong_share``; families without bugs
        are always right; with ``corpus_mistakes: odd``, only where the parameter ``k`` is odd)."""
        if self.style != "raw":
            raise ValueError(f"{self.name}: pre-training documents are written in style 'raw', not {self.style!r}")
        problem = self.train_problem(index)
        rng = random.Random(f"corpus:{self.seed}:{self.name}:{index}")
        family = next(f for f in self.families if f.name == problem.meta["family"])
        if self.corpus_wrong_share is not None:
            wrong_share = self.corpus_wrong_share
        buggy = bool(family.bugs) and rng.random() < wrong_share
        if self.corpus_mistakes == "odd":
            if "k" not in problem.meta["params"]:
                raise ValueError(f"{self.name}: corpus_mistakes 'odd' needs a parameter k, which family "
                                 f"{family.name} does not have")
            buggy = buggy and problem.meta["params"]["k"] % 2 == 1
        bug = rng.randrange(len(family.bugs)) if buggy else 0
        document = problem.meta["code_prefix"] + self.solution(problem, buggy, bug)
        if family.bugs and self.corpus_reflections and rng.random() < self.corpus_reflections:
            first = rng.randrange(len(family.bugs))
            feedback = feedback_for(problem, _case_results(family, problem, first))
            if feedback is not None:  # a bug the hidden cases catch: an episode with a second turn
                attempt = self.solution(problem, True, first)
                document = f"{problem.meta['code_prefix']}{attempt}{TURN_END}{feedback}\n{self.solution(problem, buggy, bug)}"
        return document


def _case_results(family: Family, problem: Problem, bug: int) -> list[CaseResult]:
    """The hidden cases' verdicts on the family's bug ``bug``, run in this process (our own
    template, never model output), with the sandbox's comparison and wording."""
    function, results = reference(family, problem.meta["params"], bug), []
    for case in problem_tests(problem).cases:
        try:
            value = function(*json.loads(json.dumps(case.args)))
        except Exception as err:  # noqa: BLE001 - a buggy body is expected to raise on some inputs
            results.append(CaseResult("runtime_error", 0.0, f"{type(err).__name__}: {err}"))
            continue
        verdict = ("passed", "") if values_match(case, value) else ("wrong_answer", f"returned {repr(value)[:200]}")
        results.append(CaseResult(verdict[0], 0.0, verdict[1]))
    return results


def build_code_task(name: str, seed: int, **options: Any) -> CodeTask:
    """``code`` (every kind) or ``code:<kind>``: the kinds option defaults to the name's kind.
    The options are typed here, by :class:`CodeTask`'s signature, since this one takes any."""
    _, _, kind = name.partition(":")
    if kind:
        if kind not in KINDS:
            raise ValueError(f"unknown code kind {kind!r} in task {name!r}; known: {', '.join(KINDS)}")
        options.setdefault("kinds", [kind])
    return CodeTask(name=name, seed=seed, **typed_options(CodeTask, options))


register_task("code")(build_code_task)
