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
    assert policy.shown == {256: 6, 512: 6, 1024: 6, 2048: 6}, "the 4 at its level are the first 6 at 256: sampled once"
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


class NearSighted(ShortSighted):
    """A policy that answers right exactly when the problem's evidence starts within its window
    of the question, however long the document."""

    def generate(self, problems, group_size, params, generator=None):
        groups = []
        for problem in problems:
            sentences, first = problem.meta.get("sentences"), min(problem.meta.get("evidence") or [0])
            near = sentences is None or len(" ".join(sentences[first:])) <= WINDOW
            text = f"answer: {problem.answer}" if near else "answer: 0000"
            groups.append(Group(problem, [Rollout(problem, [], [], [], text, "stop", 0) for _ in range(group_size)]))
        return groups


def test_accuracy_by_depth_splits_each_length_by_where_the_evidence_starts():
    from tempering.eval.sampled import metric_table

    tasks = _tasks()
    result = evaluate(NearSighted(), tasks, problems_per_task=4, max_new_tokens=8, problems_per_length=40)

    depth = result["by_depth"]
    assert list(depth) == ["long_context"], "only the task read at several lengths has depths"
    assert list(depth["long_context"]) == ["256", "512", "1024", "2048"]
    assert all(list(row) == ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"] for row in depth["long_context"].values())
    assert all(v in (1.0, None) for v in depth["long_context"]["256"].values()), "a short document is read whole"
    deep = depth["long_context"]["2048"]
    assert deep["0-20%"] == 0.0 and deep["80-100%"] == 1.0, "far evidence is missed, evidence by the question found"
    assert 0.0 < result["by_length"]["long_context"]["2048"] < 1.0
    assert not any("depth" in key for key in eval_record(result)), "depths stay in the summary, not the step records"
    table = metric_table({**result, "metrics": {}, "samples": {}, "notes": []})
    assert "long_context: greedy accuracy by length (tokens) and evidence depth" in table
    assert "2048" in table.splitlines()[-1] and table.splitlines()[-1].split()[2] == "0.0"
