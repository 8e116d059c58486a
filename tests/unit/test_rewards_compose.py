"""The Rewarder: per-task specs and options, batch rewards run side by side, dropped
rollouts, the async path, and reward-side normalization."""

import asyncio
import threading
import time
from dataclasses import dataclass, field

import pytest

from tempering.build import normalize_settings
from tempering.config import NormalizeConfig
from tempering.rewards import RewardResult, Rewarder, RunningNormalizer, register_reward
from tempering.rewards.base import REWARDS
from tempering.types import Group, Problem, Rollout


def _normalize(**fields):
    """A run's normalization settings with ``fields`` (NormalizeConfig names) changed."""
    return normalize_settings(NormalizeConfig(**fields))


@dataclass
class FakeTask:
    name: str
    rewards: dict
    metric: str = "exact_match"
    domain: str = ""
    options: dict = field(default_factory=dict)


def _group(task, answer, texts, i=0):
    problem = Problem(task=task, id=str(i), prompt="", answer=answer, domain=task)
    return Group(problem, [Rollout(problem, [1], [2] * (k + 1), [0.0] * (k + 1), t, "stop", 0)
                           for k, t in enumerate(texts)])


class SlowReward:
    """A batch reward that sleeps, to show two of them overlap; scores 1 for 'ok' texts."""

    active = 0
    peak = 0
    together = 0
    """When set, a call waits (up to 10 s) for this many to be running instead of sleeping:
    overlap shown without betting on a thread starting within ``delay`` on a busy machine."""
    lock = threading.Condition()

    def __init__(self, *, delay: float = 0.2, fail_on: str = ""):
        self.delay, self.fail_on = delay, fail_on

    def score_batch(self, problems, rollouts):
        with SlowReward.lock:
            SlowReward.active += 1
            SlowReward.peak = max(SlowReward.peak, SlowReward.active)
            SlowReward.lock.notify_all()
            if SlowReward.together:
                SlowReward.lock.wait_for(lambda: SlowReward.active >= SlowReward.together, timeout=10.0)
        if not SlowReward.together:
            time.sleep(self.delay)
        with SlowReward.lock:
            SlowReward.active -= 1
        return [RewardResult(0.0, error="grader down") if self.fail_on and r.text == self.fail_on
                else RewardResult(float(r.text.startswith("ok")), {"sub": 0.5}, {"calls": 1})
                for r in rollouts]


for _name in ("slow_a", "slow_b"):
    if _name not in REWARDS:
        register_reward(_name)(SlowReward)


def test_each_task_gets_its_own_weighted_spec_and_the_metric_is_always_scored():
    rewarder = Rewarder([FakeTask("a", {"exact_match": 1.0, "format": 0.5}),
                         FakeTask("b", {"format": 1.0})])
    groups = [_group("a", "3", ["answer: 3", "answer: 4"]), _group("b", "3", ["answer: 3", "3"], 1)]
    record = rewarder.score(groups)
    assert [r.reward for r in groups[0].rollouts] == [1.5, 0.5]
    assert [r.reward for r in groups[1].rollouts] == [1.0, 0.0]        # exact_match weighs 0 for b
    assert groups[1].rollouts[0].reward_components == {"format": 1.0, "exact_match": 1.0}
    assert record["accuracy"] == pytest.approx(0.5)
    assert record["reward/format"] == pytest.approx(0.75)


def test_options_are_bound_and_bad_ones_are_named():
    rewarder = Rewarder([FakeTask("a", {"match": 1.0})], {"match": {"tolerance": 0.5}})
    group = _group("a", "10", ["answer: 14", "answer: 16"])
    rewarder.score([group])
    assert [r.reward for r in group.rollouts] == [1.0, 0.0]
    with pytest.raises(ValueError, match="rewards.options.match: reward 'match' has no option 'tol'"):
        Rewarder([FakeTask("a", {"match": 1.0})], {"match": {"tol": 0.5}})
    with pytest.raises(ValueError, match="rewards.options.steps: no task uses the reward 'steps'"):
        Rewarder([FakeTask("a", {"match": 1.0})], {"steps": {}})
    with pytest.raises(ValueError, match="rewards.options.length: reward 'length' needs the option 'max_tokens'"):
        Rewarder([FakeTask("a", {"length": 1.0})])


def test_slow_rewards_run_at_the_same_time_and_sub_components_are_logged():
    SlowReward.peak, SlowReward.together = 0, 2
    rewarder = Rewarder([FakeTask("a", {"slow_a": 1.0, "slow_b": 1.0})])
    group = _group("a", "0", ["ok", "no"])
    try:
        record = rewarder.score([group])
    finally:
        SlowReward.together = 0
    assert SlowReward.peak == 2, "both slow rewards were running at once"
    assert group.rollouts[0].reward == 2.0
    assert record["reward/slow_a/sub"] == 0.5
    assert record["diag/slow_a/calls"] == 1


def test_the_async_path_gives_the_same_scores():
    rewarder = Rewarder([FakeTask("a", {"slow_a": 1.0, "exact_match": 1.0})], {"slow_a": {"delay": 0.0}})
    group = _group("a", "3", ["ok\nanswer: 3", "answer: 4"])
    record = asyncio.run(rewarder.ascore([group]))
    assert [r.reward for r in group.rollouts] == [2.0, 0.0]
    assert record["accuracy"] == 0.5


def test_a_rollout_whose_grader_failed_is_dropped_and_counted_and_an_empty_group_goes():
    rewarder = Rewarder([FakeTask("a", {"slow_a": 1.0})], {"slow_a": {"delay": 0.0, "fail_on": "bad"}})
    groups = [_group("a", "0", ["ok", "bad", "no"]), _group("a", "0", ["bad"], 1)]
    record = rewarder.score(groups)
    assert len(groups) == 1
    assert [r.text for r in groups[0].rollouts] == ["ok", "no"]
    assert record["reward/dropped"] == 2
    assert record["reward"] == 0.5   # the mean over the rollouts kept


def test_ema_normalization_per_domain_with_clipping_and_state():
    rewarder = Rewarder([FakeTask("a", {"exact_match": 1.0}), FakeTask("b", {"exact_match": 1.0})],
                        normalize={"a": _normalize(mode="ema", decay=0.5, clip=0.5)})
    groups = [_group("a", "1", ["answer: 1", "answer: 0"]), _group("b", "1", ["answer: 1", "answer: 0"], 1)]
    record = rewarder.score(groups)
    assert [r.reward for r in groups[0].rollouts] == pytest.approx([0.5, -0.5])   # +-1, clipped
    assert [r.reward for r in groups[1].rollouts] == [1.0, 0.0]                   # b: untouched
    assert record["reward"] == 0.5 and record["reward/normalized"] == pytest.approx(0.25)
    restored = Rewarder([FakeTask("a", {"exact_match": 1.0}), FakeTask("b", {"exact_match": 1.0})])
    restored.load_state_dict(rewarder.state_dict())
    assert restored.normalizer.moments == rewarder.normalizer.moments
    with pytest.raises(ValueError, match="rewards.task_normalize.c: no such task"):
        Rewarder([FakeTask("a", {"exact_match": 1.0})], normalize={"c": _normalize()})


def test_running_statistics_follow_a_shifting_reward_and_smoothing_shrinks_to_the_mean():
    norm = RunningNormalizer({}, _normalize(mode="ema", decay=0.9))
    for _ in range(200):
        out = norm("d", [10.0, 12.0])
    mean, std = norm.mean_std("d")
    assert (mean, std) == (pytest.approx(11.0), pytest.approx(1.0))
    assert out == pytest.approx([-1.0, 1.0], abs=1e-5)
    smooth = RunningNormalizer({}, _normalize(smoothing=0.5))
    smooth("d", [0.0, 1.0])
    assert smooth("d", [0.0, 1.0]) == pytest.approx([0.25, 0.75])


class Flaky:
    """A batch reward that raises on any batch holding the text 'boom'."""

    def __init__(self):
        pass

    def score_batch(self, problems, rollouts):
        if any(r.text == "boom" for r in rollouts):
            raise RuntimeError("grader crashed")
        return [RewardResult(float(r.text == "ok")) for r in rollouts]


def test_an_exception_in_a_reward_is_contained_to_the_rollout_that_raised(monkeypatch):
    monkeypatch.setitem(REWARDS, "flaky", Flaky)  # registered for this test only
    rewarder = Rewarder([FakeTask("t", {"flaky": 1.0}, metric="flaky")])
    groups = [_group("t", "1", ["ok", "boom", "no"], 0), _group("t", "1", ["ok", "ok"], 1)]
    record = rewarder.score(groups)
    assert [[r.text for r in g.rollouts] for g in groups] == [["ok", "no"], ["ok", "ok"]]
    assert [[r.reward for r in g.rollouts] for g in groups] == [[1.0, 0.0], [1.0, 1.0]]
    assert record["reward/dropped"] == 1 and record["reward/errors"] == 1
    rewarder.close()


class Scored:
    """A batch reward that scores each rollout the number its text reads as ("nan" too)."""

    def score_batch(self, problems, rollouts):
        return [RewardResult(float(r.text)) for r in rollouts]


def test_a_reward_that_scores_nan_loses_those_rollouts_and_its_name_is_the_last_error(monkeypatch):
    """A nan reward would reach the advantages and stop the run as 'training diverged', naming
    no reward: it is contained as a reward that raises, and named."""
    monkeypatch.setitem(REWARDS, "scored", Scored)
    rewarder = Rewarder([FakeTask("t", {"scored": 1.0}, metric="scored")])
    groups = [_group("t", "1", ["1", "nan", "0"], 0), _group("t", "1", ["inf"], 1)]
    record = rewarder.score(groups)
    assert [[r.reward for r in g.rollouts] for g in groups] == [[1.0, 0.0]]
    assert record["reward/dropped"] == 2 and record["reward/errors"] == 2
    assert rewarder.last_error == ("scored", "reward 'scored' returned the score inf; a score must be a finite number")
    rewarder.close()


def test_a_math_answer_the_checker_cannot_settle_is_dropped_and_right_answers_after_it_score_one():
    rewarder = Rewarder([FakeTask("m", {"math": 1.0}, metric="math")], {"math": {"timeout_s": 1.0}})
    groups = [_group("m", "x^2-1", ["answer: 9^{9^{9}}", "answer: (x-1)(x+1)", "answer: x^2+1"])]
    record = rewarder.score(groups)
    assert [r.text for r in groups[0].rollouts] == ["answer: (x-1)(x+1)", "answer: x^2+1"]
    assert [r.reward for r in groups[0].rollouts] == [1.0, 0.0]
    assert (record["reward/dropped"], record["accuracy"]) == (1, 0.5)
    rewarder.close()


class StatusReward:
    """Labels each rollout with a sandbox-like status: the text itself."""

    def score_batch(self, problems, rollouts):
        return [RewardResult(float(r.text == "passed"), {}, {"status": r.text, "extracted": "85"}) for r in rollouts]


if "status_label" not in REWARDS:
    register_reward("status_label")(StatusReward)


def test_status_labels_are_logged_as_shares_and_other_labels_stay_out():
    rewarder = Rewarder([FakeTask("a", {"status_label": 1.0}, metric="status_label")])
    record = rewarder.score([_group("a", "0", ["passed", "failed", "timeout", "passed"])])
    assert record["diag/status_label/status/passed"] == 0.5
    assert record["diag/status_label/status/failed"] == record["diag/status_label/status/timeout"] == 0.25
    assert not any("extracted" in key for key in record)
