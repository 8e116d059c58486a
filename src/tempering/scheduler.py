"""Which problems to train on next: a weighted mixture over tasks that can adapt as the model learns.

Each task's training stream is indexable (``task.train_problem(i)``), so the mixture's
state is one cursor per task, its random generator, and the per-task statistics the
adaptive strategies read: ``state_dict()`` captures all of it and a resumed run draws
exactly the same problems.

A task is a domain here: the mixture keeps statistics, weights and curricula per task name
(a reasoning-gym type, ``add``, a user dataset). The loop feeds back what it sampled with
:meth:`Mixture.observe` (every sampled group, dropped ones included, so success rates are the
sampler's) and closes a step with :meth:`Mixture.update`, which returns per-task metrics.

Weight strategies are plain functions in :data:`STRATEGIES` that map the configured weights and
the statistics to new weights:

- ``static``: the configured weights (the default; draws exactly what it always drew);
- ``temperature``: weight x dataset size ** (1 / T), the multilingual-pretraining recipe;
  tasks without a ``size`` (procedural ones are unbounded) count as ``UNBOUNDED_SIZE``;
- ``learnability``: prefer tasks whose groups vary in success, by the mean within-group
  variance of success (p(1 - p) of each group's rate p for 0/1 success): a group whose
  rollouts all succeed or all fail has no reward variance and teaches nothing. Per group, not
  per task: a task with some always-solved and some never-solved problems has a task-level
  rate near 1/2 and yet no signal;
- ``learning_progress``: prefer tasks whose success rate is changing, by |fast EMA - slow EMA|;
- ``learnability_per_cost``: learnability divided by what a rollout of the task costs in
  seconds (its completion tokens x the sampler's seconds per token, plus its reward seconds,
  each learned as the run goes: :meth:`Mixture.fold_costs`), so draws go where signal per
  second is highest and the seconds spent on each task follow its learnability.

Adaptive strategies mix in ``floor`` of the static weights, so no task starves and a task
whose rate later moves is noticed. A task the mixture has not yet seen scores as the best
seen so far (optimism), so every task is tried early.

Learnability from few groups is noise: a task drawn once a step has one group's variance a
step, and with 0/1 success most single groups are all right or all wrong. Averaged per step
(``fast_rate`` on the newest), one such group takes away a third of its score, its share falls
to the floor, it is drawn less, and a task whose few right answers are exactly what RL needs
stays there (the generalist's ``range_sum``: right on half its problems, every group all right
or all wrong, fixed by static weights and starved by this average). With ``pooled_prior`` k >
0 the learnability strategies read instead each task's variance averaged over its groups,
every step's evidence fading at ``slow_rate``, and pulled towards the mean over all tasks by k
groups' worth: a task with little recent evidence scores near the average and is drawn enough
to be measured, and one with much evidence scores by it.

Curricula: a task with ``levels`` (a count) and a settable ``level`` moves up one level when
its success rate passes ``promote_at`` over at least ``min_samples`` rollouts at the level.
A curriculum over lengths (a task whose ``length_tokens`` follows its level) has the length
logged beside the level.

Balance inside a batch (used by the loop, optional): :func:`cap_domain_tokens` drops groups of
a domain holding more than a set share of the batch's completion tokens, and
:func:`domain_token_weights_B` scales advantages so that under a token-mean loss each domain's
share of the loss's weight follows its share of rollouts (what the mixture drew), not its share
of tokens. That is not its share of the gradient norm, which the learner measures
(``Learner.grad_shares``, ``domain/<task>/grad_share``): where a completion's token gradients
add up incoherently, a domain's gradient norm grows as the square root of its tokens, and a
domain of 10x longer completions ends below its drawn share (``tests/unit/test_grad_share.py``).
:func:`balance_grad_weights` closes that loop: from measured shares it moves a per-domain
multiplier of the loss (:attr:`Mixture.grad_weights`, part of ``state_dict()``) towards each
domain holding its drawn share of the gradient norm (``learner.grad_balance_rate``).
Reward scale is the ``grpo_domain`` advantage estimator's part.

Pauses: a task whose grader is down while the others score is *paused* by the pipeline
(:meth:`Mixture.pause`): it gets no draws, its weight going to the others in proportion, until
a probe of its grader succeeds (:meth:`Mixture.readmit`). Each pause keeps the sampling round
at which it is probed next (:class:`Pause`); the pipeline decides the backoff. Rounds, not
seconds, so that a resumed run probes at exactly the rounds the uninterrupted one would. The
paused set and its clocks are part of ``state_dict()``.

Not done here: knowing a task's cost before it is drawn (it is measured as the run goes),
demoting a level.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from tempering.registry import add
from tempering.tasks import Task
from tempering.types import Group, Problem


@dataclass
class TaskStats:
    """What the mixture knows of one task: exponential averages of its success rate, counts."""

    fast: float = 0.0
    """Success rate, exponential average over recent steps (weight ``fast_rate`` on the newest)."""
    slow: float = 0.0
    """The same with ``slow_rate``: the learning-progress baseline."""
    spread: float = 0.0
    """Mean within-group variance of success, averaged like ``fast``: the learnability score."""
    spread_sum: float = 0.0
    """Within-group variances of success summed over the task's groups, older steps fading at
    ``slow_rate`` a step (drawn or not): ``pooled_prior``'s evidence."""
    spread_groups: float = 0.0
    """The groups of ``spread_sum``, fading the same way."""
    tokens: float = 0.0
    """Completion tokens per rollout, averaged like ``fast``."""
    reward_s: float = 0.0
    """Reward seconds per rollout (``Rollout.reward_s``), averaged like ``fast``."""
    cost_s: float = 0.0
    """Seconds per rollout: ``tokens`` x the mixture's seconds per generated token + ``reward_s``
    (:meth:`Mixture.fold_costs`); 0 = not measured yet."""
    seen: int = 0
    """Rollouts observed at the current level."""
    groups: int = 0
    """Groups observed, all levels."""
    dropped: int = 0
    """Groups without reward variance (no signal for group-relative advantages), all levels."""
    level: int = 0


@dataclass(kw_only=True)
class Settings:
    """How an adaptive mixture reads its statistics (see the module docstring); every field
    is required (``tempering.build.scheduler_settings`` fills them from the config)."""

    floor: float
    """Share of the static weights mixed into adaptive weights; 1 = static, 0 = no exploration."""
    temperature: float
    """For ``temperature``: 1 = proportional to size, larger = flatter."""
    fast_rate: float
    slow_rate: float
    promote_at: float
    """Curricula: success rate above which a task moves up a level; > 1 = never."""
    min_samples: int
    """Curricula: rollouts at a level before it may be left."""
    pooled_prior: float
    """Learnability: groups' worth of the mean over all tasks in each task's score; 0 = the
    per-step average ``spread``."""


@dataclass
class Pause:
    """A task the mixture does not draw from while its grader is down, and when to probe it."""

    since: int
    """The sampling round (the pipeline's count of rounds made before it) that paused it."""
    probe_at: int
    """The round at whose start its grader is probed next."""
    probes: int = 0
    """Probes that failed since the pause: the backoff's exponent."""


UNBOUNDED_SIZE = 10_000.0
"""For ``temperature``: the size assumed for tasks without one."""


Strategy = Callable[[Sequence[Task], Sequence[float], Sequence[TaskStats], Settings], list[float]]
STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str) -> Callable[[Strategy], Strategy]:
    return lambda fn: add(STRATEGIES, "scheduler strategy", name, fn)


def _normalized(values: Sequence[float]) -> list[float]:
    total = sum(values)
    return [v / total for v in values] if total > 0 else [0.0] * len(values)


def _with_floor(base: Sequence[float], scores: Sequence[float], floor: float) -> list[float]:
    """``floor`` of the base shares plus the rest by score x base; all base if no score is positive."""
    base_p = _normalized(base)
    scored = _normalized([s * b for s, b in zip(scores, base)])
    if not any(scored):
        return base_p
    return [floor * b + (1 - floor) * s for b, s in zip(base_p, scored)]


def _optimistic(scores: list[float], stats: Sequence[TaskStats]) -> list[float]:
    """Scores with every unseen task raised to the best seen score (or 1 if none is seen)."""
    best = max((s for s, st in zip(scores, stats) if st.seen), default=1.0) or 1.0
    return [s if st.seen else best for s, st in zip(scores, stats)]


@register_strategy("static")
def static(tasks: Sequence[Task], base: Sequence[float], stats: Sequence[TaskStats], settings: Settings) -> list[float]:
    """The configured weights, unchanged."""
    return list(base)


@register_strategy("temperature")
def temperature(tasks: Sequence[Task], base: Sequence[float], stats: Sequence[TaskStats],
                settings: Settings) -> list[float]:
    """Weight x size ** (1/T): large datasets get more, but less than in proportion.

    >>> from tempering.build import scheduler_settings
    >>> from tempering.config import SchedulerConfig
    >>> class T: size = 100
    >>> class U: size = 1
    >>> settings = scheduler_settings(SchedulerConfig(temperature=2.0))
    >>> [round(w, 3) for w in temperature([T(), U()], [1, 1], [], settings)]
    [0.909, 0.091]
    """
    sizes = [float(getattr(task, "size", None) or UNBOUNDED_SIZE) for task in tasks]
    return _normalized([b * s ** (1 / settings.temperature) for b, s in zip(base, sizes)])


def learnability_scores(stats: Sequence[TaskStats], settings: Settings) -> list[float]:
    """Each task's within-group success variance: its per-step average, or with ``pooled_prior``
    k its groups' mean shrunk towards all tasks' (module docstring).

    >>> from tempering.build import scheduler_settings
    >>> from tempering.config import SchedulerConfig
    >>> often = TaskStats(spread=0.0, spread_sum=4.0, spread_groups=40.0, seen=320)
    >>> rarely = TaskStats(spread=0.0, spread_sum=0.0, spread_groups=2.0, seen=16)
    >>> [round(x, 4) for x in learnability_scores([often, rarely], scheduler_settings(SchedulerConfig(pooled_prior=8)))]
    [0.0992, 0.0762]
    >>> learnability_scores([often, rarely], scheduler_settings(SchedulerConfig()))
    [0.0, 0.0]
    """
    k = settings.pooled_prior
    if k <= 0:
        return [st.spread for st in stats]
    groups = sum(st.spread_groups for st in stats)
    pooled = sum(st.spread_sum for st in stats) / groups if groups > 0 else 0.0
    return [(st.spread_sum + k * pooled) / (st.spread_groups + k) for st in stats]


@register_strategy("learnability")
def learnability(tasks: Sequence[Task], base: Sequence[float], stats: Sequence[TaskStats],
                 settings: Settings) -> list[float]:
    """Each task's recent within-group success variance, with the exploration floor."""
    scores = _optimistic(learnability_scores(stats, settings), stats)
    return _with_floor(base, scores, settings.floor)


@register_strategy("learning_progress")
def learning_progress(tasks: Sequence[Task], base: Sequence[float], stats: Sequence[TaskStats],
                      settings: Settings) -> list[float]:
    """|fast - slow| success averages: where the model's skill is moving, either way."""
    scores = _optimistic([abs(st.fast - st.slow) for st in stats], stats)
    return _with_floor(base, scores, settings.floor)


MIN_COST_S = 1e-6
"""For ``learnability_per_cost``: the least a rollout is taken to cost (a free one is not
infinitely good)."""


@register_strategy("learnability_per_cost")
def learnability_per_cost(tasks: Sequence[Task], base: Sequence[float], stats: Sequence[TaskStats],
                          settings: Settings) -> list[float]:
    """Learnability per second: each task's within-group success variance divided by what one
    of its rollouts costs (``cost_s``), with the exploration floor. Draws then follow signal per
    second, so the seconds spent on each task follow its learnability: a task 10x as expensive
    as another with the same learnability gets 1/10 of its draws beyond the floor. A task whose
    cost is not measured yet scores as the best seen (optimism).

    >>> from tempering.build import scheduler_settings
    >>> from tempering.config import SchedulerConfig
    >>> cheap, dear = TaskStats(spread=0.2, seen=8, cost_s=1.0), TaskStats(spread=0.2, seen=8, cost_s=10.0)
    >>> settings = scheduler_settings(SchedulerConfig(floor=0.1))
    >>> [round(w, 4) for w in learnability_per_cost([None, None], [1, 1], [cheap, dear], settings)]
    [0.8682, 0.1318]
    """
    known = [st.seen > 0 and st.cost_s > 0 for st in stats]
    spreads = learnability_scores(stats, settings)
    scores = [spread / max(st.cost_s, MIN_COST_S) if k else 0.0 for st, spread, k in zip(stats, spreads, known)]
    best = max((score for score, k in zip(scores, known) if k), default=1.0) or 1.0
    return _with_floor(base, [score if k else best for score, k in zip(scores, known)], settings.floor)


class Mixture:
    """Draws each problem's task with probability proportional to the strategy's weights."""

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], seed: int,
                 strategy: str | Strategy, settings: Settings):
        if len(tasks) != len(weights):
            raise ValueError("one weight per task is needed")
        if not any(w > 0 for w in weights):
            raise ValueError("at least one task needs a positive training weight")
        if isinstance(strategy, str) and strategy not in STRATEGIES:
            raise ValueError(f"unknown scheduler strategy {strategy!r}; known: {', '.join(sorted(STRATEGIES))}")
        self.tasks = list(tasks)
        self.base = list(weights)
        self.strategy = STRATEGIES[strategy] if isinstance(strategy, str) else strategy
        self.settings = settings
        self.cursors = {task.name: 0 for task in tasks}
        self.stats = {task.name: TaskStats(level=getattr(task, "level", 0)) for task in tasks}
        self._pending: dict[str, dict] = {}
        self.seconds_per_token = 0.0
        """Sampling seconds per generated token, averaged like ``fast``: the cost model's rate."""
        self._sampling_s = 0.0
        self.paused: dict[str, Pause] = {}
        self.pauses: Counter = Counter()
        """Times each task was paused, over the run."""
        self.rng = random.Random(seed)
        self.weights = self._weights()
        self.grad_weights: dict[str, float] = {}
        """Each task's multiplier of its rows' loss (1 for a task not in it), from :func:`balance_grad_weights`."""

    def _weights(self) -> list[float]:
        weights = self.strategy(self.tasks, self.base, [self.stats[t.name] for t in self.tasks], self.settings)
        # a weight of 0 in the config means evaluate-only: no strategy may train on it
        return self._without_paused([w if b > 0 else 0.0 for w, b in zip(weights, self.base)])

    def next_problems(self, n: int) -> list[Problem]:
        chosen = self.rng.choices(self.tasks, weights=self.weights, k=n)
        problems = []
        for task in chosen:
            problems.append(task.train_problem(self.cursors[task.name]))
            self.cursors[task.name] += 1
        return problems

    def observe(self, groups: Sequence[Group]) -> None:
        """Record the success (the task's metric, 0..1) of every rollout of sampled groups.

        Call it on every sampled group, including those dynamic sampling drops: the
        strategies need the sampler's success rate, and the drop count is per task.
        """
        by_name = {t.name: t for t in self.tasks}
        for group in groups:
            task = by_name.get(group.problem.task)
            if task is None or not group.rollouts:
                continue
            pending = self._pending.setdefault(task.name, {"success": [], "spread": [], "reward": 0.0, "tokens": 0,
                                                           "reward_s": 0.0})
            pending["reward_s"] += sum(r.reward_s for r in group.rollouts)
            success = [r.reward_components.get(task.metric, 0.0) for r in group.rollouts]
            mean = sum(success) / len(success)
            pending["success"] += success
            pending["spread"].append(sum((x - mean) ** 2 for x in success) / len(success))
            pending["reward"] += sum(r.reward for r in group.rollouts)
            pending["tokens"] += sum(len(r.completion_ids) for r in group.rollouts)
            stats = self.stats[task.name]
            stats.groups += 1
            stats.dropped += len({r.reward for r in group.rollouts}) == 1

    def observe_sampling(self, seconds: float) -> None:
        """Add a round's sampling seconds (the rollout worker's, all its groups together): with
        the completion tokens :meth:`observe` counts in the same step they give the cost model's
        seconds per generated token."""
        self._sampling_s += seconds

    def fold_costs(self) -> dict[str, float]:
        """Fold the step's costs into the statistics (:meth:`update` calls it first) and return
        the step's shares and estimates: ``domain/<task>/draw_share``, ``token_share`` and
        ``reward_time_share`` (the task's part of the rollouts, completion tokens and reward
        seconds sampled this step; 0 when it was not drawn), ``domain/<task>/cost_s`` (seconds per
        rollout, once measured) and ``scheduler/s_per_token``.

        The cost model: a rollout of a task costs its completion tokens x the seconds per
        generated token (one rate for the sampler, from the step's sampling seconds over its
        completion tokens) + its reward seconds; tokens, reward seconds and the rate are each
        averaged over steps with ``fast_rate``, as success is. Measured wall-clock seconds: a
        resumed run restores these averages exactly, but what it measures after is new."""
        pending, rate = self._pending, self.settings.fast_rate
        rollouts = {name: len(p["success"]) for name, p in pending.items()}
        tokens = {name: float(p["tokens"]) for name, p in pending.items()}
        reward_s = {name: p["reward_s"] for name, p in pending.items()}
        if sum(tokens.values()) > 0 and self._sampling_s > 0:
            self.seconds_per_token = _averaged(self.seconds_per_token, self._sampling_s / sum(tokens.values()), rate,
                                               first=not self.seconds_per_token)
        self._sampling_s = 0.0
        record: dict[str, float] = {}
        totals = {"draw_share": rollouts, "token_share": tokens, "reward_time_share": reward_s}
        for task in self.tasks:
            stats, count = self.stats[task.name], rollouts.get(task.name, 0)
            if count:
                first = not (stats.tokens or stats.reward_s)
                stats.tokens = _averaged(stats.tokens, tokens[task.name] / count, rate, first)
                stats.reward_s = _averaged(stats.reward_s, reward_s[task.name] / count, rate, first)
            if stats.tokens or stats.reward_s:
                stats.cost_s = stats.tokens * self.seconds_per_token + stats.reward_s
                record[f"domain/{task.name}/cost_s"] = stats.cost_s
            for key, values in totals.items():
                if sum(values.values()) > 0:
                    record[f"domain/{task.name}/{key}"] = values.get(task.name, 0) / sum(values.values())
        if self.seconds_per_token:
            record["scheduler/s_per_token"] = self.seconds_per_token
        return record

    def update(self) -> dict[str, float]:
        """Fold this step's observations into the statistics, move curricula, re-weigh;
        return per-task metrics for the step's record: ``domain/<task>/`` ``success``,
        ``spread`` (mean within-group variance of success), ``reward`` and ``completion_tokens``
        (of this step's sampled rollouts, when the task was drawn), ``weight`` (its share of the next draws), ``dropped_groups`` (so far)
        and ``level`` (for tasks with levels, with ``length_tokens`` for those whose levels are
        lengths); and the costs and shares of :meth:`fold_costs`."""
        s = self.settings
        record = self.fold_costs()
        for task in self.tasks:
            stats, pending = self.stats[task.name], self._pending.pop(task.name, None)
            stats.spread_sum *= 1 - s.slow_rate
            stats.spread_groups *= 1 - s.slow_rate
            if pending:
                stats.spread_sum += sum(pending["spread"])
                stats.spread_groups += len(pending["spread"])
                successes = pending["success"]
                rate = sum(successes) / len(successes)
                spread = sum(pending["spread"]) / len(pending["spread"])
                record[f"domain/{task.name}/reward"] = pending["reward"] / len(successes)
                record[f"domain/{task.name}/completion_tokens"] = pending["tokens"]
                record[f"domain/{task.name}/spread"] = spread
                if stats.seen == 0:
                    stats.fast = stats.slow = rate
                    stats.spread = spread
                else:
                    stats.fast += s.fast_rate * (rate - stats.fast)
                    stats.slow += s.slow_rate * (rate - stats.slow)
                    stats.spread += s.fast_rate * (spread - stats.spread)
                stats.seen += len(successes)
                record[f"domain/{task.name}/success"] = rate
            self._promote(task, stats)
        self._pending.clear()
        self.weights = self._weights()
        total = sum(self.weights)
        for task, weight in zip(self.tasks, self.weights):
            stats = self.stats[task.name]
            record[f"domain/{task.name}/weight"] = weight / total
            record[f"domain/{task.name}/dropped_groups"] = stats.dropped
            if curriculum_levels(task):
                record[f"domain/{task.name}/level"] = stats.level
                if isinstance(length := getattr(task, "length_tokens", None), int):
                    record[f"domain/{task.name}/length_tokens"] = length
        return record

    def table(self) -> str:
        """Per-task training statistics as plain text, for the end of a run.

        >>> from tempering.build import scheduler_settings
        >>> from tempering.config import SchedulerConfig
        >>> from tempering.tasks import build_task
        >>> settings = scheduler_settings(SchedulerConfig())
        >>> print(StaticMixture([build_task("add", seed=0)], [1.0], seed=0, settings=settings).table())
        task  weight  success  groups  dropped
        add   100.0%     0.0%       0        0
        """
        total = sum(self.weights)
        rows = [("task", "weight", "success", "groups", "dropped")]
        for task, weight in zip(self.tasks, self.weights):
            st = self.stats[task.name]
            rows.append((task.name, f"{100 * weight / total:.1f}%", f"{100 * st.fast:.1f}%", str(st.groups), str(st.dropped)))
        width = max(len(r[0]) for r in rows) + 2
        return "\n".join(f"{r[0]:<{width}}{r[1]:>6}{r[2]:>9}{r[3]:>8}{r[4]:>9}" for r in rows)

    def _promote(self, task: Task, stats: TaskStats) -> None:
        if stats.level + 1 < curriculum_levels(task) and stats.seen >= self.settings.min_samples \
                and stats.fast >= self.settings.promote_at:
            stats.level += 1
            task.level = stats.level
            stats.seen = 0  # the new level's rate is unknown: the strategies treat it as unseen

    def state_dict(self) -> dict:
        """Cursors, random generator, statistics, and the state of each task that has one
        (``task.state_dict()``: its stream position and, for curricula, its level)."""
        return {"cursors": dict(self.cursors), "rng": self.rng.getstate(),
                "stats": {name: asdict(st) for name, st in self.stats.items()},
                "seconds_per_token": self.seconds_per_token,
                "tasks": {t.name: t.state_dict() for t in self.tasks if hasattr(t, "state_dict")},
                "pauses": self._pause_state(), "grad_weights": dict(self.grad_weights)}

    def load_state_dict(self, state: dict) -> None:
        by_name = {t.name: t for t in self.tasks}
        for name, saved in state.get("tasks", {}).items():
            if hasattr(by_name.get(name), "load_state_dict"):
                by_name[name].load_state_dict(saved)
        self.cursors = dict(state["cursors"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for name, saved in state.get("stats", {}).items():
            if name in self.stats:
                self.stats[name] = TaskStats(**saved)
        self.seconds_per_token = state.get("seconds_per_token", 0.0)
        for task in self.tasks:
            if curriculum_levels(task):
                task.level = self.stats[task.name].level
        self._load_pauses(state.get("pauses", {}))
        self.grad_weights = dict(state.get("grad_weights", {}))
        self.weights = self._weights()

    # -- pauses (see the module docstring) ------------------------------------------------
    def _without_paused(self, weights: list[float]) -> list[float]:
        return [0.0 if t.name in self.paused else w for w, t in zip(weights, self.tasks)]

    def drawable(self) -> list[str]:
        """The tasks that can be drawn now: a positive training weight, not paused."""
        return [t.name for t, b in zip(self.tasks, self.base) if b > 0 and t.name not in self.paused]

    def paused_tasks(self) -> list[str]:
        return [t.name for t in self.tasks if t.name in self.paused]

    def pause(self, name: str, now: int, probe_at: int) -> None:
        """No more draws of ``name`` from sampling round ``now`` on; probe it at round ``probe_at``.
        The last drawable task is never paused (the caller checks :meth:`drawable`)."""
        if self.drawable() == [name]:
            raise ValueError(f"task {name!r} is the only one left to draw from; it cannot be paused")
        self.paused[name] = Pause(since=now, probe_at=probe_at)
        self.pauses[name] += 1
        self.weights = self._weights()

    def due_probes(self, now: int) -> list[str]:
        """Paused tasks whose probe is due at sampling round ``now``, in task order."""
        return [name for name in self.paused_tasks() if self.paused[name].probe_at <= now]

    def probe_failed(self, name: str, probe_at: int) -> None:
        """The probe of a paused task failed: probe it again at round ``probe_at``."""
        pause = self.paused[name]
        pause.probes += 1
        pause.probe_at = probe_at

    def readmit(self, name: str) -> None:
        """The probe succeeded: ``name`` is drawn again with its strategy's weight."""
        del self.paused[name]
        self.weights = self._weights()

    def pause_record(self) -> dict[str, float]:
        """``domain/<task>/paused`` (1 while paused, else 0) and ``domain/<task>/pauses`` (times
        paused so far) for every task, and ``paused_domains``, how many are paused now."""
        record: dict[str, float] = {"paused_domains": len(self.paused)}
        for task in self.tasks:
            record[f"domain/{task.name}/paused"] = float(task.name in self.paused)
            record[f"domain/{task.name}/pauses"] = self.pauses[task.name]
        return record

    def _pause_state(self) -> dict:
        return {"paused": {name: asdict(p) for name, p in self.paused.items()}, "count": dict(self.pauses)}

    def _load_pauses(self, state: dict) -> None:
        self.paused = {name: Pause(**saved) for name, saved in state.get("paused", {}).items()}
        self.pauses = Counter(state.get("count", {}))


def _averaged(average: float, value: float, rate: float, first: bool) -> float:
    """An exponential average after ``value``: ``value`` itself when it is the first."""
    return value if first else average + rate * (value - average)


def curriculum_levels(task: Task) -> int:
    """How many levels ``task`` is a curriculum of: its ``levels`` when that is a count, else 0
    (a task may use the name for something else, such as the list of levels it draws from)."""
    levels = getattr(task, "levels", 0)
    return levels if isinstance(levels, int) and not isinstance(levels, bool) else 0


class StaticMixture(Mixture):
    """The configured weights, never changed: the default mixture."""

    def __init__(self, tasks: Sequence[Task], weights: Sequence[float], seed: int, settings: Settings):
        super().__init__(tasks, weights, seed, "static", settings)


def cap_domain_tokens(groups: list[Group], max_share: float) -> tuple[list[Group], int]:
    """Drop a domain's last groups while it holds more than ``max_share`` of the completion
    tokens (and more than one group); return the kept groups, in order, and the number dropped.

    >>> from tempering.types import Problem, Rollout
    >>> def g(task, n):
    ...     p = Problem(task=task, id="0", prompt="", answer="")
    ...     return Group(p, [Rollout(p, [], [0] * n, [0.0] * n, "", "stop", 0)])
    >>> kept, dropped = cap_domain_tokens([g("long", 90), g("short", 10), g("long", 90)], 0.7)
    >>> [x.problem.task for x in kept], dropped
    (['long', 'short'], 1)
    """
    if max_share >= 1:
        return groups, 0
    kept = list(groups)
    tokens = [sum(len(r.completion_ids) for r in g.rollouts) for g in groups]
    while True:
        total: dict[str, int] = {}
        for group, count in zip(kept, tokens):
            total[group.problem.domain_key] = total.get(group.problem.domain_key, 0) + count
        over = [d for d, t in total.items() if t > max_share * sum(total.values())
                and sum(g.problem.domain_key == d for g in kept) > 1]
        if not over:
            return kept, len(groups) - len(kept)
        last = max(i for i, g in enumerate(kept) if g.problem.domain_key == over[0])
        del kept[last], tokens[last]


def domain_token_weights_B(groups: Sequence[Group]) -> torch.Tensor:
    """Per-rollout factor (rollout share / token share of its domain) for a token-mean loss:
    each domain's share of the loss's weight is then its share of rollouts (see the module
    docstring for what that does to its share of the gradient norm).

    >>> from tempering.types import Problem, Rollout
    >>> def g(task, n):
    ...     p = Problem(task=task, id="0", prompt="", answer="")
    ...     return Group(p, [Rollout(p, [], [0] * n, [0.0] * n, "", "stop", 0)])
    >>> domain_token_weights_B([g("a", 10), g("a", 10), g("b", 40)])
    tensor([2.0000, 2.0000, 0.5000])
    """
    domains_B = [g.problem.domain_key for g in groups for _ in g.rollouts]
    tokens_B = torch.tensor([float(len(r.completion_ids)) for g in groups for r in g.rollouts])
    rollouts, tokens = Counter(domains_B), Counter()
    for domain, count in zip(domains_B, tokens_B.tolist()):
        tokens[domain] += count
    total_tokens = max(float(tokens_B.sum()), 1.0)
    return torch.tensor([(rollouts[d] / len(domains_B)) / max(tokens[d] / total_tokens, 1e-9) for d in domains_B])


GRAD_WEIGHT_BOUND = 100.0
"""A multiplier stays within [1 / bound, bound]: a domain whose gradient is tiny for a while
(rewards all equal) cannot push it without end."""


def balance_grad_weights(weights: dict[str, float], shares: dict[str, float], drawn: dict[str, float],
                         rate: float) -> dict[str, float]:
    """The per-domain loss multipliers after one multiplicative step towards measured share
    == drawn share: ``w_d * (drawn_d / share_d) ** rate``, where ``shares`` were measured with
    ``weights`` applied. A domain's gradient is linear in its multiplier, so ``rate`` 1 lands
    on the drawn shares at once if the next batch's gradients are like this one's; below 1 it
    averages over batches. Domains with no gradient (share 0) keep their multiplier and leave
    the drawn shares (renormalised over the others); the updated multipliers are scaled so
    their drawn-weighted mean is 1, so balancing moves gradient between domains without
    changing the step's size. Domains not in ``shares`` keep theirs.

    >>> w = balance_grad_weights({}, {"a": 0.8, "b": 0.2}, {"a": 0.5, "b": 0.5}, 1.0)
    >>> {d: round(v, 6) for d, v in w.items()}
    {'a': 0.4, 'b': 1.6}
    >>> balance_grad_weights(w, {"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}, 0.5) == w
    True
    """
    live = [d for d, s in shares.items() if s > 0]
    total = sum(drawn[d] for d in live)
    if not live or total <= 0:
        return dict(weights)
    moved = {d: weights.get(d, 1.0) * (drawn[d] / total / shares[d]) ** rate for d in live}
    scale = sum(drawn[d] / total * moved[d] for d in live)
    bound = GRAD_WEIGHT_BOUND
    return {**weights, **{d: min(max(w / scale, 1 / bound), bound) for d, w in moved.items()}}
