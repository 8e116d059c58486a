"""Adaptive mixtures on synthetic tasks whose success rates are fixed by the test."""

import json
import random
from dataclasses import dataclass

import pytest

from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.scheduler import Mixture, StaticMixture
from tempering.tasks import build_task
from tempering.types import Group, Problem, Rollout


def _settings(**fields):
    """A run's scheduler settings with ``fields`` (SchedulerConfig names) changed."""
    return scheduler_settings(SchedulerConfig(**fields))


SETTINGS = _settings()


@dataclass
class FakeTask:
    name: str
    rate: float
    size: int | None = None
    levels: int = 0
    level: int = 0
    domain: str = ""
    metric: str = "correct"

    split: bool = False
    """Problems of even index always solved, odd never: the task's rate is 1/2, no group varies."""

    def __post_init__(self):
        self.rewards = {"correct": 1.0}

    def rate_of(self, problem: Problem) -> float:
        return float(int(problem.id.split(":")[1]) % 2 == 0) if self.split else self.rate

    def train_problem(self, index: int) -> Problem:
        return Problem(task=self.name, id=f"{self.level}:{index}", prompt="", answer="")

    def eval_problems(self, n: int) -> list[Problem]:
        return []


def _run(mixture: Mixture, steps: int, rng: random.Random, group_size: int = 8) -> dict:
    """Sample, grade each rollout as correct with its task's rate, feed it back."""
    record = {}
    by_name = {t.name: t for t in mixture.tasks}
    for _ in range(steps):
        groups = []
        for problem in mixture.next_problems(16):
            rate = by_name[problem.task].rate_of(problem)
            rollouts = []
            for _ in range(group_size):
                x = float(rng.random() < rate)
                rollouts.append(Rollout(problem, [], [], [], "", "stop", 0, reward=x, reward_components={"correct": x}))
            groups.append(Group(problem, rollouts))
        mixture.observe(groups)
        record = mixture.update()
    return record


def _tasks():
    return [FakeTask("never", 0.0), FakeTask("half", 0.5), FakeTask("always", 1.0)]


@pytest.mark.parametrize("strategy", ["learnability"])
def test_most_weight_goes_to_the_learnable_task_and_the_floor_stays(strategy):
    mixture = Mixture(_tasks(), [1, 1, 1], seed=0, strategy=strategy, settings=_settings(floor=0.15))
    record = _run(mixture, 30, random.Random(0))
    assert record["domain/half/weight"] > 0.8
    for name in ("never", "always"):
        assert record[f"domain/{name}/weight"] == pytest.approx(0.05, abs=0.01)  # floor 0.15 / 3 tasks
    assert record["domain/never/dropped_groups"] > 0 and record["domain/always/dropped_groups"] > 0


def test_learnability_reads_the_variance_inside_groups_not_the_tasks_mean_rate():
    tasks = [FakeTask("split", 0.5, split=True), FakeTask("half", 0.5)]
    mixture = Mixture(tasks, [1, 1], seed=0, strategy="learnability", settings=_settings(floor=0.1))
    record = _run(mixture, 10, random.Random(0))
    split, half = mixture.stats["split"], mixture.stats["half"]
    assert split.fast == pytest.approx(0.5, abs=0.25) and half.fast == pytest.approx(0.5, abs=0.25), \
        "both tasks succeed about half the time"
    assert split.spread == 0.0 and half.spread > 0.15
    assert record["domain/half/weight"] > 0.9


@pytest.mark.parametrize("strategy", ["learnability", "learning_progress"])
def test_weights_follow_a_change_in_a_tasks_success_rate(strategy):
    tasks = _tasks()
    mixture = Mixture(tasks, [1, 1, 1], seed=0, strategy=strategy, settings=_settings(floor=0.1))
    rng = random.Random(1)
    _run(mixture, 20, rng)
    before = mixture.weights[0] / sum(mixture.weights)
    tasks[0].rate = 0.5  # 'never' starts being solved half the time
    tasks[1].rate = 1.0 if strategy == "learnability" else 0.5
    _run(mixture, 5, rng)
    after = mixture.weights[0] / sum(mixture.weights)
    assert after > 2 * before and after > 0.3


def test_temperature_flattens_dataset_sizes():
    tasks = [FakeTask("big", 0.5, size=10_000), FakeTask("small", 0.5, size=100)]
    weights = Mixture(tasks, [1, 1], seed=0, strategy="temperature", settings=_settings(temperature=2.0)).weights
    assert weights[0] / weights[1] == pytest.approx(10.0)  # 100x the data, sqrt -> 10x the draws


def test_a_curriculum_moves_up_when_a_level_is_mastered():
    task = FakeTask("climb", 1.0, levels=3)
    mixture = Mixture([task], [1], seed=0, strategy="static", settings=_settings(promote_at=0.8, min_samples=64))
    record = _run(mixture, 1, random.Random(0))  # 16 x 8 = 128 rollouts at level 0
    assert record["domain/climb/level"] == 1 and task.level == 1
    _run(mixture, 3, random.Random(0))
    assert task.level == 2, "stops at the top level"
    assert mixture.next_problems(1)[0].id.startswith("2:")


def test_an_adaptive_state_resumes_exactly():
    mixture = Mixture(_tasks(), [1, 1, 1], seed=3, strategy="learnability", settings=SETTINGS)
    _run(mixture, 4, random.Random(0))
    state = json.loads(json.dumps(mixture.state_dict()))
    expected = mixture.next_problems(20)
    resumed = Mixture(_tasks(), [1, 1, 1], seed=99, strategy="learnability", settings=SETTINGS)
    resumed.load_state_dict(state)
    assert resumed.weights == pytest.approx(mixture.weights)
    assert resumed.next_problems(20) == expected


def test_the_static_mixture_draws_what_it_always_drew():
    tasks = [build_task(name, seed=0) for name in ("add", "sub", "mul")]
    rng = random.Random(0)  # the draw before adaptive strategies existed: rng.choices over the weights
    expected = [t.name for t in rng.choices(tasks, weights=[1, 2, 3], k=50)]
    assert [p.task for p in StaticMixture(tasks, [1, 2, 3], seed=0, settings=SETTINGS).next_problems(50)] == expected


def test_an_unknown_strategy_names_the_known_ones():
    with pytest.raises(ValueError, match="known: learnability, learnability_per_cost, learning_progress, static, temperature"):
        Mixture(_tasks(), [1, 1, 1], seed=0, strategy="bandit", settings=SETTINGS)


def _draw_shares(mixture: Mixture, steps: int, rng: random.Random) -> dict[str, float]:
    """Each task's share of the draws over ``steps`` steps of :func:`_run`."""
    shares = {t.name: 0.0 for t in mixture.tasks}
    for _ in range(steps):
        record = _run(mixture, 1, rng)
        for name in shares:
            shares[name] += record[f"domain/{name}/weight"] / steps
    return shares


def test_a_pooled_prior_keeps_a_rarely_signalling_task_drawn_beside_learnable_ones():
    # 'rare' is right once in 25: most of its groups are all wrong, a few carry signal; drawn
    # about once a step, its per-step average is mostly one all-wrong group's zero
    def tasks():
        return [FakeTask(f"learnable{i}", rate) for i, rate in enumerate([0.5, 0.4, 0.3, 0.5, 0.35])] + \
            [FakeTask("rare", 0.04)]

    for seed in (1, 2):
        shares = {}
        for prior in (0, 8):
            mixture = Mixture(tasks(), [1] * 6, seed=seed, strategy="learnability",
                              settings=_settings(floor=0.1, pooled_prior=prior))
            shares[prior] = _draw_shares(mixture, 80, random.Random(seed))
        assert shares[8]["rare"] > 1.4 * shares[0]["rare"]
        assert min(shares[8][f"learnable{i}"] for i in range(5)) > 1.5 * shares[8]["rare"]


def test_a_pooled_prior_reads_evidence_by_groups_and_lets_it_fade():
    mixture = Mixture([FakeTask("half", 0.5), FakeTask("never", 0.0)], [1, 1], seed=0, strategy="learnability",
                      settings=_settings(pooled_prior=4, slow_rate=0.5))
    _run(mixture, 1, random.Random(0))
    half, never = mixture.stats["half"], mixture.stats["never"]
    assert half.spread_groups + never.spread_groups == 16  # every group of the step, once
    assert never.spread_sum == 0 and half.spread_sum > 0
    groups = never.spread_groups
    mixture.update()  # a step with nothing drawn: the evidence halves
    assert never.spread_groups == pytest.approx(groups / 2)
