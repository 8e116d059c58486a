"""Rewards that start before their round is scored: a sampler in this process reports each
completion as it stops, and the pipeline hands it to the rewards that can begin on it
(``RewardWorker.begin``), only when both workers are in this process."""

from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.pipeline import Pipeline, RewardWorker, RolloutWorker
from tempering.rewards import Rewarder
from tempering.rewards.base import RewardResult
from tempering.rollout.base import SamplingParams
from tempering.scheduler import Mixture
from tempering.tasks import build_task
from tempering.types import Group, Rollout

STARTER = "test_early_rewards:Starter"
BEGUN: list[tuple[str, str]] = []


class Starter:
    """A reward that notes what it was given to begin on, and pays 1 for it at scoring."""

    def begin(self, problem, completion):
        BEGUN.append((problem.key, completion))

    def score_batch(self, problems, rollouts):
        return [RewardResult(float((p.key, r.text) in BEGUN)) for p, r in zip(problems, rollouts)]


class Reporting:
    """A generator that finishes the first completion of each group early and says so."""

    reports_finished = True

    def generate(self, problems, group_size, params, policy_version=0, generator=None, on_finished=None):
        groups = [Group(p, [Rollout(p, [1], [2], [-0.5], f"{p.key}/{j}", "stop", policy_version)
                            for j in range(group_size)]) for p in problems]
        for group in groups:
            if on_finished is not None:
                on_finished(group.problem, group.rollouts[0].text)
        return groups

    def load_weights(self, weights):
        pass


def _pipeline(generator, reward=STARTER):
    BEGUN.clear()
    task = build_task("add", seed=0)
    task.rewards = {reward: 1.0}
    rewarder = Rewarder([task])
    rollout = RolloutWorker(generator, SamplingParams(), group_size=3, seed=0)
    mixture = Mixture([task], [1.0], 0, "static", scheduler_settings(SchedulerConfig()))
    return Pipeline(mixture, rollout, RewardWorker(rewarder), prompts=2)


def test_completions_the_sampler_finishes_early_reach_the_rewards_that_can_begin_on_them():
    scored = _pipeline(Reporting()).next_round()
    firsts = [(g.problem.key, f"{g.problem.key}/0") for g in scored.groups]
    assert BEGUN == firsts
    assert [[r.reward for r in g.rollouts] for g in scored.groups] == [[1.0, 0.0, 0.0]] * 2


def test_nothing_begins_without_a_reward_that_can_or_a_sampler_that_reports():
    class Silent(Reporting):
        reports_finished = False

    _pipeline(Silent()).next_round()
    assert BEGUN == []
    plain = _pipeline(Reporting(), reward="exact_match")
    assert plain._on_finished is None, "no reward of the tasks has begin"
    plain.next_round()
