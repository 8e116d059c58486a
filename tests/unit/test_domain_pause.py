"""A domain whose grader is down while the others score: paused, probed with backoff, re-admitted.

A real :class:`Rewarder` scores two tasks: ``add`` with its own rewards, ``sub`` with a grader
plug-in that the test takes down and brings back. The generator writes each rollout's round
into its text, and records which problems each round drew.
"""

import pytest

from tempering import pipeline as pipeline_module
from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.pipeline import GraderOutage, Pipeline, RewardWorker, RolloutWorker
from tempering.rewards import Rewarder
from tempering.rewards.base import RewardResult
from tempering.rollout.base import SamplingParams
from tempering.scheduler import Mixture
from tempering.tasks import build_task
from tempering.types import Group, Rollout

GRADER = "test_domain_pause:Grader"


class Grader:
    """A remote grader that raises while ``down``; it counts the rollouts it was asked to score."""

    def __init__(self):
        self.down = False
        self.asked = 0

    def score_batch(self, problems, rollouts):
        self.asked += len(rollouts)
        if self.down:
            raise ConnectionError("the grader at 127.0.0.1:9 refused the connection")
        return [RewardResult(1.0) for _ in rollouts]


class Rounds:
    """A generator whose rollouts' text is the number of the sampling round that made them."""

    def __init__(self):
        self.tasks = []

    def generate(self, problems, group_size, params, policy_version=0, generator=None):
        self.tasks.append([p.task for p in problems])
        text = str(len(self.tasks) - 1)
        return [Group(p, [Rollout(p, [1], [2], [-0.5], text, "stop", policy_version) for _ in range(group_size)])
                for p in problems]

    def load_weights(self, weights):
        pass


def _pipeline(tasks=("add", "sub"), **options):
    built = [build_task(name, seed=0) for name in tasks]
    for task in built[1:]:
        task.rewards = {GRADER: 1.0}
    rewarder = Rewarder(built)
    generator = Rounds()
    rollout = RolloutWorker(generator, SamplingParams(), group_size=2, seed=0)
    mixture = Mixture(built, [1.0] * len(built), 0, "static", scheduler_settings(SchedulerConfig()))
    options = {"max_outage_rounds": 4, "outage_backoff_s": 5.0, **options}  # the config's defaults
    made = Pipeline(mixture, rollout, RewardWorker(rewarder), prompts=4, **options)
    return made, generator, rewarder.rewards[GRADER]


@pytest.fixture
def waits(monkeypatch):
    """The pipeline's sleeps, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(pipeline_module.time, "sleep", slept.append)
    return slept


def test_a_domain_whose_grader_fails_while_the_others_score_is_no_longer_drawn(waits):
    made, generator, grader = _pipeline()
    made.next_round()
    assert "sub" in generator.tasks[0]
    grader.down = True

    failed = made.next_round()
    assert {g.problem.task for g in failed.groups} == {"add"}, "its in-flight rollouts are not trained on"
    for _ in range(4):
        made.next_round()

    assert all(task == "add" for tasks in generator.tasks[2:] for task in tasks), generator.tasks
    assert made.mixture.paused_tasks() == ["sub"]
    assert waits == [], "a partial outage is not waited out: the other domains go on at once"
