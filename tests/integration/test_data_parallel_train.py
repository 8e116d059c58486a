"""``torchrun --nproc-per-node 2 -m tempering.cli train``: two learner processes (gloo on CPU,
127.0.0.1) train the run one process would, the leader alone writing the run folder, under DDP
and under FSDP2 (whose leader samples with a whole copy gathered after every step)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from serving import free_port

ARGS = ["steps=3", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "eval.problems_per_task=4", "eval.max_new_tokens=8", "checkpoint.every=2", "learner.warmup_steps=0",
        "learner.lr=0.003", "tasks=[{name: add, options: {digits: [2]}, rewards: {length: 1.0}}]",
        "rewards.options={length: {max_tokens: 64, target_tokens: 3}}", "rollout.stop=[' ', '=']"]


def temper(processes: int, *args: str) -> None:
    """``temper train ARGS``, alone or as ``processes`` learners under torchrun."""
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
                "--master-addr=127.0.0.1", f"--master-port={free_port()}"] if processes > 1 else [sys.executable]
    done = subprocess.run([*launcher, "-m", "tempering.cli", "train", "--quiet", *args],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def train(run_dir: Path, model_dir: Path, processes: int, *extra: str) -> Path:
    temper(processes, *ARGS, *extra, f"model.path={model_dir}", f"run_dir={run_dir}")
    return run_dir


def final_weights(run_dir: Path) -> dict:
    return load_file(next((run_dir / "checkpoint-final").glob("*.safetensors")))


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_train_with_two_learners_ends_where_one_learner_does(parallel, tmp_path: Path, tiny_model_dir: Path):
    one = train(tmp_path / "one", tiny_model_dir, 1)
    two = train(tmp_path / "two", tiny_model_dir, 2, f"learner.parallel={parallel}")
    records = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3], "the leader alone writes each step's record"
    single = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    assert any(r["grad_norm"] > 0 for r in single), "the steps have a gradient"
    assert [r["reward"] for r in records] == pytest.approx([r["reward"] for r in single], abs=1e-6)
    weights = {path.name: final_weights(path) for path in (one, two)}
    for name, tensor in weights["one"].items():
        assert (weights["two"][name] - tensor).abs().max() <= 1e-5, name


def test_fsdp_run_resumed_from_its_checkpoint_ends_where_it_did(tmp_path: Path, tiny_model_dir: Path):
    """The step-2 checkpoint holds the whole weights and the optimizer state gathered whole;
    resuming from it under torchrun redoes step 3 exactly."""
    run = train(tmp_path / "run", tiny_model_dir, 2, "learner.parallel=fsdp")
    ended = final_weights(run)
    records = (run / "metrics.jsonl").read_text().splitlines()
    shutil.rmtree(run / "checkpoints" / "step-00000003")
    shutil.rmtree(run / "checkpoint-final")
    temper(2, "--resume", str(run))
    resumed = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in resumed] == [json.loads(line)["reward"] for line in records]
    assert resumed[-1]["grad_norm"] == pytest.approx(json.loads(records[-1])["grad_norm"], rel=1e-6)
    for name, tensor in final_weights(run).items():
        assert (tensor - ended[name]).abs().max() <= 1e-6, name
