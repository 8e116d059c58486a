"""``temper train`` with LoRA on the miniature built-in model: a run with a KL reference, its
merged checkpoint, and a resumed run that ends with the uninterrupted run's adapters."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tempering.checkpoint import latest, load_state
from tempering.config import TrainConfig
from tempering.train import train


def _config(model_dir, run_dir, steps: int, **model) -> TrainConfig:
    pretrain = json.loads((model_dir / "pretrain.json").read_text())["config"]
    return TrainConfig.model_validate({
        "steps": steps, "threads": 1, "run_dir": str(run_dir), "pretrain": pretrain,
        "model": {"path": str(model_dir), "lora": {"rank": 4, **model}},
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 24},
        "algorithm": {"kl_coef": 0.05}, "learner": {"lr": 1e-2, "warmup_steps": 0},
        "eval": {"problems_per_task": 4, "max_new_tokens": 24}, "checkpoint": {"every": 2}})


def test_a_lora_run_with_kl_saves_a_plain_merged_model(tiny_model_dir, tmp_path):
    summary = train(_config(tiny_model_dir, tmp_path / "run", 2), progress=False)
    final = AutoModelForCausalLM.from_pretrained(summary["checkpoint"])
    assert not any("lora" in name for name, _ in final.named_parameters())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "kl" in records[0] and records[0]["kl"] == pytest.approx(0.0, abs=1e-7), "fresh adapters: B = 0"


def test_a_resumed_lora_run_ends_with_the_uninterrupted_runs_adapters(tiny_model_dir, tmp_path):
    train(_config(tiny_model_dir, tmp_path / "whole", 4, save="adapter"), progress=False)
    train(_config(tiny_model_dir, tmp_path / "cut", 2, save="adapter"), progress=False)
    train(_config(tiny_model_dir, tmp_path / "cut", 4, save="adapter"), progress=False, resume=True)

    whole, cut = (load_state(latest(tmp_path / run)) for run in ("whole", "cut"))
    assert whole["step"] == cut["step"] == 4
    for name, tensor in whole["learner"]["adapter"].items():
        assert torch.equal(tensor, cut["learner"]["adapter"][name]), name
    assert (tmp_path / "cut" / "checkpoint-final" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "checkpoint-final" / "adapter_model.safetensors").read_bytes()
