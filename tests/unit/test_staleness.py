"""Staleness per rollout: the pipeline keeps, and drops as too stale, each rollout by the policy
version that sampled it, not by the round that brought it; a group is dropped only when all
its rollouts are; the counts stay whole (sampled = trained + dropped + buffered per task).

The generator stamps each rollout with a version from a script (what a sampler whose engines
sit at different versions gives); the learner's version is set as ``publish`` would.
A batch former that decides per round fails these tests: the rounds here mix versions, so
keeping or dropping a round whole keeps a too-stale rollout or drops fresh ones."""

from tempering.build import scheduler_settings
from tempering.config import SchedulerConfig
from tempering.pipeline import Pipeline, RewardWorker, RolloutWorker
from tempering.versions import fresh_groups, staleness_record
from tempering.rollout.base import SamplingParams
from tempering.scheduler import Mixture
from tempering.tasks import build_task
from tempering.types import Group, Problem, Rollout


class Versions:
    """A generator whose k-th problem's rollouts carry the versions ``script[round][k]``."""

    def __init__(self, script: list[list[list[int]]]):
        self.script, self.rounds = script, 0

    def generate(self, problems, group_size, params, policy_version=0, generator=None):
        versions = self.script[self.rounds]
        self.rounds += 1
        return [Group(p, [Rollout(p, [1], [2], [-0.5], "x", "stop", v) for v in vs]) for p, vs in zip(problems, versions)]

    def load_weights(self, weights):
        pass


class Unscored:
    """Rewards that keep every rollout (the rewards are not what this tests)."""

    last_error = None

    def score(self, groups):
        return {"reward": 0.0}

    def state_dict(self):
        return {}


def _pipeline(script, learner_version: int, max_staleness: int) -> Pipeline:
    task = build_task("add", seed=0)
    mixture = Mixture([task], [1.0], 0, "static", scheduler_settings(SchedulerConfig()))
    rollout = RolloutWorker(Versions(script), SamplingParams(), group_size=2, seed=0)
    made = Pipeline(mixture, rollout, RewardWorker(Unscored()), prompts=len(script[0]), max_staleness=max_staleness)
    made.learner_version = learner_version
    return made


def _versions(groups: list[Group]) -> list[list[int]]:
    return [[r.policy_version for r in g.rollouts] for g in groups]


def test_each_rollout_is_kept_or_dropped_by_its_own_version():
    # the round's first rollout is fresh, so a round judged by it (or by its newest) keeps it all;
    # judged by its oldest, it is dropped whole
    made = _pipeline([[[5, 3], [3, 3], [4, 5]]], learner_version=5, max_staleness=1)

    taken = made.next_round()

    assert _versions(taken.groups) == [[5], [4, 5]], "the too-stale rollouts go, the group of only stale ones too"
    assert taken.staleness == 1
    assert made.counters.dropped_stale == 3
    made.settle(taken.groups)
    assert made.domain_counts()["add"] == {"sampled": 6, "trained": 3, "dropped": 3, "buffered": 0}


def test_a_round_whose_first_rollout_is_stale_keeps_its_fresh_ones():
    made = _pipeline([[[2, 2], [6, 6]]], learner_version=6, max_staleness=2)

    taken = made.next_round()

    assert _versions(taken.groups) == [[6, 6]]
    assert made.counters.rollouts_taken == 2 and made.counters.dropped_stale == 2


def test_a_round_with_no_fresh_rollout_is_skipped_for_the_next():
    made = _pipeline([[[1, 1]], [[3, 2]]], learner_version=3, max_staleness=1)

    taken = made.next_round()

    assert _versions(taken.groups) == [[3, 2]]
    made.settle(taken.groups)
    assert made.domain_counts()["add"] == {"sampled": 4, "trained": 2, "dropped": 2, "buffered": 0}


def test_max_staleness_keeps_its_meaning_at_the_boundary():
    problem = Problem(task="t", id="0", prompt="", answer="")
    group = Group(problem, [Rollout(problem, [], [], [], "", "stop", v) for v in (7, 6, 5, 4)])

    assert _versions(fresh_groups([group], 7, 0)[0]) == [[7]]
    assert _versions(fresh_groups([group], 7, 2)[0]) == [[7, 6, 5]]
    assert fresh_groups([group], 7, 3) == ([group], {}), "a group fresh enough throughout is the same group"
    assert fresh_groups([group], 10, 2) == ([], {"t": 4})


def test_the_staleness_record_has_a_mean_a_max_and_a_histogram_per_version_behind():
    problem = Problem(task="t", id="0", prompt="", answer="")
    groups = [Group(problem, [Rollout(problem, [], [], [], "", "stop", v) for v in vs]) for vs in ([9, 8], [9, 7])]

    record = staleness_record(groups, learner_version=9, max_staleness=3)

    assert record == {"staleness/hist/0": 2, "staleness/hist/1": 1, "staleness/hist/2": 1, "staleness/hist/3": 0,
                      "staleness/mean": 0.75, "staleness/max": 2, "staleness/token_mean": 0.0}
    assert staleness_record([], 9, 0) == {"staleness/hist/0": 0, "staleness/mean": 0.0, "staleness/max": 0,
                                          "staleness/token_mean": 0.0}


def test_the_token_mean_counts_each_token_by_the_version_that_drew_it():
    """A partial rollout (new weights from its third token on) is as stale as its oldest token
    for the rollout counts, and fresher token by token."""
    problem = Problem(task="t", id="0", prompt="", answer="")
    partial = Rollout(problem, [1], [2, 3, 4, 5], [-0.5] * 4, "", "stop", 7, versions=[7, 7, 9, 9])
    whole = Rollout(problem, [1], [2, 3], [-0.5] * 2, "", "stop", 8)

    record = staleness_record([Group(problem, [partial, whole])], learner_version=9, max_staleness=2)

    assert record["staleness/mean"] == 1.5 and record["staleness/max"] == 2
    assert record["staleness/token_mean"] == (2 + 2 + 0 + 0 + 1 + 1) / 6
