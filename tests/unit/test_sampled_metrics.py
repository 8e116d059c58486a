"""Sampled evaluation's bookkeeping on hand-made samples, and how `temper eval` reads its arguments."""

import pytest

from tempering.cli import _eval_inputs, build_parser
from tempering.config import ConfigError
from tempering.eval.sampled import (VOTE_KEYS, ProblemSamples, SampledSettings, TaskSamples, metric_table,
                                    sampled_evaluate, task_metrics, truncation_notes)
from tempering.rewards.base import FunctionReward, RewardResult
from tempering.rollout.base import SamplingParams
from tempering.tasks import build_task
from tempering.types import Group, Problem, Rollout, Turn


def _samples(*problems: ProblemSamples, votes: bool = True) -> TaskSamples:
    count = sum(len(p.scores) for p in problems)
    return TaskSamples(list(problems), samples=count, grader_errors=0, truncated=0, votes=votes)


def test_task_metrics_average_each_problems_estimate_and_count_the_problems():
    samples = _samples(ProblemSamples([1, 0], ["4", "5"], {"rm": [0.1, 0.9]}),
                       ProblemSamples([1, 1], ["9", "9"], {"rm": [0.5, 0.5]}))

    found = task_metrics(samples, [1, 2], seed=0, verifier=True)

    assert found["pass@1"]["value"] == pytest.approx(0.75)
    assert found["pass@2"]["value"] == 1.0
    assert found["maj@2"]["value"] == pytest.approx((0.5 + 1) / 2), "a tie between 4 and 5 is worth half"
    assert found["best_of@2[rm]"]["value"] == pytest.approx(0.5), "the RM prefers the wrong sample of problem 1"
    assert found["best_of@2[verifier]"]["value"] == 1.0
    assert found["best_of@1[rm]"]["value"] == found["pass@1"]["value"], "best of one is any one"
    assert all(entry["problems"] == 2 for entry in found.values())
    for entry in found.values():
        low, high = entry["ci"]
        assert low <= entry["value"] <= high


def test_a_problem_left_with_fewer_than_k_graded_samples_is_left_out_of_that_k_only():
    samples = _samples(ProblemSamples([1, 0, 0], ["1", "2", "3"]), ProblemSamples([1], ["1"]))

    found = task_metrics(samples, [1, 3], seed=0)

    assert found["pass@1"]["problems"] == 2 and found["pass@1"]["value"] == pytest.approx((1 / 3 + 1) / 2)
    assert found["pass@3"]["problems"] == 1 and found["pass@3"]["value"] == 1.0
    assert "best_of@1[verifier]" not in found, "only when asked"


def test_a_metric_without_answers_gets_no_maj_at_k():
    found = task_metrics(_samples(ProblemSamples([1, 0], [None, None]), votes=False), [1], seed=0)
    assert "maj@1" not in found and "pass@1" in found


# Each problem's two samples as (correct, model turns); the greedy episode is the first.
EPISODES = [[(True, 1), (True, 2)], [(True, 3), (False, 3)], [(False, 3), (True, 2)], [(False, 1), (False, 3)]]


class ScriptedEpisodes:
    """A generator that plays the episodes of ``EPISODES``, problem by problem, in place of a model."""

    batch_size = 8

    def __init__(self, problems: list[Problem]):
        self.plan = {p.key: EPISODES[i] for i, p in enumerate(problems)}

    def generate(self, problems, group_size, params, generator=None):
        return [Group(p, [_episode(p, *self.plan[p.key][j]) for j in range(group_size)]) for p in problems]


def _episode(problem: Problem, correct: bool, turns: int) -> Rollout:
    text = problem.answer if correct else "wrong"
    done = [Turn("wrong", 0, 0, "stop") for _ in range(turns - 1)] + [Turn(text, 0, 0, "stop")]
    return Rollout(problem, [], [], [], text, "stop", 0, turns=done if turns > 1 else [])


class Matches:
    def score_batch(self, problems, rollouts):
        return [RewardResult(float(r.text == p.answer)) for p, r in zip(problems, rollouts)]


def test_pass_at_k_and_greedy_by_round_count_only_samples_solved_within_r_turns():
    task = build_task("add", seed=0)
    settings = SampledSettings(2, (1, 2), SamplingParams(), seed=0)

    found = sampled_evaluate(ScriptedEpisodes(task.eval_problems(4)), [task], 4, 8, {task.metric: Matches()}, {},
                             settings, {}, verifier=False, progress=False, rounds={task.name: 3})["metrics"]["add"]

    values = {name: entry["value"] for name, entry in found.items()}
    assert values["greedy"] == 0.5 and values["pass@1"] == 0.5 and values["pass@2"] == 0.75
    assert [values[f"greedy[round<={r}]"] for r in (1, 2, 3)] == [0.25, 0.25, 0.5]
    assert [values[f"pass@1[round<={r}]"] for r in (1, 2, 3)] == [0.125, 0.375, 0.5]
    assert [values[f"pass@2[round<={r}]"] for r in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert "pass@1[round<=4]" not in values
    for name, entry in found.items():
        low, high = entry["ci"]
        assert low <= entry["value"] <= high and entry["problems"] == 4, name
    assert found["greedy[round<=3]"] == found["greedy"], "the last round is the plain metric, interval included"


def test_a_task_outside_an_environment_has_no_by_round_metrics():
    samples = TaskSamples([ProblemSamples([1, 0], [None, None])], 2, 0, 0, votes=False)
    assert not any("round" in name for name in task_metrics(samples, [1], seed=0))
    assert task_metrics(samples, [1], seed=0, rounds=1)["pass@1[round<=1]"]["value"] == 0.5, "one completion is one turn"


def test_vote_keys_read_the_answer_as_the_metric_reads_it():
    strict = Problem(task="t", id="0", prompt="", answer="46")
    lenient = Problem(task="t", id="0", prompt="", answer="46", meta={"grading": "lenient"})
    assert VOTE_KEYS["exact_match"](strict, "12+34=46\nanswer: 46.", {}) == "46"
    assert VOTE_KEYS["exact_match"](strict, "the sum is 46", {}) is None
    assert VOTE_KEYS["exact_match"](lenient, "the sum is 46.0", {}) == "46"
    assert VOTE_KEYS["match"](strict, "the sum is 46", {"last_number": True}) == "46"
    assert VOTE_KEYS["match"](strict, r"so \boxed{0.50}", {}) == "1/2"
    assert VOTE_KEYS["reasoning_gym"](lenient, "so 12 + 34 = 46", {}) == "46"


def test_the_table_shows_each_metric_per_task_with_its_interval_and_the_notes():
    result = {"metrics": {"add": {"greedy": {"value": 0.25, "ci": [0.1, 0.5], "problems": 8},
                                  "pass@2": {"value": None, "ci": None, "problems": 0}}},
              "samples": {"add": {"samples": 16, "grader_errors": 1, "truncated": 3, "mean_score": 0.2}},
              "notes": ["add: a note"]}
    lines = metric_table(result).splitlines()
    assert lines[0].split() == ["metric", "add"]
    assert lines[1].split() == ["greedy", "25.0", "[10.0,", "50.0]"]
    assert lines[2].split() == ["pass@2", "n/a"]
    assert [line.split() for line in lines[3:6]] == [["samples", "16"], ["grader_errors", "1"], ["truncated", "3"]]
    assert lines[6] == "note: add: a note"


def _inputs(*argv):
    return _eval_inputs(build_parser().parse_args(["eval", *argv]))


def test_eval_tells_model_config_and_overrides_apart(tmp_path):
    assert _inputs("builtin:tiny") == ("builtin:tiny", None, [])
    assert _inputs("steps=1", "quickstart", "builtin:smollm2") == ("builtin:smollm2", "quickstart", ["steps=1"])
    assert _inputs("my.yaml", "seed=3", "--model", "some/dir") == ("some/dir", "my.yaml", ["seed=3"])
    assert _inputs("--config", "a.yml", "--problems", "7", "--max-new-tokens", "9", "--temperature", "0.5") == (
        None, "a.yml", ["eval.problems_per_task=7", "eval.max_new_tokens=9", "rollout.temperature=0.5"])
    (tmp_path / "quickstart").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        assert _inputs("quickstart")[0] == "quickstart", "a folder here is a model, not the shipped config"


@pytest.mark.parametrize("argv, message", [
    (["builtin:tiny", "--model", "other"], "more than one model given (builtin:tiny, other)"),
    (["a.yaml", "b.yaml"], "more than one config given"),
])
def test_eval_refuses_two_models_or_two_configs(argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _inputs(*argv)


def test_truncation_notes_name_tasks_cut_off_by_the_length_limit():
    result = {"truncated": {"add": 1, "humaneval": 38}, "problems": {"add": 10, "humaneval": 41},
              "samples": {"add": {"samples": 50, "truncated": 20}, "humaneval": {"samples": 205, "truncated": 10}}}
    notes = truncation_notes(result, 48)
    assert notes == [
        "add: 20 of 50 samples stopped at the limit of 48 new tokens and were graded as cut off; "
        "raise --max-new-tokens (eval.max_new_tokens)",
        "humaneval: 38 of 41 greedy completions stopped at the limit of 48 new tokens and were graded as cut off; "
        "raise --max-new-tokens (eval.max_new_tokens)"]
    assert truncation_notes({"truncated": {"add": 2}, "problems": {"add": 10}}, 48) == []


class RecordingEpisodes(ScriptedEpisodes):
    """ScriptedEpisodes that keeps the sampling parameters of each call."""

    def __init__(self, problems):
        super().__init__(problems)
        self.params = []

    def generate(self, problems, group_size, params, generator=None):
        self.params.append(params)
        return super().generate(problems, group_size, params, generator)


def test_evaluation_stops_completions_where_the_rollouts_stop():
    from tempering.config import load_config
    from tempering.eval_model import _sampled_settings

    task = build_task("add", seed=0)
    config = load_config(None, ["rollout.stop=[END]"])
    args = build_parser().parse_args(["eval", "--n", "2"])
    settings = _sampled_settings(args, config)
    generator = RecordingEpisodes(task.eval_problems(4))
    sampled_evaluate(generator, [task], 4, 8, {task.metric: Matches()}, {}, settings, {}, verifier=False,
                     progress=False, stop=config.rollout.stop)
    greedy, *sampled = generator.params
    assert greedy.greedy and greedy.stop == ("END",)
    assert sampled and all(not p.greedy and p.stop == ("END",) for p in sampled)


def test_a_metric_that_raises_or_scores_no_number_is_a_grader_error_in_evaluation_as_in_training():
    """A user's metric that raises on one problem, returns "high" on another and nan on a third
    costs those problems (counted in grader_errors), not the evaluation."""
    task = build_task("add", seed=0)
    problems = task.eval_problems(4)
    failing = {problems[1].key: ValueError("no answer key"), problems[2].key: "high", problems[3].key: float("nan")}

    def flaky(problem, completion):
        found = failing.get(problem.key, float(completion == problem.answer))
        if isinstance(found, Exception):
            raise found
        return found

    metric = FunctionReward(flaky, task.metric, {})
    settings = SampledSettings(2, (1, 2), SamplingParams(), seed=0)
    result = sampled_evaluate(ScriptedEpisodes(problems), [task], 4, 8, {task.metric: metric}, {}, settings, {},
                              verifier=False, progress=False)

    assert result["per_task"]["add"] == 1.0 and result["grader_errors"]["add"] == 3
    assert result["samples"]["add"]["grader_errors"] == 6 and result["samples"]["add"]["mean_score"] == 1.0
    assert result["metrics"]["add"]["pass@1"]["value"] == 1.0 and result["metrics"]["add"]["pass@1"]["problems"] == 1
