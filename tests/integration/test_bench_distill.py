"""``bench/distill.py`` on miniature models: RL alone and distillation, each with its accuracy
curve at the evaluation steps, the teacher's own accuracy, and the student's reverse KL to the
teacher.

The miniature models answer none of these problems (every accuracy is 0), so the accuracies
are checked against evaluations made here of the model each should be of, and the KL carries
the rest: clearly above 0 for a teacher pre-trained with another seed, 0 for the student as
its own teacher."""

import json

import pytest

from tempering.build import build_tasks
from tempering.config import builtin_config, load_config
from tempering.evaluate import evaluate
from tempering.models.loading import load_model
from tempering.rollout.hf import HFGenerator

SMALL = ["threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
         "eval.problems_per_task=2", "eval.max_new_tokens=8", "checkpoint.every=0"]


@pytest.fixture(scope="module")
def overrides(tiny_model_dir) -> list[str]:
    """The student is the miniature model; the teacher the same shape pre-trained with seed 1."""
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    sizes = {key: pretrain[key] for key in ("hidden_size", "layers", "heads", "steps", "batch_docs", "lr",
                                            "warmup_steps")}
    return ([f"pretrain.{key}={value}" for key, value in sizes.items()]
            + [f"algorithm.teacher.pretrain.{key}={value}" for key, value in {**sizes, "seed": 1}.items()] + SMALL)


def evaluation(path, overrides: list[str]) -> dict:
    """The greedy held-out evaluation of the model at ``path`` on the runs' tasks and problems."""
    config = load_config(builtin_config("distill"), overrides)
    model, tokenizer = load_model(str(path))
    result = evaluate(HFGenerator(model, tokenizer), build_tasks(config), config.eval.problems_per_task,
                      config.eval.max_new_tokens)
    return {"accuracy": result["accuracy"], "per_task": result["per_task"]}


def test_distill_bench_reports_both_curves_the_teacher_and_the_kl(bench_module, tiny_model_dir, overrides):
    result = bench_module("distill").main(["--steps", "3", "--every", "2", *overrides])

    teacher = result["teacher"]
    assert teacher["model"] != str(tiny_model_dir), "the teacher is not the student"
    assert {key: teacher[key] for key in ("accuracy", "per_task")} == evaluation(teacher["model"], overrides)
    student = evaluation(tiny_model_dir, overrides)
    assert set(result["runs"]) == {"rl", "distill"}
    for name, run in result["runs"].items():
        assert [point["step"] for point in run["curve"]] == [0, 2, 3]
        assert {key: run["curve"][0][key] for key in ("accuracy", "per_task")} == student
        assert all(set(point["per_task"]) == {"add", "sub", "mul"} for point in run["curve"])
        assert run["curve"][0]["train_s"] == 0.0 < run["curve"][1]["train_s"] < run["curve"][2]["train_s"]
    assert result["runs"]["rl"]["teacher_kl"] == []
    kl = result["runs"]["distill"]["teacher_kl"]
    assert len(kl) == 3
    assert kl[0] > 0.1, "the untrained student's samples are far from what another model would write"


def test_with_the_student_as_its_own_teacher_the_first_kl_is_zero(bench_module, tiny_model_dir, overrides):
    result = bench_module("distill").main(["--steps", "1", "--every", "1", "--runs", "distill", *overrides,
                                           f"algorithm.teacher.path={tiny_model_dir}"])
    assert result["teacher"]["model"] == str(tiny_model_dir)
    [kl] = result["runs"]["distill"]["teacher_kl"]
    assert kl == pytest.approx(0.0, abs=1e-4)  # the sampler's log-probs against a forward pass of the same weights
