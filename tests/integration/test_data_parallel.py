"""Two learner processes (gloo on CPU, started by torchrun on 127.0.0.1) end a few steps with
the weights of one learner on the same global batches, under DDP and under FSDP2.

The batches are sampled once by the real sampler and saved, so only the learner differs.
Rewards are drawn (seeded) rather than graded, so every group carries signal whatever the
miniature model writes: what is compared is the learner's arithmetic.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from serving import free_port
from tempering.build import build_mixture, build_tasks, resolve_algorithm, rollout_worker
from tempering.config import load_config
from tempering.train import make_batch

WORKER = Path(__file__).with_name("data_parallel_worker.py")
STEPS = 3
ARGS = [f"steps={STEPS}", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=12", "learner.lr=0.003", "learner.warmup_steps=0", "learner.micro_batch_size=3",
        "learner.mini_batches=2"]


def saved_batches(config, path: Path) -> Path:
    """``STEPS`` batches with advantages, sampled by the miniature model, saved to ``path``."""
    from tempering.policy import load_model

    model, tokenizer, _ = load_model(config, config.model.path, progress=False)
    worker = rollout_worker(config, model.eval(), tokenizer)
    mixture = build_mixture(config, build_tasks(config))
    draws = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        groups = worker.sample(mixture.next_problems(config.rollout.prompts_per_step))
        for rollout in (r for g in groups for r in g.rollouts):
            rollout.reward = float(torch.rand((), generator=draws))
        batches.append(make_batch(groups, resolve_algorithm(config)["advantage"], tokenizer.pad_token_id))
    torch.save(batches, path)
    return path


def run_learners(config, batches: Path, out: Path, processes: int) -> dict:
    """The worker alone (``processes=1``) or under torchrun; returns what rank 0 saved."""
    config_path = out.with_suffix(".json")
    config_path.write_text(config.model_dump_json())
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={processes}",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launcher, str(WORKER), str(config_path), str(batches), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def batches_and_single(tmp_path_factory, tiny_model_dir):
    folder = tmp_path_factory.mktemp("data-parallel")
    config = load_config(None, [*ARGS, f"model.path={tiny_model_dir}"])
    batches = saved_batches(config, folder / "batches.pt")
    return batches, run_learners(config, batches, folder / "single.pt", 1)


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_learner_processes_end_with_the_weights_of_one(parallel, batches_and_single, tiny_model_dir, tmp_path):
    batches, single = batches_and_single
    config = load_config(None, [*ARGS, f"model.path={tiny_model_dir}", f"learner.parallel={parallel}"])
    double = run_learners(config, batches, tmp_path / "double.pt", 2)
    assert single["weights"].keys() == double["weights"].keys()
    moved = max(float((single["weights"][k] - single["start"][k]).abs().max()) for k in single["weights"])
    assert moved > 1e-3, "the steps change the weights"
    for name, tensor in single["weights"].items():
        torch.testing.assert_close(double["weights"][name], tensor, rtol=0, atol=1e-5, msg=name)
    for one, two in zip(single["records"], double["records"]):
        for key in ("loss", "grad_norm", "entropy", "skipped_rows"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
