"""The procedural code task graded by the ``code`` reward in the real sandbox: every family's
reference body passes all its hidden cases, its classic bugs do not, and ``partial`` gives
the share of cases passed."""

from __future__ import annotations

import pytest

from tempering.rewards.code import CodeReward
from tempering.tasks import build_task
from tempering.tasks.code_families import FAMILIES
from tempering.types import Problem, Rollout


@pytest.fixture(scope="module")
def reward(sandbox_executor):
    code = CodeReward()
    code._sandbox = sandbox_executor
    return code


def _rollout(problem: Problem, text: str) -> Rollout:
    return Rollout(problem, [1], [2], [0.0], text, "stop", 0)


def _problems_with_visible_bugs(task, count=400):
    """One training problem per family on which every bug fails some hidden case (in-process check)."""
    from tempering.tasks.code_families import reference, run_reference

    chosen = {}
    for index in range(count):
        problem = task.train_problem(index)
        family = next(f for f in FAMILIES if f.name == problem.meta["family"])
        cases = problem.meta["tests"]["cases"]
        if family.name in chosen:
            continue
        bugs = [reference(family, problem.meta["params"], b) for b in range(len(family.bugs))]
        if all(any(run_reference(bug, c["args"]) != (True, c["expected"]) for c in cases) for bug in bugs):
            chosen[family.name] = problem
    return chosen


def test_references_pass_and_classic_bugs_fail_in_the_sandbox(reward):
    task = build_task("code", seed=0, levels=[1, 2])
    chosen = _problems_with_visible_bugs(task)
    assert set(chosen) == {f.name for f in FAMILIES}
    problems, rollouts, expected = [], [], []
    for name, problem in chosen.items():
        family = next(f for f in FAMILIES if f.name == name)
        problems.append(problem)
        rollouts.append(_rollout(problem, task.solution(problem)))
        expected.append(1.0)
        for bug in range(len(family.bugs)):
            problems.append(problem)
            rollouts.append(_rollout(problem, task.solution(problem, buggy=True, bug=bug)))
            expected.append(0.0)
    results = reward.score_batch(problems, rollouts)
    got = [(p.meta["family"], r.score) for p, r in zip(problems, results)]
    assert got == [(p.meta["family"], e) for p, e in zip(problems, expected)]
    assert all(r.error is None for r in results)


def test_chat_answers_in_a_fenced_block_and_partial_credit(reward):
    task = build_task("code", seed=0, families=["last_n"], style="chat", partial=True)
    problem = next(p for p in (task.train_problem(i) for i in range(200)) if p.meta["params"]["k"] == 0)
    right = "Sure:\n```python\n" + problem.answer + "```\n"
    buggy = "```python\ndef last_n(xs):\n    return xs[-0:]\n```"
    scores = [r.score for r in reward.score_batch([problem] * 3, [
        _rollout(problem, right), _rollout(problem, buggy), _rollout(problem, "no code")])]
    cases = problem.meta["tests"]["cases"]
    passed_by_bug = sum(c["expected"] == c["args"][0] for c in cases)  # xs[-0:] is the whole list
    assert scores == [1.0, pytest.approx(passed_by_bug / len(cases)), 0.0]
    assert 0 < passed_by_bug < len(cases)
