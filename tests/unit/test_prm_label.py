"""Step labels from continuations (``tempering.prm_label``) on a scripted sampler and a
hand-made grader, where every label is known in advance."""

import pytest

from tempering.config import ConfigError
from tempering.models.tiny import build_tokenizer
from tempering.prm_label import LabelSettings, label, label_problem, summarize
from tempering.types import Problem, RewardResult

RIGHT = "7+8=15\n4+3+1=8\nanswer: 85"
WRONG = "7+8=15\n4+3=7\nanswer: 75"


class ScriptedSampler:
    """Writes solutions and continuations by a fixed script of the text so far: the first
    solution right and the second wrong; after the first step, continuations alternate right
    and wrong; after a later step, the answer that step leads to."""

    def __init__(self):
        self.tokenizer = build_tokenizer()
        self.batch_size = 5  # smaller than a problem's rows: the rows go in pieces
        self.calls = 0

    def _next(self, so_far: str) -> str:
        self.calls += 1
        if so_far.endswith("47+38\n"):
            return RIGHT if self.calls % 2 else WRONG
        if so_far.endswith("7+8=15\n"):
            return RIGHT.split("\n", 1)[1] if self.calls % 2 else WRONG.split("\n", 1)[1]
        return "answer: 85" if so_far.endswith("4+3+1=8\n") else "answer: 75"

    def sample(self, prompts, params, generator=None):
        texts = [self._next(self.tokenizer.decode(ids, skip_special_tokens=True)) for ids in prompts]
        return [(self.tokenizer(t, add_special_tokens=False)["input_ids"], [], "stop") for t in texts]


class AnswerGrader:
    """The hand-made metric: 1 when the text ends with the problem's answer line; raises on a
    text holding 'boom' (a grader failure)."""

    def score_batch(self, problems, rollouts):
        if any("boom" in r.text for r in rollouts):
            raise RuntimeError("grader down")
        return [RewardResult(float(r.text.strip().endswith(f"answer: {p.answer}"))) for p, r in zip(problems, rollouts)]


class OneProblemTask:
    name, domain, metric, rewards = "add", "add", "answer", {"answer": 1.0}

    def train_problem(self, index):
        return Problem(task="add", id=f"47+38#{index}", prompt="47+38\n", answer="85")

    def eval_problems(self, n):
        return []


SETTINGS = LabelSettings(problems=3, solutions=2, continuations=2, max_new_tokens=32, model="scripted")


def test_labels_are_the_share_and_the_any_of_right_continuations():
    records = label_problem(ScriptedSampler(), OneProblemTask(), AnswerGrader(), 0, SETTINGS)
    right, wrong = records
    assert right["steps"] == RIGHT.split("\n") and wrong["steps"] == WRONG.split("\n")
    # after '7+8=15' one continuation of two is right; after the carry '4+3+1=8' both are;
    # the answer line's label is the solution's own grade
    assert right["soft"] == [0.5, 1.0, 1.0] and right["hard"] == [1, 1, 1] and right["outcome"] == 1
    # the same first step; after the dropped carry '4+3=7' no continuation can be right
    assert wrong["soft"] == [0.5, 0.0, 0.0] and wrong["hard"] == [1, 0, 0] and wrong["outcome"] == 0
    assert right["grader_errors"] == wrong["grader_errors"] == 0


def test_a_failing_grader_leaves_its_continuations_out():
    class Boom(ScriptedSampler):
        def _next(self, so_far):
            text = super()._next(so_far)
            return "boom" if so_far.endswith("4+3+1=8\n") else text

    right, _ = label_problem(Boom(), OneProblemTask(), AnswerGrader(), 0, SETTINGS)
    assert right["hard"] == [1, None, 1] and right["soft"] == [0.5, None, 1.0] and right["grader_errors"] == 2


def test_a_stopped_run_continues_to_the_same_file(tmp_path):
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    label(ScriptedSampler(), [OneProblemTask()], {"answer": AnswerGrader()}, whole, SETTINGS)
    lines = whole.read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 3 * 2  # the header, then two solutions of each of three problems
    cut.write_text("".join(lines[:3]) + lines[3][:20])  # one problem complete, the next torn mid-line
    sampler = ScriptedSampler()
    counts = label(sampler, [OneProblemTask()], {"answer": AnswerGrader()}, cut, SETTINGS)
    assert cut.read_text() == whole.read_text()
    assert sampler.calls == 2 * (2 + 2 * 2 * 2)  # only the two problems left were sampled
    assert counts["problems"] == 3 and counts["solutions"] == 6 and counts["steps"] == 18
    assert summarize(whole)["solution_accuracy"] == 0.5


def test_a_file_with_other_settings_or_not_labels_is_refused(tmp_path):
    out = tmp_path / "labels.jsonl"
    label(ScriptedSampler(), [OneProblemTask()], {"answer": AnswerGrader()}, out, SETTINGS)
    more = LabelSettings(problems=4, solutions=2, continuations=2, max_new_tokens=32, model="scripted")
    assert label(ScriptedSampler(), [OneProblemTask()], {"answer": AnswerGrader()}, out, more)["problems"] == 4
    other = LabelSettings(problems=3, solutions=2, continuations=3, model="scripted")
    with pytest.raises(ConfigError, match="written with other settings"):
        label(ScriptedSampler(), [OneProblemTask()], {"answer": AnswerGrader()}, out, other)
    out.write_text("not json\n")
    with pytest.raises(ConfigError, match="not a labels file"):
        label(ScriptedSampler(), [OneProblemTask()], {"answer": AnswerGrader()}, out, SETTINGS)
    with pytest.raises(ConfigError, match="--continuations 0: must be at least 1"):
        label(ScriptedSampler(), [OneProblemTask()], {}, tmp_path / "x.jsonl",
              LabelSettings(continuations=0))
