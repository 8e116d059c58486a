"""Grader outages in the pipeline: a round whose every rollout the rewards dropped is waited out
and sampled again within ``max_outage_rounds``, then stops with :class:`GraderOutage`, keeping
the round's problems for a resumed run. A real :class:`Rewarder` scores with a grader plug-in
that is down for the first rounds; the generator writes each rollout's round into its text."""

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

GRADER = "test_outage:Grader"


class Grader:
    """A remote grader that is down (raises) for rollouts of the rounds before ``down_until``."""

    def __init__(self, *, down_until: int = 0):
        self.down_until = down_until

    def score_batch(self, problems, rollouts):
        if any(int(r.text) < self.down_until for r in rollouts):
            raise ConnectionError("the grader at 127.0.0.1:9 refused the connection")
        return [RewardResult(float(int(r.text) % 2)) for r in rollouts]


class Rounds:
    """A generator whose rollouts' text is the number of the sampling round that made them."""

    def __init__(self):
        self.problems = []

    def generate(self, problems, group_size, params, policy_version=0, generator=None):
        self.problems.append([p.key for p in problems])
        text = str(len(self.problems) - 1)
        return [Group(p, [Rollout(p, [1], [2], [-0.5], text, "stop", policy_version) for _ in range(group_size)])
                for p in problems]

    def load_weights(self, weights):
        pass


def _pipeline(down_until: int, max_outage_rounds: int, backoff_s: float = 0.0, mode: str = "sync"):
    task = build_task("add", seed=0)
    task.rewards = {GRADER: 1.0}
    rewarder = Rewarder([task], {GRADER: {"down_until": down_until}})
    generator = Rounds()
    rollout = RolloutWorker(generator, SamplingParams(), group_size=2, seed=0)
    made = Pipeline(Mixture([task], [1.0], 0, "static", scheduler_settings(SchedulerConfig())), rollout, RewardWorker(rewarder), prompts=2,
                    mode=mode, max_outage_rounds=max_outage_rounds, outage_backoff_s=backoff_s)
    return made, generator


@pytest.fixture
def waits(monkeypatch):
    """The pipeline's sleeps, recorded instead of slept."""
    slept = []
    monkeypatch.setattr(pipeline_module.time, "sleep", slept.append)
    return slept


def test_outage_rounds_are_waited_out_and_the_same_problems_sampled_again(waits):
    made, generator = _pipeline(down_until=2, max_outage_rounds=2, backoff_s=0.5)

    scored = made.next_round()

    assert len(generator.problems) == 3 and generator.problems[0] == generator.problems[1] == generator.problems[2]
    assert made.counters.outage_rounds == 2
    assert waits == [0.5, 1.0], "the wait doubles with each outage in a row"
    assert [r.text for g in scored.groups for r in g.rollouts] == ["2"] * 4
    assert scored.record["reward/dropped"] == 0
    made.next_round()
    assert generator.problems[3] != generator.problems[0], "a scored round resets the count and draws anew"
    assert made.counters.outage_rounds == 2


def test_past_the_budget_the_outage_names_the_reward_and_keeps_the_round_for_a_resumed_run(waits):
    made, generator = _pipeline(down_until=10, max_outage_rounds=2)

    with pytest.raises(GraderOutage) as caught:
        made.next_round()

    outage = caught.value
    assert (outage.reward, outage.rounds) == (GRADER, 3)
    assert outage.error == "ConnectionError: the grader at 127.0.0.1:9 refused the connection"
    assert str(outage).startswith(f"reward {GRADER!r} dropped every rollout of 3 sampling rounds in a row")
    state = made.state_dict()
    assert [p.key for p in state["outage_problems"]] == generator.problems[0]

    resumed, again = _pipeline(down_until=0, max_outage_rounds=2)
    resumed.load_state_dict(state)
    resumed.next_round()
    assert again.problems == [generator.problems[0]], "the resumed run samples the unscored round first"


def test_no_budget_stops_at_the_first_outage_and_waits_are_capped(waits):
    made, _ = _pipeline(down_until=1, max_outage_rounds=0)
    with pytest.raises(GraderOutage):
        made.next_round()
    assert waits == []

    made, _ = _pipeline(down_until=3, max_outage_rounds=5, backoff_s=400.0)
    made.next_round()
    assert waits == [400.0, pipeline_module.MAX_OUTAGE_WAIT_S, pipeline_module.MAX_OUTAGE_WAIT_S]


def test_an_async_pipeline_raises_the_outage_itself(waits):
    made, _ = _pipeline(down_until=10, max_outage_rounds=1, mode="async")
    made.start()
    try:
        with pytest.raises(GraderOutage, match="dropped every rollout of 2 sampling rounds"):
            made.next_round()
    finally:
        made.close()
