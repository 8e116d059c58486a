"""The composer: score a step's rollouts with each task's rewards, all rewards at once.

Every reward named by any task is built once (with its options) and scored on the batch of
rollouts that need it; different rewards run at the same time on a thread pool, so a slow
one (the sandbox, a reward model) does not hold up the others, and :meth:`Rewarder.ascore`
lets an event loop await a whole step's scoring. Per rollout the weighted sum of its task's
rewards becomes ``rollout.reward`` (after the optional per-domain normalization), and every
component is kept unweighted in ``rollout.reward_components``. Each reward's batch is timed,
and every rollout it scored gets an equal share of those seconds in ``rollout.reward_s`` (summed
over its rewards): what the mixture learns a domain's grading costs. A reward shared by
several domains is timed once for all of them, so each of its rollouts costs the batch's mean.

A rollout whose grader failed (``RewardResult.error``) is removed from its group and
counted in ``reward/dropped``; a group left empty is removed from the step. The newest such
failure is kept as ``last_error`` (the reward's name and its error), for the message of a
run that stops because a grader keeps failing; :meth:`Rewarder.probe` asks whether a task's
graders answer again, for a domain the pipeline paused. A reward that
raises is contained the same way: its batch is scored again one rollout at a time, and
only the rollouts whose scoring raises are dropped (counted in ``reward/errors`` too); so is
a score that is not a finite number (:func:`score_contained`, which evaluation uses too).

A multi-turn episode (``tempering.envs``) adds the rewards its environment gave, summed over
its turns, each kept as the component ``env/<name>``.

The task's ``metric`` reward is always scored (weight 0 when the spec leaves it out), so
accuracy is measured whatever the training rewards are.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from tempering.rewards.base import BatchReward, RewardResult, build_reward
from tempering.rewards.normalize import NormalizeSettings, RunningNormalizer
from tempering.types import Group, Problem, Rollout, domain_of, episode_totals

Items = list[tuple[int, int]]  # (group index, rollout index) pairs a reward scores


@dataclass(frozen=True)
class TaskRewards:
    """What the composer needs of one task: its rewards with weights, the reward that counts
    as correct, and the domain its statistics are kept under (the builder makes these from the
    tasks, so rewards never import them)."""

    name: str
    rewards: Mapping[str, float]
    metric: str
    domain: str = ""


def score_contained(reward: BatchReward, name: str, problems: Sequence[Problem],
                    rollouts: Sequence[Rollout]) -> list[RewardResult]:
    """``reward``'s results on a batch, a failing reward contained: when the batch raises (or
    returns the wrong number of results) it is scored again one rollout at a time, and a rollout
    whose scoring raises, or whose score is not a finite number (``nan``, ``"high"``), gets an
    error result naming the reward (``diagnostics["exception"]``), so that it is dropped as a
    grader's failure rather than stopping the caller or reaching the advantages."""
    try:
        results = reward.score_batch(problems, rollouts)
        if len(results) != len(problems):
            raise RuntimeError(f"reward {name!r} returned {len(results)} results for {len(problems)} rollouts")
    except Exception:  # score one by one, so only the rollouts that raise are lost
        results = [_one(reward, problem, rollout) for problem, rollout in zip(problems, rollouts)]
    return [_checked(name, result) for result in results]


def _one(reward: BatchReward, problem: Problem, rollout: Rollout) -> RewardResult:
    try:
        (result,) = reward.score_batch([problem], [rollout])
        return result
    except Exception as exc:
        return RewardResult(0.0, diagnostics={"exception": 1}, error=f"{type(exc).__name__}: {exc}")


def _checked(name: str, result: Any) -> RewardResult:
    """``result``, or an error result when it is not a RewardResult with a finite score (or an
    error of its own)."""
    score = getattr(result, "score", result)
    if isinstance(result, RewardResult) and (result.error is not None
                                             or isinstance(score, (int, float)) and math.isfinite(score)):
        return result
    return RewardResult(0.0, diagnostics={"exception": 1},
                        error=f"reward {name!r} returned the score {score!r}; a score must be a finite number")


class Rewarder:
    """Scores groups in place for a fixed set of tasks; see the module docstring.

    ``options``: reward name -> keyword options. ``normalize``: task name -> settings
    (statistics are kept per domain); ``default_normalize`` for the other tasks (None: no
    normalization). ``threads``: rewards scored at the same time.
    """

    def __init__(self, tasks: Sequence[TaskRewards], options: Optional[dict[str, dict[str, Any]]] = None,
                 normalize: Optional[dict[str, NormalizeSettings]] = None,
                 default_normalize: Optional[NormalizeSettings] = None, threads: int = 4):
        options = options or {}
        self.specs = {t.name: {**dict(t.rewards), **({} if t.metric in t.rewards else {t.metric: 0.0})}
                      for t in tasks}
        self.metrics = {t.name: t.metric for t in tasks}
        names = list(dict.fromkeys(name for spec in self.specs.values() for name in spec))
        unused = sorted(set(options) - set(names))
        if unused:
            raise ValueError(f"rewards.options.{unused[0]}: no task uses the reward {unused[0]!r}")
        self.rewards: dict[str, BatchReward] = {}
        for name in names:
            try:
                self.rewards[name] = build_reward(name, options.get(name))
            except ValueError as exc:
                raise ValueError(f"rewards.options.{name}: {exc}") from None
        domains = {t.name: domain_of(t.name, t.domain) for t in tasks}
        for name in normalize or {}:
            if name not in domains:
                raise ValueError(f"rewards.task_normalize.{name}: no such task (tasks: {', '.join(domains)})")
        self.normalizer = RunningNormalizer(
            {domains[name]: s for name, s in (normalize or {}).items()}, default_normalize)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="reward")
        self.last_error: Optional[tuple[str, str]] = None

    def _items(self, groups: list[Group]) -> dict[str, Items]:
        items: dict[str, Items] = {name: [] for name in self.rewards}
        for g, group in enumerate(groups):
            for name in self.specs[group.problem.task]:
                items[name] += [(g, r) for r in range(len(group.rollouts))]
        return {name: found for name, found in items.items() if found}

    def _run(self, name: str, groups: list[Group], items: Items) -> tuple[list[RewardResult], float]:
        """``name``'s results on its items and the seconds they took."""
        problems: list[Problem] = [groups[g].problem for g, _ in items]
        rollouts: list[Rollout] = [groups[g].rollouts[r] for g, r in items]
        start = time.perf_counter()
        results = score_contained(self.rewards[name], name, problems, rollouts)
        return results, time.perf_counter() - start

    def score(self, groups: list[Group]) -> dict[str, float]:
        """Score ``groups`` in place (see the module docstring); return the step's means."""
        jobs = self._items(groups)
        futures = {name: self._pool.submit(self._run, name, groups, items) for name, items in jobs.items()}
        return self._combine(groups, jobs, {name: f.result() for name, f in futures.items()})

    async def ascore(self, groups: list[Group]) -> dict[str, float]:
        """:meth:`score` for an event loop: rewards run on the pool while the loop keeps going."""
        jobs = self._items(groups)
        loop = asyncio.get_running_loop()
        results = await asyncio.gather(*(loop.run_in_executor(self._pool, self._run, name, groups, items)
                                         for name, items in jobs.items()))
        return self._combine(groups, jobs, dict(zip(jobs, results)))

    def _combine(self, groups: list[Group], jobs: dict[str, Items],
                 timed: dict[str, tuple[list[RewardResult], float]]) -> dict[str, float]:
        per_rollout: dict[tuple[int, int], dict[str, RewardResult]] = {}
        for name, items in jobs.items():
            results, seconds = timed[name]
            for (g, r), result in zip(items, results):
                per_rollout.setdefault((g, r), {})[name] = result
                groups[g].rollouts[r].reward_s += seconds / len(items)
        sums: Counter = Counter()
        kept_by_domain: dict[str, list[Rollout]] = {}
        dropped = errors = 0
        for g, group in enumerate(groups):
            spec, metric = self.specs[group.problem.task], self.metrics[group.problem.task]
            kept = []
            for r, rollout in enumerate(group.rollouts):
                found = per_rollout[(g, r)]
                failed = [(name, result.error) for name, result in found.items() if result.error]
                if failed:
                    self.last_error = failed[-1]
                    dropped += 1
                    errors += any(result.diagnostics.get("exception") for result in found.values())
                    continue
                rollout.reward = sum(spec[name] * found[name].score for name in spec)
                rollout.reward_components = {}
                for name, result in found.items():
                    rollout.reward_components[name] = result.score
                    rollout.reward_components.update({f"{name}/{k}": v for k, v in result.components.items()})
                    for key, value in result.diagnostics.items():
                        if isinstance(value, (int, float)):  # labels stay out of the metrics ...
                            sums[f"diag/{name}/{key}"] += value
                        elif key == "status":  # ... but a sandbox's statuses, a few, are counted
                            sums[f"diag/{name}/status/{value}"] += 1
                self._add_episode(rollout, sums)
                sums["reward"] += rollout.reward
                sums["accuracy"] += rollout.reward_components[metric]
                for key, value in rollout.reward_components.items():
                    sums[f"reward/{key}"] += value
                kept.append(rollout)
                kept_by_domain.setdefault(group.problem.domain_key, []).append(rollout)
            group.rollouts = kept
        groups[:] = [group for group in groups if group.rollouts]
        count = max(sum(len(g.rollouts) for g in groups), 1)
        record = {key: value / count for key, value in sums.items()}
        record["reward/dropped"] = dropped
        record["reward/errors"] = errors
        self._normalize(kept_by_domain, record, count)
        return record

    def probe(self, group: Group) -> Optional[tuple[str, str]]:
        """Whether the graders of ``group``'s task answer again: ``(reward, error)`` of the first
        of its rewards that fails on the group's rollouts, None when all of them score. Nothing
        is kept: no rollout is changed, no statistic or ``last_error`` moves, so a probe of a
        paused domain leaves the run exactly as it was."""
        problems = [group.problem] * len(group.rollouts)
        for name in self.specs[group.problem.task]:
            for result in score_contained(self.rewards[name], name, problems, group.rollouts):
                if result.error:
                    return name, result.error
        return None

    @staticmethod
    def _add_episode(rollout: Rollout, sums: Counter) -> None:
        """A multi-turn episode's environment rewards join its reward (as ``env/<name>``
        components); its turns and info counters go to the step's means (``env/<name>``)."""
        if not rollout.turns:
            return
        rewards, info = episode_totals(rollout.turns)
        rollout.reward += sum(rewards.values())
        rollout.reward_components.update({f"env/{key}": value for key, value in rewards.items()})
        sums["env/turns"] += len(rollout.turns)
        for key, value in info.items():
            sums[f"env/{key}"] += value

    def _normalize(self, by_domain: dict[str, list[Rollout]], record: dict[str, float], count: int) -> None:
        active = False
        total = 0.0
        for domain, rollouts in by_domain.items():
            settings = self.normalizer.settings_for(domain)
            active |= settings is not None and settings.active
            for rollout, value in zip(rollouts, self.normalizer(domain, [r.reward for r in rollouts])):
                rollout.reward = value
                total += value
        if active:
            record["reward/normalized"] = total / count

    def state_dict(self) -> dict:
        return {"normalizer": self.normalizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.normalizer.load_state_dict(state["normalizer"])

    def close(self) -> None:
        """Stop the threads and any resources rewards hold (sandbox pools, models)."""
        self._pool.shutdown(wait=True)
        for reward in self.rewards.values():
            if hasattr(reward, "close"):
                reward.close()
