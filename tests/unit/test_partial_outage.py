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
from tempering.rewards.normalize import NormalizeSettings
from tempering.rollout.base import SamplingParams
from tempering.scheduler import Mixture
from tempering.tasks import build_task
from tempering.types import Group, Rollout

GRADER = "test_partial_outage:Grader"


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


def _pipeline(tasks=("add", "sub"), graded=("sub",), normalize=None, **options):
    """A pipeline over ``tasks``; those in ``graded`` are scored by the grader, the others by their
    own rewards; ``normalize``: the rewarder's normalization of every domain."""
    built = [build_task(name, seed=0) for name in tasks]
    for task in built:
        if task.name in graded:
            task.rewards = {GRADER: 1.0}
    rewarder = Rewarder(built, default_normalize=normalize)
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


def _rounds(made, count):
    """``count`` rounds, each settled as a step that trains on all of it (as ``temper train`` does)."""
    for _ in range(count):
        made.settle(made.next_round().groups)


def _balanced(made):
    counts = made.domain_counts()
    assert all(c["sampled"] == c["trained"] + c["dropped"] + c["buffered"] for c in counts.values()), counts
    return counts


def test_a_paused_domain_is_probed_with_backoff_and_readmitted_when_its_grader_answers(waits):
    made, generator, grader = _pipeline(probe_rounds=1, max_probe_rounds=4)
    _rounds(made, 1)
    grader.down = True
    asked = []
    for _ in range(13):
        before = grader.asked
        _rounds(made, 1)
        asked.append(grader.asked - before)
    # round 1 scores its sub rollouts and pauses sub; probes at rounds 2, 4, 8, 12: one rollout, asked
    # twice (the batch raises, then the rollout alone: score_contained)
    assert asked[0] > 2 and asked[1:] == [2, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0], asked
    pause = made.mixture.paused["sub"]
    assert (pause.since, pause.probes, pause.probe_at) == (1, 4, 16)
    record = made.mixture.update()
    assert (record["domain/sub/weight"], record["domain/add/weight"]) == (0.0, 1.0), "its share goes to the others"
    assert made.mixture.pause_record() == {"paused_domains": 1, "domain/add/paused": 0.0, "domain/add/pauses": 0,
                                           "domain/sub/paused": 1.0, "domain/sub/pauses": 1}

    grader.down = False
    _rounds(made, 4)  # the probe at round 16 scores: sub is drawn again from that round on
    assert made.mixture.paused_tasks() == []
    assert "sub" in generator.tasks[16] and all("sub" not in tasks for tasks in generator.tasks[2:16])
    assert made.mixture.pause_record()["domain/sub/pauses"] == 1
    counts = _balanced(made)
    assert counts["sub"]["dropped"] == len([t for t in generator.tasks[1] if t == "sub"]) * 2, \
        "the rollouts in flight when the grader went down are dropped and counted, probes are not"
    assert counts["add"]["dropped"] == 0 and counts["add"]["trained"] == counts["add"]["sampled"]
    assert made.counters.outage_rounds == 0 and waits == []


def test_a_round_that_drew_only_the_failing_domain_is_drawn_again_from_the_others(waits):
    made, generator, grader = _pipeline(tasks=("add", "sub", "mul"), graded=("sub", "mul"))
    grader.down = True
    _rounds(made, 3)
    assert made.mixture.paused_tasks() == ["sub", "mul"]
    assert made.mixture.drawable() == ["add"]
    assert all(task == "add" for tasks in generator.tasks[-2:] for task in tasks)
    assert waits == [] and made.counters.outage_rounds == 0
    _balanced(made)


def test_every_domain_down_is_the_whole_run_outage_it_was(waits):
    made, generator, grader = _pipeline(graded=("add", "sub"))
    grader.down = True
    with pytest.raises(GraderOutage, match="dropped every rollout of 5 sampling rounds in a row"):
        made.next_round()
    assert waits == [5.0, 10.0, 20.0, 40.0]
    assert len({tuple(tasks) for tasks in generator.tasks}) == 1, "the same problems, sampled again"
    assert made.mixture.paused_tasks() == [], "no domain is paused when none is left to draw from"


def test_without_pause_failing_the_domain_keeps_being_drawn(waits):
    made, generator, grader = _pipeline(pause_failing=False)
    grader.down = True
    _rounds(made, 4)
    assert all("sub" in tasks for tasks in generator.tasks[:4])
    assert made.mixture.paused_tasks() == []


def test_a_resumed_pipeline_probes_and_draws_as_the_uninterrupted_one(waits):
    reference, drawn, grader = _pipeline(probe_rounds=1, max_probe_rounds=4)
    grader.down = True
    _rounds(reference, 3)
    state = {"mixture": reference.mixture.state_dict(), "pipeline": reference.state_dict()}
    _rounds(reference, 6)
    grader.down = False
    _rounds(reference, 6)

    resumed, again, grader = _pipeline(probe_rounds=1, max_probe_rounds=4)
    resumed.mixture.load_state_dict(state["mixture"])
    resumed.load_state_dict(state["pipeline"])
    assert resumed.mixture.paused_tasks() == ["sub"]
    grader.down = True
    _rounds(resumed, 6)
    grader.down = False
    _rounds(resumed, 6)
    assert again.tasks == drawn.tasks[3:], "the same draws, the same round of re-admission"
    assert resumed.domain_counts() == reference.domain_counts()
    assert resumed.mixture.pause_record() == reference.mixture.pause_record()


def test_an_async_pipeline_pauses_the_domain_and_keeps_feeding(waits):
    made, generator, grader = _pipeline(mode="async", buffer_rounds=2)
    grader.down = True
    made.start()
    try:
        _rounds(made, 6)
        with made.scheduler_lock():
            assert made.mixture.paused_tasks() == ["sub"]
        made.pause()
        _balanced(made)
    finally:
        made.close()


def test_the_last_task_left_to_draw_from_cannot_be_paused():
    mixture = Mixture([build_task("add", seed=0), build_task("sub", seed=0)], [1.0, 1.0], 0, "static",
                      scheduler_settings(SchedulerConfig()))
    mixture.pause("sub", 0, 1)
    with pytest.raises(ValueError, match="'add' is the only one left"):
        mixture.pause("add", 0, 1)
    assert all(p.task == "add" for p in mixture.next_problems(20))
    mixture.readmit("sub")
    assert {p.task for p in mixture.next_problems(20)} == {"add", "sub"}


def test_a_probe_changes_nothing_of_the_rewarder():
    made, _, grader = _pipeline(normalize=NormalizeSettings(mode="ema", decay=0.9, clip=0.0, smoothing=0.0))
    rewarder = made.reward.rewarder
    _rounds(made, 1)
    grader.down = True
    _rounds(made, 2)
    held = made.state_dict()["held"]["sub"]
    before = (rewarder.last_error, rewarder.state_dict(), [r.reward for r in held.rollouts])
    assert "sub" in before[1]["normalizer"]["moments"], "sub was scored, and normalized, before the outage"
    assert rewarder.probe(held) == (GRADER, "ConnectionError: the grader at 127.0.0.1:9 refused the connection")
    grader.down = False
    assert rewarder.probe(held) is None
    assert (rewarder.last_error, rewarder.state_dict(), [r.reward for r in held.rollouts]) == before
