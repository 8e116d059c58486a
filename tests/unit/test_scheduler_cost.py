"""Scheduling by cost: what a rollout of each domain costs, learned from the run's own sampling
and reward seconds, and ``learnability_per_cost`` spending draws where signal per second is highest."""

import json
import time

import pytest

from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.rewards.compose import Rewarder, TaskRewards
from tempering.scheduler import STRATEGIES, Mixture, TaskStats
from tempering.types import Group, Problem, Rollout

SLEEP_S = 0.02


def sleepy(problem: Problem, completion: str) -> float:
    """A reward that takes ``SLEEP_S`` per rollout (plugged in as ``test_scheduler_cost:sleepy``)."""
    time.sleep(SLEEP_S)
    return 1.0


def _settings(**fields):
    return scheduler_settings(SchedulerConfig(**fields))


class Task:
    """The least a mixture needs of a task."""

    metric = "correct"
    level = 0

    def __init__(self, name: str):
        self.name = name

    def train_problem(self, index: int) -> Problem:
        return Problem(task=self.name, id=str(index), prompt="", answer="")


def _group(task: str, tokens: int, reward_s: float, successes=(1.0, 0.0)) -> Group:
    problem = Problem(task=task, id="0", prompt="", answer="")
    return Group(problem, [Rollout(problem, [], [0] * tokens, [0.0] * tokens, "", "stop", 0, reward=x,
                                   reward_components={"correct": x}, reward_s=reward_s) for x in successes])


def test_the_strategy_weighs_learnability_by_cost_with_the_floor():
    stats = [TaskStats(spread=0.25, seen=8, cost_s=2.0), TaskStats(spread=0.1, seen=8, cost_s=0.5)]
    weights = STRATEGIES["learnability_per_cost"]([None, None], [1, 2], stats, _settings(floor=0.2))
    # signal per second 0.125 and 0.2, times the base weights 1 and 2: 0.125 / 0.525 and 0.4 / 0.525;
    # then 0.2 of the base shares (1/3, 2/3) + 0.8 of those
    assert weights == pytest.approx([0.2 / 3 + 0.8 * 0.125 / 0.525, 0.4 / 3 + 0.8 * 0.4 / 0.525], abs=1e-12)
    assert weights == pytest.approx([0.257143, 0.742857], abs=1e-6)


def test_a_domain_ten_times_as_expensive_gets_a_tenth_of_the_share_beyond_the_floor():
    stats = [TaskStats(spread=0.2, seen=8, cost_s=0.3), TaskStats(spread=0.2, seen=8, cost_s=3.0)]
    floor = 0.1
    weights = STRATEGIES["learnability_per_cost"]([None, None], [1, 1], stats, _settings(floor=floor))
    beyond = [w - floor / 2 for w in weights]
    assert beyond[1] / beyond[0] == pytest.approx(0.1)
    assert weights == pytest.approx([0.05 + 0.9 * 10 / 11, 0.05 + 0.9 / 11])


def test_a_domain_whose_cost_is_unknown_scores_as_the_best_seen():
    stats = [TaskStats(spread=0.2, seen=8, cost_s=1.0), TaskStats(spread=0.2, seen=8, cost_s=4.0), TaskStats()]
    weights = STRATEGIES["learnability_per_cost"]([None] * 3, [1, 1, 1], stats, _settings(floor=0.0))
    assert weights == pytest.approx([0.2 / 0.45, 0.05 / 0.45, 0.2 / 0.45])


def test_costs_are_learned_from_tokens_sampling_seconds_and_reward_seconds():
    mixture = Mixture([Task("cheap"), Task("dear")], [1, 1], seed=0, strategy="learnability_per_cost",
                      settings=_settings(fast_rate=0.5))
    mixture.observe([_group("cheap", 10, 0.01), _group("cheap", 10, 0.01), _group("dear", 30, 0.5)])
    mixture.observe_sampling(1.0)  # 100 tokens: 0.01 s per token
    record = mixture.update()
    assert record["scheduler/s_per_token"] == pytest.approx(0.01)
    assert record["domain/cheap/cost_s"] == pytest.approx(10 * 0.01 + 0.01)
    assert record["domain/dear/cost_s"] == pytest.approx(30 * 0.01 + 0.5)
    assert record["domain/cheap/draw_share"] == pytest.approx(4 / 6)
    assert record["domain/cheap/token_share"] == pytest.approx(40 / 100)
    assert record["domain/dear/reward_time_share"] == pytest.approx(1.0 / 1.04)
    # both spread 0.25: the weights follow 1 / cost, with the default floor 0.1
    cheap, dear = 1 / 0.11, 1 / 0.8
    assert record["domain/cheap/weight"] == pytest.approx(0.05 + 0.9 * cheap / (cheap + dear))

    mixture.observe([_group("cheap", 30, 0.03)])  # the next step: only cheap drawn, 0.02 s per token
    mixture.observe_sampling(1.2)
    record = mixture.update()
    assert record["scheduler/s_per_token"] == pytest.approx(0.015)  # halfway, at fast_rate 0.5
    assert mixture.stats["cheap"].tokens == pytest.approx(20) and mixture.stats["cheap"].reward_s == pytest.approx(0.02)
    assert record["domain/cheap/cost_s"] == pytest.approx(20 * 0.015 + 0.02)
    assert record["domain/dear/cost_s"] == pytest.approx(30 * 0.015 + 0.5), "a domain not drawn keeps its averages"
    assert (record["domain/dear/draw_share"], record["domain/dear/token_share"]) == (0.0, 0.0)


def test_the_cost_state_round_trips_exactly():
    tasks = [Task("cheap"), Task("dear")]
    mixture = Mixture(tasks, [1, 1], seed=3, strategy="learnability_per_cost", settings=_settings())
    mixture.observe([_group("cheap", 10, 0.01), _group("dear", 30, 0.5)])
    mixture.observe_sampling(0.4)
    mixture.update()
    state = json.loads(json.dumps(mixture.state_dict()))
    expected = mixture.next_problems(20)

    resumed = Mixture(tasks, [1, 1], seed=99, strategy="learnability_per_cost", settings=_settings())
    resumed.load_state_dict(state)
    assert resumed.seconds_per_token == mixture.seconds_per_token
    assert resumed.stats == mixture.stats
    assert resumed.weights == mixture.weights and resumed.weights[0] > 0.8
    assert resumed.next_problems(20) == expected


def test_the_rewarder_gives_each_rollout_its_share_of_its_rewards_seconds():
    rewarder = Rewarder([TaskRewards("slow", {"test_scheduler_cost:sleepy": 1.0}, "exact_match"),
                         TaskRewards("fast", {"exact_match": 1.0}, "exact_match")])
    groups = [_group("slow", 2, 0.0, (0.0,) * 4), _group("fast", 2, 0.0, (0.0,) * 4)]
    try:
        rewarder.score(groups)
    finally:
        rewarder.close()
    slow = [r.reward_s for r in groups[0].rollouts]
    fast = [r.reward_s for r in groups[1].rollouts]
    assert len(set(slow)) == 1 and SLEEP_S <= slow[0] < 10 * SLEEP_S
    assert max(fast) < SLEEP_S / 2, "the fast domain is not charged for the slow reward"
