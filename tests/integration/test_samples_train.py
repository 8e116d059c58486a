"""A real run of the miniature model writes its rollout samples, and a resumed run writes
exactly the lines an uninterrupted one did: none twice, none of a step it trains again."""

from __future__ import annotations

import json
import shutil

from tempering import checkpoint
from tempering.config import TrainConfig
from tempering.train import train


def _config(tiny_model_dir, run_dir) -> TrainConfig:
    return TrainConfig.model_validate({
        "steps": 3, "threads": 1, "model": {"path": str(tiny_model_dir)}, "run_dir": str(run_dir),
        "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 12},
        "eval": {"problems_per_task": 2, "max_new_tokens": 12},
        "checkpoint": {"every": 2, "keep": 2}, "logging": {"samples": 0.25}})


def test_a_run_writes_a_share_of_each_step_and_resume_drops_the_steps_after_the_checkpoint(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(_config(tiny_model_dir, run), progress=False)
    written = (run / "samples.jsonl").read_text()
    lines = [json.loads(line) for line in written.splitlines()]
    assert [line["step"] for line in lines] == [1] * 3 + [2] * 3 + [3] * 3  # 12 rollouts a step, a quarter
    assert {line["task"] for line in lines} <= {"add", "sub", "mul"}
    assert all(line["completion"] and "exact_match" in line["reward_parts"] for line in lines)

    # killed after step 3's lines were written but before its checkpoint
    shutil.rmtree(checkpoint.latest(run))
    (run / "summary.json").unlink()
    train(_config(tiny_model_dir, run), progress=False, resume=True)

    assert (run / "samples.jsonl").read_text() == written
