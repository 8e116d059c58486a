"""Held-out accuracy against length: a long_context curriculum graded at each of its lengths."""

from tempering.eval.greedy import evaluate
from tempering.eval.sampled import sampled_evaluate
from tempering.rewards.base import build_reward
from tempering.tasks import build_task
from tempering.train import eval_record
from tempering.types import Group, Rollout

WINDOW = 600
"""The stub reader's window, in characters: a prompt longer than it is answered wrong."""


class ShortSighted:
    """A policy that answers right exactly when the whole prompt fits its window, and counts
    the problems it was shown at each length."""

    batch_size = 8

    def __init__(self):
        self.shown: dict[int, int] = {}

    def generate(self, problems, group_size, params, generator=None):
        groups = []
        for problem in problems:
            if "length_tokens" in problem.meta:
                length = problem.meta["length_tokens"]
                self.shown[length] = self.shown.get(length, 0) + 1
            text = f"answer: {problem.answer}" if len(problem.prompt) <= WINDOW else "answer: 0000"
            groups.append(Group(problem, [Rollout(problem, [], [], [], text, "stop", 0) for _ in range(group_size)]))
        return groups


def _tasks():
    return [build_task("long_context", seed=0, lengths=[256, 512, 1024, 2048], chars_per_token=1.0),
            build_task("add", seed=0)]


def test_accuracy_falls_past_the_length_the_policy_can_read_and_is_logged_per_length():
    policy = ShortSighted()
    tasks = _tasks()

    result = evaluate(policy, tasks, problems_per_task=4, max_new_tokens=8, problems_per_length=6)

    assert result["by_length"] == {"long_context": {"256": 1.0, "512": 1.0, "1024": 0.0, "2048": 0.0}}
    assert result["per_task"]["long_context"] == 1.0, "the task's own held-out problems are at its level, 256"
    assert policy.shown == {256: 4 + 6, 512: 6, 1024: 6, 2048: 6}
    record = eval_record(result)
    assert {k: v for k, v in record.items() if "/len_" in k} == {
        "eval/long_context/len_256": 1.0, "eval/long_context/len_512": 1.0,
        "eval/long_context/len_1024": 0.0, "eval/long_context/len_2048": 0.0}


def test_the_curve_is_read_on_the_same_problems_whatever_the_level_and_not_at_all_with_zero_per_length():
    tasks = _tasks()
    before = evaluate(ShortSighted(), tasks, 4, 8, problems_per_length=3)
    tasks[0].level = 3
    after = evaluate(ShortSighted(), tasks, 4, 8, problems_per_length=3)
    assert after["by_length"] == before["by_length"] and after["per_task"]["long_context"] == 0.0
    assert evaluate(ShortSighted(), tasks, 4, 8)["by_length"] == {}


def test_temper_eval_reads_the_same_curve():
    tasks = _tasks()[:1]
    metrics = {"exact_match": build_reward("exact_match", None)}
    found = sampled_evaluate(ShortSighted(), tasks, 2, 8, metrics, {}, None, {}, verifier=False, progress=False,
                             problems_per_length=6)
    assert found["by_length"] == evaluate(ShortSighted(), tasks, 2, 8, problems_per_length=6)["by_length"]
    assert found["by_length"]["long_context"]["1024"] == 0.0
