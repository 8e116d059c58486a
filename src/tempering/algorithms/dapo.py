"""DAPO's data-side techniques: dynamic sampling, overlong filtering, soft overlong punishment.

- **Dynamic sampling.** A group whose rewards are all equal has zero group-relative
  advantage: it costs a forward and backward pass and teaches nothing. :func:`collect_groups`
  drops such groups and samples further rounds until the batch holds ``wanted`` groups
  with signal, or the extra rounds run out; it reports how many it dropped.
- **Overlong filtering.** A completion cut off at the length limit ("length") has no
  final answer; its reward says little about its tokens. :func:`mask_truncated` excludes
  its tokens from the loss (it still counts in its group's statistics).
- **Soft overlong punishment.** :func:`overlong_penalty` lowers the reward of completions
  that enter the last ``buffer`` tokens before the limit, linearly down to ``-penalty``.

Not done: per-task reward thresholds for "signal" (equal rewards, exactly, is the test).
"""

from __future__ import annotations

from typing import Callable

from tempering.types import Group, Rollout, Round


def has_signal(group: Group) -> bool:
    """Whether the group's rewards differ (so group-relative advantages are not all zero).

    >>> from tempering.types import Problem
    >>> p = Problem(task="t", id="0", prompt="", answer="")
    >>> r = lambda x: Rollout(p, [], [], [], "", "stop", 0, reward=x)
    >>> has_signal(Group(p, [r(1.0), r(1.0)])), has_signal(Group(p, [r(1.0), r(0.0)]))
    (False, True)
    """
    rewards = [r.reward for r in group.rollouts]
    return max(rewards) != min(rewards)


def collect_groups(next_round: Callable[[], Round], wanted: int, dynamic: bool,
                   max_extra_rounds: int) -> tuple[list[Group], dict[str, float]]:
    """Take scored rounds of ``wanted`` groups; with ``dynamic``, keep only groups with signal.

    Without ``dynamic`` this is one round and every group is kept. With it, rounds continue
    until ``wanted`` groups with signal are kept or ``max_extra_rounds`` extra rounds are
    spent; surplus groups of the last round are not used. If no group has signal after all
    rounds, the last round is kept as is, so a step always has a batch (its group-relative
    advantages are 0).

    The record holds the scores' means over every sampled rollout (dropped ones included,
    so ``accuracy`` is the sampler's); the rounds' summed costs ``generate_s``, ``reward_s``,
    ``weight_sync_s`` and their largest ``staleness``; ``completion_tokens`` and their mean
    per rollout, ``completion_length``;
    ``dropped_groups``, ``dropped_fraction`` (of sampled groups), ``zero_signal_fraction``
    (of sampled groups, measured also without ``dynamic``) and ``sampling_rounds``; and what
    the sampler reported after the last round that reported (``Round.sampler``).

    A round with no groups is taken like any other (an empty batch when every round is
    empty): it adds its costs, and nothing to the means, which are left out when no rollout
    was sampled; fractions of no groups are 0.
    """
    kept: list[Group] = []
    totals: dict[str, float] = {"generate_s": 0.0, "reward_s": 0.0, "weight_sync_s": 0.0,
                                "staleness": 0, "completion_tokens": 0}
    weighted: dict[str, float] = {}
    sampled_groups = sampled_rollouts = flat = rounds = 0
    groups: list[Group] = []
    sampler: dict[str, float] = {}
    while rounds == 0 or (dynamic and len(kept) < wanted and rounds <= max_extra_rounds):
        made = next_round()
        groups = made.groups
        totals["generate_s"] += made.generate_s
        totals["reward_s"] += made.reward_s
        totals["weight_sync_s"] += made.sync_s
        totals["staleness"] = max(totals["staleness"], made.staleness)
        sampler = made.sampler or sampler
        count = sum(len(g.rollouts) for g in groups)
        totals["completion_tokens"] += sum(len(r.completion_ids) for g in groups for r in g.rollouts)
        if count:  # an empty round has no means to add (its record may hold a mean of nothing)
            for key, value in made.record.items():
                weighted[key] = weighted.get(key, 0.0) + value * count
        sampled_rollouts += count
        sampled_groups += len(groups)
        signal = [g for g in groups if has_signal(g)]
        flat += len(groups) - len(signal)
        kept += signal if dynamic else groups
        rounds += 1
    dropped = flat if dynamic else 0
    if not kept:  # only when dynamic: every group of every round was flat; keep the last round
        kept, dropped = groups, flat - len(groups)
    record = {key: value / sampled_rollouts for key, value in weighted.items()}
    record.update(totals, completion_length=totals["completion_tokens"] / max(sampled_rollouts, 1),
                  dropped_groups=dropped, dropped_fraction=dropped / max(sampled_groups, 1),
                  zero_signal_fraction=flat / max(sampled_groups, 1), sampling_rounds=rounds)
    record.update(sampler)
    return kept[:wanted], record


def mask_truncated(rollouts: list[Rollout]) -> int:
    """Zero the loss mask of every rollout that hit the length limit; return how many did."""
    truncated = [r for r in rollouts if r.finish_reason == "length"]
    for rollout in truncated:
        rollout.loss_mask = [0] * len(rollout.completion_ids)
    return len(truncated)


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment, added to the reward of a completion of ``length`` tokens.

    0 up to ``max_tokens - buffer`` tokens, then falling linearly to ``-penalty`` at
    ``max_tokens`` (and beyond). ``buffer = 0`` turns it off.

    >>> [overlong_penalty(n, 10, 4) for n in (6, 7, 8, 10, 12)]
    [0.0, -0.25, -0.5, -1.0, -1.0]
    """
    if buffer <= 0:
        return 0.0
    excess = min(max(length - (max_tokens - buffer), 0), buffer)
    return -penalty * excess / buffer if excess else 0.0
