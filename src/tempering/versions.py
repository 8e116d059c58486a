"""Policy versions: which weights each round of an asynchronous run samples with, and how far
behind the learner each rollout is (:func:`fresh_groups`, :func:`staleness_record`).

**The order of an asynchronous run** (:class:`Timeline`).

In async mode (``tempering.pipeline``) a sampling thread makes rounds while the learner
trains. Left to the threads' timing, where new weights land (before which round, after which
decoding step of a partial rollout) and when the scheduler is asked for problems would change
from run to run, and a run resumed from a checkpoint could not repeat the one that was
killed. Here every such decision is a function of the learner's own sequence of events,
which is the same in every run with the same seed: it asks for rounds in order (0, 1, 2, ...)
and publishes its weights once after each step, so between two of its asks there is at most
one publish.

- Round ``r``'s problems are drawn when the learner takes round ``r - buffer_rounds``, in the
  learner's thread (:meth:`Timeline.plan`); the first ``buffer_rounds`` rounds' at the start.
- Round ``r`` starts with the weights the learner had when it asked for round
  ``r - buffer_rounds`` (or newer ones the sampler already holds from the round before).
  This is what the sampler gets anyway when it keeps up: it may start round ``r`` only once
  that round was taken.
- With partial rollouts the round takes new weights once, after ``chunk`` decoding steps (the
  sampler's ``updates`` asks after every step; with several batches in a round, the steps of
  all count): there the sampler waits until the learner either publishes the step that took
  round ``r - buffer_rounds`` or asks for round ``r - buffer_rounds + 1`` (a step that takes
  several rounds: dynamic sampling, rounds dropped as stale), and takes the weights published
  between those two asks, if any. Neither wait can hang: the learner's step needs no round
  later than the ones made before ``r``, and a checkpoint is written after the step's publish.

What it costs: a sampler that is ahead waits at the chunk's end for the learner's step (the
tokens after it are then fresher, one version behind the learner that takes them with
``buffer_rounds`` 1), and a round holds tokens of two versions at most. A round that ends
before ``chunk`` tokens takes no new weights. Published weights are kept until the sampler
has moved past them (``buffer_rounds`` + 1 copies at most), and a checkpoint holds those a
later round may still start from, besides the learner's own.

Not covered: the rollout worker's restarts on Ray (a restarted worker's stream is reseeded),
a round of a paused task drawn again from the others, outage rounds sampled again after a
wait, and servers: a server killed mid-run, or one that answers differently for the same
seeded request, changes the rounds (see docs/scale-out.md).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from tempering.types import Group, Problem

def fresh_groups(groups: list[Group], learner_version: int,
                 max_staleness: int) -> tuple[list[Group], dict[str, int]]:
    """The groups with only their rollouts at most ``max_staleness`` versions behind
    ``learner_version``, and per task how many rollouts were dropped as too stale.

    Staleness belongs to each rollout (the version that sampled it), not to the round that
    brought it. A group keeps its fresh rollouts when some are too stale: its advantages are
    then computed among those alone, so a reward earned by a policy further back than
    ``max_staleness`` never enters the baseline of the rollouts trained on (the group is
    smaller, its baseline noisier, but unbiased for the kept ones, as after a grader's drop).
    A group is dropped whole only when every rollout of it is too stale. Groups, and the
    rollouts within them, keep their order.

    >>> from tempering.types import Problem, Rollout
    >>> p = Problem(task="t", id="0", prompt="", answer="")
    >>> group = Group(p, [Rollout(p, [], [], [], "", "stop", v) for v in (3, 1, 2)])
    >>> kept, stale = fresh_groups([group], learner_version=3, max_staleness=1)
    >>> [r.policy_version for r in kept[0].rollouts], stale
    ([3, 2], {'t': 1})
    """
    kept: list[Group] = []
    stale: dict[str, int] = {}
    for group in groups:
        fresh = [r for r in group.rollouts if learner_version - r.policy_version <= max_staleness]
        if len(fresh) < len(group.rollouts):
            task = group.problem.task
            stale[task] = stale.get(task, 0) + len(group.rollouts) - len(fresh)
        if fresh or not group.rollouts:
            kept.append(group if len(fresh) == len(group.rollouts) else Group(group.problem, fresh))
    return kept, stale


def tokens(groups: list[Group]) -> int:
    """Completion tokens of the groups' rollouts."""
    return sum(len(r.completion_ids) for g in groups for r in g.rollouts)


def staleness_record(groups: list[Group], learner_version: int, max_staleness: int) -> dict[str, float]:
    """How far behind the learner the rollouts of a step's batch were sampled:
    ``staleness/mean``, ``staleness/max`` and ``staleness/hist/<k>``, the rollouts exactly
    ``k`` versions behind (each by its oldest token, its ``policy_version``), for every k from
    0 to ``max_staleness`` (zeros included, so each is a series over the run); and
    ``staleness/token_mean``, the same mean over completion tokens, each by its own version
    (below the rollouts' mean only with partial rollouts, and by how much they freshen).

    >>> from tempering.types import Problem, Rollout
    >>> p = Problem(task="t", id="0", prompt="", answer="")
    >>> record = staleness_record([Group(p, [Rollout(p, [], [], [], "", "stop", v) for v in (4, 3, 4)])], 4, 1)
    >>> record["staleness/max"], record["staleness/hist/0"], record["staleness/hist/1"]
    (1, 2, 1)
    """
    behind = [learner_version - r.policy_version for g in groups for r in g.rollouts]
    tokens = [learner_version - v for g in groups for r in g.rollouts for v in r.token_versions]
    record: dict[str, float] = {f"staleness/hist/{k}": 0 for k in range(max_staleness + 1)}
    for k in behind:
        record[f"staleness/hist/{k}"] = record.get(f"staleness/hist/{k}", 0) + 1
    record["staleness/mean"] = sum(behind) / len(behind) if behind else 0.0
    record["staleness/max"] = max(behind, default=0)
    record["staleness/token_mean"] = sum(tokens) / len(tokens) if tokens else 0.0
    return record


Weights = dict
"""A model's state dict, as the learner publishes it."""


class Timeline:
    """The learner's asks and publishes, and what each round gets from them (see the module
    docstring). Plain bookkeeping: the pipeline holds its lock around every call."""

    def __init__(self, buffer_rounds: int, chunk: int):
        self.buffer_rounds, self.chunk = buffer_rounds, chunk
        self.plans: deque[list[Problem]] = deque()
        """Problems drawn for rounds not yet started."""
        self.drawn = self.taken = 0
        """Rounds whose problems were drawn; rounds the learner took."""
        self.asked = {t: 0 for t in range(-buffer_rounds, 0)}
        """Round -> the learner's version when it asked for it (the first rounds: the initial one)."""
        self.published: dict[int, Weights] = {}
        """Version -> weights the sampler may still take."""
        self.worker_version, self.loaded = 0, False
        """The version the rollout worker holds; ``loaded`` False: unknown (a fresh worker, a resumed run)."""
        self.round = self.steps = 0
        """The round being sampled and the decoding steps it has asked about."""

    def plan(self, draw: Callable[[], list[Problem]]) -> None:
        """Draw the problems of every round up to ``buffer_rounds`` past those taken."""
        while self.drawn < self.taken + self.buffer_rounds:
            self.plans.append(draw())
            self.drawn += 1

    def ask(self, learner_version: int) -> None:
        """The learner asks for its next round."""
        self.asked[self.taken] = learner_version

    def took(self) -> None:
        """The learner took the round it asked for; asks no later round needs are forgotten."""
        self.taken += 1
        for old in [t for t in self.asked if t < self.taken - 2 * self.buffer_rounds]:
            del self.asked[old]

    def hold(self, version: int) -> Optional[tuple[Weights, int]]:
        """Make ``version`` (after a checkpoint of before repeatable runs: the oldest published
        one not below it) the worker's, forgetting older published weights: ``(weights, version)``
        to load, or None when the worker holds them, or when nothing was published (the worker
        samples with the weights it was built with)."""
        newer = [v for v in self.published if v >= version]
        if not newer or (self.loaded and version == self.worker_version):
            return None
        version = min(newer)
        for old in [v for v in self.published if v < version]:
            del self.published[old]
        self.worker_version, self.loaded = version, True
        return self.published[version], version

    def start(self, index: int) -> tuple[Optional[tuple[Weights, int]], int]:
        """Round ``index`` begins: what to load (:meth:`hold`) and the version it starts with."""
        version = max(self.asked[index - self.buffer_rounds], self.worker_version)
        self.round, self.steps = index, 0
        return self.hold(version), version

    def at_chunk_end(self, steps: int) -> bool:
        """The sampler finished ``steps`` more decoding steps: whether they end the chunk new
        weights may follow."""
        self.steps += steps
        return self.steps - steps < self.chunk <= self.steps

    def decided(self, learner_version: int) -> bool:
        """Whether the learner has published after taking round ``round - buffer_rounds``, or
        asked for the round after it (what the swap at the chunk's end waits for)."""
        base = self.round - self.buffer_rounds
        return base + 1 in self.asked or learner_version > self.asked[base]

    def swap(self, learner_version: int) -> Optional[tuple[Weights, int]]:
        """Once :meth:`decided`: the weights published between the learner's two asks, to load
        (None when there were none, or the worker holds them)."""
        version = self.asked.get(self.round - self.buffer_rounds + 1, learner_version)
        return self.hold(version) if version > self.worker_version else None

    def state_dict(self, rounds: int, learner_version: int) -> dict:
        """What a resumed run needs, between rounds (``rounds`` made): the learner's own weights
        are left out (they are published again when it resumes)."""
        floor = max(self.worker_version, self.asked.get(rounds - self.buffer_rounds, learner_version))
        return {"plans": list(self.plans), "drawn": self.drawn, "taken": self.taken, "asked": dict(self.asked),
                "worker_version": self.worker_version,
                "published": {v: w for v, w in self.published.items() if floor <= v < learner_version}}

    def load_state_dict(self, state: Optional[dict], rounds: int, buffered: int) -> None:
        """Restore :meth:`state_dict`; None (a checkpoint of before): the next rounds start with
        the learner's weights."""
        self.loaded = False
        if state is None:
            self.drawn, self.taken = rounds, rounds - buffered
            self.asked = {t: -1 for t in range(self.taken - 2 * self.buffer_rounds, self.taken)}
            self.worker_version = -1
            return
        self.plans, self.asked = deque(state["plans"]), dict(state["asked"])
        self.drawn, self.taken = state["drawn"], state["taken"]
        self.published.update(state["published"])
        self.worker_version = state["worker_version"]
