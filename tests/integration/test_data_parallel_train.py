"""``torchrun --nproc-per-node 2 -m tempering.cli train``: two learner processes (gloo on CPU,
127.0.0.1) train the run one process would, the leader alone writing the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_data_parallel import free_port

ARGS = ["steps=3", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "eval.problems_per_task=4", "eval.max_new_tokens=8", "checkpoint.every=2", "learner.warmup_steps=0",
        "learner.lr=0.003", "tasks=[{name: add, options: {digits: [2]}, rewards: {length: 1.0}}]",
        "rewards.options={length: {max_tokens: 64, target_tokens: 3}}", "rollout.stop=[' ', '=']"]


def train(run_dir: Path, model_dir: Path, processes: int) -> Path:
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}"] if processes > 1 else [sys.executable]
    done = subprocess.run([*launcher, "-m", "tempering.cli", "train", "--quiet", *ARGS, f"model.path={model_dir}",
                           f"run_dir={run_dir}"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_torchrun_train_with_two_learners_ends_where_one_learner_does(tmp_path: Path, tiny_model_dir: Path):
    one = train(tmp_path / "one", tiny_model_dir, 1)
    two = train(tmp_path / "two", tiny_model_dir, 2)
    records = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3], "the leader alone writes each step's record"
    single = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    assert any(r["grad_norm"] > 0 for r in single), "the steps have a gradient"
    assert [r["reward"] for r in records] == pytest.approx([r["reward"] for r in single], abs=1e-6)
    weights = {path.name: load_file(next((path / "checkpoint-final").glob("*.safetensors"))) for path in (one, two)}
    for name, tensor in weights["one"].items():
        assert (weights["two"][name] - tensor).abs().max() <= 1e-5, name
