"""A few real RL steps on the miniature built-in model: the run folder, its files, its checkpoint.

Nothing is mocked: the model is pre-trained by tempering.pretrain (once per session, into a
private cache), sampled by the HF sampler, scored by the task's rewards and trained by the
learner, exactly as `temper train` does, only smaller.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tempering.config import TrainConfig, load_config
from tempering.evaluate import evaluate
from tempering.models.loading import load_model
from tempering.rewards.basic import answer_format, exact_match
from tempering.rollout.hf import HFGenerator
from tempering.build import build_tasks
from tempering.train import train
from tempering.types import Problem

TASK_NAMES = {"add", "sub", "mul"}
SMALL_RUN = {
    "steps": 3,
    "threads": 1,
    "tasks": [{"name": name, "options": {"digits": [2]}} for name in ("add", "sub", "mul")],
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 32},
    "learner": {"lr": 1e-3, "warmup_steps": 0},
    "eval": {"problems_per_task": 8, "max_new_tokens": 32, "every": 2},
    "logging": {"samples": 1.0},
}


def _pretrain_config(model_dir) -> dict:
    """The pre-training config that made a cached model, as saved beside it."""
    return json.loads((model_dir / "pretrain.json").read_text())["config"]


def _weights(directory) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


@pytest.fixture(scope="module")
def small_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run") / "run"
    config = TrainConfig.model_validate({**SMALL_RUN, "pretrain": _pretrain_config(tiny_model_dir),
                                         "run_dir": str(run_dir)})
    return config, train(config, progress=False), run_dir


def test_metrics_have_one_line_per_step_with_timings_and_learner_numbers(small_run):
    _, _, run_dir = small_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    for record in records:
        assert {"reward", "accuracy", "loss", "generate_s", "reward_s", "learn_s", "step_s", "grad_norm", "lr",
                "clip_fraction", "entropy", "completion_tokens", "reward/exact_match", "reward/format"} <= set(record)
        assert all(record[k] >= 0 for k in ("generate_s", "reward_s", "learn_s"))
        assert 0 < record["completion_tokens"] <= 4 * 4 * 32
    assert any(r["grad_norm"] > 0 for r in records), "some group carried a reward signal"


def test_each_steps_rewards_and_accuracy_are_its_rollouts_graded_again(small_run):
    """Every rollout is in samples.jsonl (logging.samples 1.0); graded again here from its text.
    The miniature model writes the format often and the right answer rarely (in this run,
    never), so the format reward is the part that tells a wrong mean from a right one."""
    _, _, run_dir = small_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for record in records:
        rollouts = [s for s in samples if s["step"] == record["step"]]
        assert len(rollouts) == 4 * 4
        problems = [Problem(s["task"], s["id"], s["prompt"], s["answer"]) for s in rollouts]
        right = [exact_match(p, s["completion"]) for p, s in zip(problems, rollouts)]
        formatted = [answer_format(p, s["completion"]) for p, s in zip(problems, rollouts)]
        assert record["accuracy"] == pytest.approx(sum(right) / 16)
        assert record["reward/format"] == pytest.approx(sum(formatted) / 16)
        # the arithmetic tasks' default weights: exact_match 1, format 0.1
        assert record["reward"] == pytest.approx((sum(right) + 0.1 * sum(formatted)) / 16)
    assert 0 < sum(r["reward/format"] for r in records) < len(records), "some rollouts have the format, some not"


def test_periodic_evaluation_is_logged_at_its_steps_only(small_run):
    _, _, run_dir = small_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # every 2 steps, but not at the last step, which the final evaluation covers
    assert ["eval/accuracy" in r for r in records] == [False, True, False]
    assert {f"eval/{name}" for name in TASK_NAMES} <= set(records[1])
    assert records[1]["eval/grader_errors"] == 0


def test_summary_holds_both_evaluations_steps_and_wall_time(small_run):
    _, summary, run_dir = small_run
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    for key in ("eval_before", "eval_after"):
        evaluation = summary[key]
        assert set(evaluation["per_task"]) == TASK_NAMES
        assert evaluation["accuracy"] == pytest.approx(sum(evaluation["per_task"].values()) / 3)
    assert summary["steps"] == 3
    assert summary["wall_s"] > 0
    assert set(summary["seconds_per_step"]) == {"generate_s", "reward_s", "learn_s"}


def test_the_evaluation_before_is_the_pretrained_models_own(small_run, tiny_model_dir):
    """As the final checkpoint's evaluation is eval_after (below): the same greedy completions."""
    config, summary, _ = small_run
    model, tokenizer = load_model(str(tiny_model_dir))
    again = evaluate(HFGenerator(model, tokenizer), build_tasks(config), config.eval.problems_per_task,
                     config.eval.max_new_tokens)
    assert again == summary["eval_before"]
    assert again["examples"] != summary["eval_after"]["examples"], "the 3 steps changed some greedy answer"


def test_the_resolved_config_is_saved_and_reloads_to_the_same_config(small_run):
    config, _, run_dir = small_run
    assert load_config(run_dir / "config.yaml") == config


def test_the_cached_pretrained_model_is_used(small_run, tiny_model_dir):
    _, summary, _ = small_run
    assert summary["model"] == str(tiny_model_dir)


def test_the_final_checkpoint_loads_with_plain_transformers_and_holds_the_trained_weights(small_run, tiny_model_dir):
    config, summary, run_dir = small_run
    checkpoint = run_dir / "checkpoint-final"
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    trained, pretrained = _weights(checkpoint), _weights(tiny_model_dir)
    assert trained.keys() == pretrained.keys()
    assert any(not torch.equal(trained[k], pretrained[k]) for k in trained), "training changed the weights"

    # The reloaded model is the one evaluated at the end of training: same greedy completions.
    tasks = build_tasks(config)
    again = evaluate(HFGenerator(model, tokenizer), tasks, config.eval.problems_per_task, config.eval.max_new_tokens)
    assert again == summary["eval_after"]


def test_temper_train_from_a_yaml_file_prints_the_before_after_table(tmp_path, tiny_model_dir, tempering_cache):
    config_path = tmp_path / "small.yaml"
    config_path.write_text(yaml.safe_dump({**SMALL_RUN, "pretrain": _pretrain_config(tiny_model_dir)}))
    env = {**os.environ, "TEMPERING_CACHE": str(tempering_cache)}
    cached = sorted(p.name for p in tempering_cache.iterdir())  # other tests cache their own models (teachers)
    assert tiny_model_dir.name in cached

    result = subprocess.run(
        # a folder name YAML would read as a date must stay a folder name
        [sys.executable, "-m", "tempering.cli", "train", str(config_path), "--run-dir", "2024-06-01"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()  # a line per step, then the table
    assert [line.split()[0] for line in lines[:3]] == ["step", "step", "step"]
    table = next(i for i, line in enumerate(lines) if line.split()[:1] == ["task"])
    assert lines[table].split() == ["task", "before", "after", "change"]
    assert [line.split()[0] for line in lines[table + 1:table + 5]] == ["add", "sub", "mul", "mean"]
    assert (tmp_path / "2024-06-01" / "summary.json").exists()
    assert sorted(p.name for p in tempering_cache.iterdir()) == cached, "no second pre-training"


def test_a_run_can_sample_and_learn_under_bf16_autocast(tiny_model_dir, tmp_path):
    config = TrainConfig.model_validate({
        **SMALL_RUN, "steps": 1, "eval": {**SMALL_RUN["eval"], "problems_per_task": 2},
        "rollout": {**SMALL_RUN["rollout"], "bf16": True}, "learner": {**SMALL_RUN["learner"], "bf16": True},
        "pretrain": _pretrain_config(tiny_model_dir), "run_dir": str(tmp_path / "run")})
    train(config, progress=False)
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["completion_tokens"] > 0
    assert torch.isfinite(torch.tensor(record["loss"]))
