"""``repo``: repositories with an issue to fix, generated (offline, seeded) or read from records.

Each problem is a small Python package of a few modules with its own tests (a
:class:`~tempering.tasks.repo_records.RepoInstance`) and an issue against it: a defect or a
requested change. The agent works in the repository (``env: repo``); the ``repo`` reward
grades its patch in a clean copy on the hidden tests that must turn from failing to passing
(``FAIL_TO_PASS``) and on the other modules' tests that must keep passing (``PASS_TO_PASS``).

Generated (``name: repo``, options ``families``, ``levels``): the families of
:mod:`tempering.tasks.repo_families_money`, :mod:`~tempering.tasks.repo_families_text` and
:mod:`~tempering.tasks.repo_families_words` (inventory, ledger, scheduler, converter,
tokenizer, config), at levels 1 (a one-line fix in one file), 2 (a fix whose obvious version, in a
shared helper, breaks another module: that naive patch is in ``meta["naive_patch"]``) and 3
(a change across two modules). The seed draws the family, the defect of the level, the
package's name and every constant and word of the modules and tests, so there are thousands
of distinct instances per family.

Read from records (``name: repo``, option ``path``): a JSONL or JSON file, or a folder of
them, one record a line in the fields of :mod:`tempering.tasks.repo_records` (SWE-bench's and
SWE-Gym's). A ``snapshot`` folder is read relative to the records file's folder (to ``path``
when it is a folder). A bad record is a :class:`~tempering.tasks.records.DatasetError` naming
the file, the line and the field, when the task is built; so is a reference ``patch`` that
does not apply, a test id that names no top-level test function of its file, and an
``instance_id`` given twice.

A problem's ``meta["repo"]`` is its instance as a JSON record (``RepoInstance.to_record``),
which the environment and the reward read back; ``meta`` also has ``family``, ``level`` and
``defect`` for generated instances. The prompt is the issue and the list of the repository's
files; the environment shows a file's text when asked. ``answer`` is the reference patch.

The held-out split: a generated instance is held out when the hash of what it is, apart from
its package's name (family, defect, constants, words), falls in the first of ``EVAL_EVERY``
buckets, so no held-out fix is trained on, under any name. For records, ``eval_fraction`` of
them by a hash of the problem statement, or all of ``eval_path``.

Not done here: repositories in other languages, or records whose tests need pytest to run
(fixtures, parametrized ids); the grader calls each test function itself.
"""

from __future__ import annotations

import inspect
import random
import zlib
from pathlib import Path
from typing import Any, Optional

from tempering.registry import typed_options
from tempering.tasks.base import StreamState
from tempering.tasks.records import DatasetError, read_records
from tempering.tasks.repo_corpus import Mistakes, corpus_env, episode_calls, render
from tempering.tasks.repo_families import Defect, RepoFamily, build_instance, find_tests, split_key
from tempering.tasks.repo_families_money import FAMILIES as MONEY
from tempering.tasks.repo_families_text import FAMILIES as TEXT
from tempering.tasks.repo_families_words import FAMILIES as WORDS
from tempering.tasks.repo_records import RecordError, RepoInstance, apply_patch, split_test_id
from tempering.types import Problem, domain_of

FAMILIES: tuple[RepoFamily, ...] = MONEY + TEXT + WORDS
FAMILY_BY_NAME = {family.name: family for family in FAMILIES}
LEVELS = (1, 2, 3)

EVAL_EVERY = 4
"""One instance in EVAL_EVERY, by a stable hash of :func:`~tempering.tasks.repo_families.split_key`, is held out."""

REWARDS = {"repo": 1.0}


def render_prompt(instance: RepoInstance, style: str) -> Any:
    """The issue and the repository's file list, as text (``raw``) or one chat message."""
    listing = "\n".join(f"  {path}" for path in sorted(instance.files))
    text = f"{instance.problem_statement}\n\nThe repository's files:\n{listing}\n"
    return text if style == "raw" else [{"role": "user", "content": text}]


def _problem(task: str, domain: str, style: str, instance: RepoInstance, **meta: Any) -> Problem:
    return Problem(task=task, id=instance.instance_id, prompt=render_prompt(instance, style),
                   answer=instance.patch or "", domain=domain, meta={**meta, "repo": instance.to_record()})


def check_tests(instance: RepoInstance) -> None:
    """Refuse a test id that names no top-level ``def name():`` of its file: the grader calls
    each test function itself, without arguments (so not a method, fixture user or async test)."""
    known = {**instance.files, **instance.hidden_tests}
    for field, ids in (("FAIL_TO_PASS", instance.FAIL_TO_PASS), ("PASS_TO_PASS", instance.PASS_TO_PASS)):
        for test_id in ids:
            path, name = split_test_id(test_id)
            if name not in find_tests(known[path]):
                raise RecordError(f"{field}: {test_id!r} names no top-level 'def {name}():' of {path}")


def _check_style(style: str) -> None:
    if style not in ("raw", "chat"):
        raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")


class RepoTask(StreamState):
    """Generated repositories of ``families`` (all by default) at ``levels`` (1..3, one drawn
    per problem; all three by default).

    Pre-training transcripts (:mod:`tempering.tasks.repo_corpus`, style ``raw``):
    ``corpus_env``: the options of ``env: repo`` the transcripts are played with (the training
    config's, so that the model learns the very text its episodes show; empty = the defaults);
    ``corpus_naive_share``: the share of level-2 transcripts whose fix is the naive one that
    breaks another module; ``corpus_untested_share``: the share submitted without a test run;
    ``corpus_wrong_span_share``: the share whose replace quotes text the file does not hold
    (nothing changes). 0 = no such transcript.
    """

    def __init__(self, name: str, seed: int, families: Optional[list[str]] = None, levels: Optional[list[int]] = None,
                 style: str = "chat", domain: str = "", rewards: Optional[dict[str, float]] = None,
                 corpus_env: Optional[dict[str, Any]] = None, corpus_naive_share: float = 0.5,
                 corpus_untested_share: float = 0.0, corpus_wrong_span_share: float = 0.0):
        if unknown := sorted(set(families or ()) - set(FAMILY_BY_NAME)):
            raise ValueError(f"unknown repo families {unknown}; known: {', '.join(FAMILY_BY_NAME)}")
        # not ``levels``: that name is the scheduler's curriculum protocol (a count of levels)
        self.drawn_levels = list(LEVELS) if levels is None else list(levels)
        if not self.drawn_levels or any(level not in LEVELS for level in self.drawn_levels):
            raise ValueError(f"levels must be a non-empty list of 1, 2 or 3, got {levels!r}")
        _check_style(style)
        self.name, self.seed, self.style = name, seed, style
        self.families = [FAMILY_BY_NAME[f] for f in families] if families else list(FAMILIES)
        self.domain = domain_of(name, domain)
        self.rewards = dict(rewards or REWARDS)
        self.metric = "repo"
        self.mistakes = Mistakes(corpus_naive_share, corpus_untested_share, corpus_wrong_span_share)
        self.mistakes.check()
        self.corpus_env_options = dict(corpus_env or {})
        self._corpus_env: Optional[Any] = None

    @staticmethod
    def is_held_out(key: str) -> bool:
        return zlib.crc32(key.encode()) % EVAL_EVERY == 0

    def _draw(self, rng: random.Random, want_eval: bool) -> tuple[RepoFamily, Defect, dict[str, Any]]:
        for _ in range(10_000):
            level = rng.choice(self.drawn_levels)
            family = rng.choice(self.families)
            defect = rng.choice([d for d in family.defects if d.level == level])
            params = {"pkg": rng.choice(family.packages), **family.draw(rng)}
            if self.is_held_out(split_key(family, defect, params)) == want_eval:
                return family, defect, params
        raise ValueError(f"{self.name}: no {'held-out' if want_eval else 'training'} instance found")

    def _problem(self, family: RepoFamily, defect: Defect, params: dict[str, Any]) -> Problem:
        instance = build_instance(family, defect, params)
        return _problem(self.name, self.domain, self.style, instance,
                        family=family.name, level=defect.level, defect=defect.name)

    def train_problem(self, index: int) -> Problem:
        rng = random.Random(f"{self.seed}:{self.name}:{index}")
        self._served(index)
        return self._problem(*self._draw(rng, want_eval=False))

    def eval_problems(self, n: int) -> list[Problem]:
        """Up to ``n`` distinct held-out instances, the same for every seed."""
        rng = random.Random(f"eval:{self.name}")
        found: dict[str, Problem] = {}
        for _ in range(20 * n):  # bounded: a narrow choice of families and levels may yield fewer
            if len(found) >= n:
                break
            problem = self._problem(*self._draw(rng, want_eval=True))
            found.setdefault(problem.id, problem)
        return list(found.values())

    def corpus_document(self, index: int, wrong_share: float = 0.0, tool_share: float = 0.0) -> str:
        """Training problem ``index`` as an episode transcript (:mod:`tempering.tasks.repo_corpus`),
        its mistakes drawn at the task's ``corpus_*_share`` options; the corpus's ``wrong_share``
        and ``tool_share`` are not read."""
        if self.style != "raw":
            raise ValueError(f"{self.name}: pre-training transcripts are written in style 'raw', not {self.style!r}")
        if self._corpus_env is None:
            self._corpus_env = corpus_env(self.corpus_env_options)
        problem = self.train_problem(index)
        calls = episode_calls(problem, random.Random(f"corpus:{self.seed}:{self.name}:{index}"), self.mistakes)
        return render(self._corpus_env, problem, calls)

    def _extra_state(self) -> dict[str, Any]:
        return {"families": [f.name for f in self.families], "drawn_levels": self.drawn_levels}

    def _load_extra(self, state: dict[str, Any]) -> None:
        for key, value in self._extra_state().items():
            if key in state and state[key] != value:
                raise ValueError(f"{self.name}: the saved stream drew {key} {state[key]}, this task {value}; "
                                 "resume with the run's own options")


class RepoDatasetTask(StreamState):
    """Repository records from a user's file or folder (see the module docstring)."""

    def __init__(self, name: str, seed: int, path: str, eval_fraction: float = 0.1, eval_path: Optional[str] = None,
                 style: str = "chat", domain: str = "", rewards: Optional[dict[str, float]] = None,
                 split: str = "train"):
        if not 0 <= eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        _check_style(style)
        self.name, self.seed, self.style = name, seed, style
        self.domain = domain_of(name, domain)
        self.rewards = dict(rewards or REWARDS)
        self.metric = "repo"
        records = self._load(path, split)
        if eval_path:
            self._train, self._eval = records, self._load(eval_path, split)
        else:
            cut = int(eval_fraction * 2**32)
            held_out = [zlib.crc32(p.meta["repo"]["problem_statement"].encode()) < cut for p in records]
            self._train = [p for p, out in zip(records, held_out) if not out]
            self._eval = [p for p, out in zip(records, held_out) if out]
        if not self._train:
            raise DatasetError(f"{path}: no training records left after the held-out split (eval_fraction={eval_fraction})")
        self.size = len(self._train)
        self._order: tuple[int, list[int]] = (-1, [])

    def _load(self, path: str, split: str) -> list[Problem]:
        base = Path(path) if Path(path).is_dir() else Path(path).parent
        problems, seen = [], {}
        for where, record in read_records(path, split):
            try:
                instance = RepoInstance.from_record(record, base)
                check_tests(instance)
                if instance.patch is not None:
                    apply_patch(instance.files, instance.patch)
            except RecordError as exc:
                raise DatasetError(f"{where}: {exc}") from None
            if instance.instance_id in seen:
                raise DatasetError(f"{where}: field 'instance_id': {instance.instance_id!r} is also the id of the "
                                   f"record at {seen[instance.instance_id]}; each instance needs its own")
            seen[instance.instance_id] = where
            problems.append(_problem(self.name, self.domain, self.style, instance, record=where))
        if not problems:
            raise DatasetError(f"{path}: no records in it")
        return problems

    def train_problem(self, index: int) -> Problem:
        epoch, position = divmod(index, self.size)
        self._served(index)
        if self._order[0] != epoch:
            order = list(range(self.size))
            random.Random(f"{self.seed}:{self.name}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._train[self._order[1][position]]

    def eval_problems(self, n: int) -> list[Problem]:
        return self._eval[:n]

    def _extra_state(self) -> dict[str, Any]:
        return {"size": self.size}

    def _load_extra(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:  # each epoch's order is a shuffle of this many records
            raise ValueError(f"{self.name}: the saved stream walked {state['size']} training records, the file now "
                             f"has {self.size}; the stream cannot continue where it stopped")


def build_repo_task(name: str, seed: int, **options: Any) -> RepoTask | RepoDatasetTask:
    """``repo``: generated instances, or with ``path`` the records of a file or folder. The
    options are typed here, by the signature of the class they are for."""
    if "path" not in options:
        return RepoTask(name=name, seed=seed, **typed_options(RepoTask, _known(RepoTask, options, "")))
    return RepoDatasetTask(name=name, seed=seed, **typed_options(RepoDatasetTask, _known(RepoDatasetTask, options,
                                                                                          " with options.path")))


def _known(cls: type, options: dict[str, Any], context: str) -> dict[str, Any]:
    """``options``, refused naming the first one ``cls`` does not take."""
    taken = set(inspect.signature(cls).parameters) - {"name", "seed"}
    if unknown := sorted(set(options) - taken):
        raise ValueError(f"options.{unknown[0]}: not an option of the repo task{context}; "
                         f"its options: {', '.join(sorted(taken))}")
    return options

