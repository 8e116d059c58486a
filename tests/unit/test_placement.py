"""Every placement of a worker keeps its handle's protocol, and pools share a round as one worker would.

The protocol check is structural and by name: each method of :class:`RolloutHandle` or
:class:`RewardHandle` must be on the implementation with the same parameters, and so must it
be on the Ray actor's class, which the Ray handle calls by attribute.
"""

import inspect

import pytest

from tempering.pipeline import RewardWorker, RolloutWorker
from tempering.placement import (RayReward, RayRollout, RewardHandle, RewardPool, RolloutHandle, RolloutPool,
                                 _RewardShell, _RolloutShell)
from tempering.rollout.base import SamplingParams
from tempering.types import Group, Problem


def protocol_members(protocol: type) -> tuple[set[str], dict[str, list[str]]]:
    """The protocol's attributes and its methods with their parameter names."""
    methods = {name: list(inspect.signature(value).parameters) for name, value in vars(protocol).items()
               if inspect.isfunction(value) and not name.startswith("_")}
    return set(vars(protocol).get("__annotations__", {})), methods


RAY_TRACING = "_ray_trace_ctx"
"""The keyword Ray adds to an actor class's methods, in place, once a run has made it an actor."""


def missing(implementation: type, protocol: type, attributes: bool = True) -> list[str]:
    """What ``implementation`` lacks of ``protocol``, or has with other parameters."""
    names, methods = protocol_members(protocol)
    annotated = {name for klass in implementation.__mro__ for name in vars(klass).get("__annotations__", {})}
    wrong = [name for name in names if attributes and not (hasattr(implementation, name) or name in annotated)]
    for name, parameters in methods.items():
        found = getattr(implementation, name, None)
        if not callable(found):
            wrong.append(f"{name}()")
        elif [p for p in inspect.signature(found).parameters if p != RAY_TRACING] != parameters:
            wrong.append(f"{name}{inspect.signature(found)}, not ({', '.join(parameters)})")
    return wrong


@pytest.mark.parametrize("implementation, protocol", [
    (RolloutWorker, RolloutHandle), (RayRollout, RolloutHandle), (RolloutPool, RolloutHandle),
    (RewardWorker, RewardHandle), (RayReward, RewardHandle), (RewardPool, RewardHandle),
])
def test_each_placement_keeps_its_handles_protocol(implementation, protocol):
    assert missing(implementation, protocol) == []


@pytest.mark.parametrize("shell, protocol", [(_RolloutShell, RolloutHandle), (_RewardShell, RewardHandle)])
def test_the_actor_answers_every_call_its_ray_handle_makes(shell, protocol):
    assert missing(shell, protocol, attributes=False) == []


def test_a_missing_method_or_other_parameters_fail_the_check():
    class NoReseed:
        restarts = 0

        def sample(self, problems): ...

        def set_weights(self, weights): ...

        def sampler_record(self): ...

        def state_dict(self): ...

        def load_state_dict(self, state): ...

        def close(self): ...

    assert missing(NoReseed, RolloutHandle) == ["set_weights(self, weights), not (self, weights, version)",
                                                "reseed()"]
    assert not isinstance(NoReseed(), RolloutHandle)


def test_local_workers_are_their_own_handles():
    assert isinstance(RolloutWorker(None, SamplingParams(), group_size=2, seed=0), RolloutHandle)
    assert isinstance(RewardWorker(None), RewardHandle)


class Scripted:
    """A handle that answers from a script and records what it was given."""

    def __init__(self, seconds: float, error=None):
        self.seconds, self.error, self.given, self.restarts = seconds, error, [], 0

    def sample(self, problems):
        self.given.append(problems)
        return [Group(problem, []) for problem in problems]

    def set_weights(self, weights, version):
        self.given.append(version)
        return self.seconds

    def score(self, groups):
        self.given.append(groups)
        return groups, {"reward": self.seconds, "reward/dropped": 1}

    def last_error(self):
        return self.error

    def probe(self, group):
        self.given.append(group)
        return self.error

    def close(self):
        self.given.append("closed")


def test_a_rollout_pool_shares_problems_in_order_and_waits_for_the_slowest():
    first, second = Scripted(0.5), Scripted(2.0)
    pool = RolloutPool([first, second])
    problems = [Problem("add", f"p{i}", "1+1=", str(i)) for i in range(5)]
    assert [group.problem for group in pool.sample(problems)] == problems
    assert (first.given, second.given) == ([problems[:3]], [problems[3:]])
    assert pool.set_weights({}, 7) == 2.0 and first.given[-1] == second.given[-1] == 7
    pool.close()


def test_a_reward_pool_merges_records_and_gives_the_first_error():
    pool = RewardPool([Scripted(1.0), Scripted(0.0, ("math", "down"))])
    groups = [Group(Problem("add", "q", "1+1=", "2"), [1]), Group(Problem("add", "r", "2+2=", "4"), [2, 3, 4])]
    scored, record = pool.score(groups)
    assert scored == groups and record == {"reward": 0.25, "reward/dropped": 2}
    assert pool.last_error() == ("math", "down")
    pool.close()


def test_a_reward_pool_probes_a_paused_domain_on_its_first_worker():
    first, second = Scripted(0.0, ("code", "refused")), Scripted(0.0)
    group = Group(Problem("code", "q", "", ""), [1])
    pool = RewardPool([first, second])
    assert pool.probe(group) == ("code", "refused")
    assert (first.given, second.given) == ([group], [])
    pool.close()


def test_the_ray_learner_answers_every_call_the_loop_makes_with_the_learners_parameters():
    from tempering.learner.step import Learner
    from tempering.placement import RayLearner

    for name in ("step", "values", "reward_penalty", "teacher_logprobs", "grad_shares", "state_dict",
                 "load_state_dict"):
        assert list(inspect.signature(getattr(RayLearner, name)).parameters) == \
            list(inspect.signature(getattr(Learner, name)).parameters), name
    assert RayLearner.parallel is None, "the loop leaves the ranks to the actors"


def test_a_custom_resource_no_live_node_offers_is_refused_naming_the_field(monkeypatch):
    ray = pytest.importorskip("ray")
    from tempering.config import ConfigError
    from tempering.placement import ActorResources

    monkeypatch.setattr(ray, "nodes", lambda: [
        {"Alive": True, "Resources": {"CPU": 2.0, "rollout": 1.0, "node:10.0.0.2": 1.0}},
        {"Alive": False, "Resources": {"CPU": 2.0, "learner": 1.0}}])  # stopped: offers nothing
    ActorResources({"rollout": 0.5}, "pipeline.rollout_resources").check_offered()
    ActorResources({}, "pipeline.reward_resources").check_offered()
    with pytest.raises(ConfigError) as refused:
        ActorResources({"learner": 1.0}, "pipeline.learner_resources").check_offered()
    assert str(refused.value).startswith("pipeline.learner_resources={learner: 1}: no live node")
    assert "custom resources: {rollout: 1})" in str(refused.value)
    assert """--resources '{"learner": 1}'""" in str(refused.value)
    with pytest.raises(ConfigError, match="rollout_resources"):
        ActorResources({"rollout": 2.0}, "pipeline.rollout_resources").check_offered()
