"""``learner.grad_balance_rate`` in ``temper train``: every step measures each domain's share
of the gradient norm and logs the multiplier its loss was taken with; each step's multipliers
are the previous step's moved by its measured shares, and the checkpoint holds the next ones,
so a run resumed from it takes its next step with exactly the multipliers it would have
(``tests/unit/test_grad_share.py`` has what balancing does to the shares, and the mixture
state's round trip). Both tasks are graded by a coin (``slow_reward.py``): the miniature
model's groups then vary in reward, and have a gradient."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slow_reward import COIN

from tempering import checkpoint
from tempering.config import load_config
from tempering.train import rebalanced, train

TASKS = ("add", "sub")


def test_each_steps_multipliers_follow_the_last_steps_shares_and_are_checkpointed(tiny_model_dir: Path,
                                                                                   tmp_path: Path):
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    config = load_config(None, [
        "steps=3", "threads=1", f"run_dir={run}", f"model.path={tiny_model_dir}", "checkpoint.every=2",
        "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "eval.problems_per_task=2", "eval.max_new_tokens=16", "scheduler.balance_tokens=true",
        "learner.grad_balance_rate=0.5", "tasks=[" + ", ".join(f"{{name: {t}, rewards: {{'{COIN}': 1.0}}}}"
                                                              for t in TASKS) + "]"])
    train(config, progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    weights: dict[str, float] = {}
    for record in records:
        assert {t: record[f"domain/{t}/grad_weight"] for t in TASKS} == pytest.approx(
            {t: weights.get(t, 1.0) for t in TASKS})
        shares = {f"domain/{t}/grad_share": record[f"domain/{t}/grad_share"] for t in TASKS}
        assert sum(shares.values()) == pytest.approx(1.0)
        tasks_B = [t for t in TASKS for _ in range(round(record[f"domain/{t}/draw_share"] * 32))]
        weights = rebalanced(weights, shares, tasks_B, 0.5)
    assert weights != {t: 1.0 for t in TASKS}
    state = checkpoint.load_state(checkpoint.latest(run))
    assert state["mixture"]["grad_weights"] == pytest.approx(weights)

    shutil.copytree(run, resumed)  # the run as if killed after its step-2 checkpoint
    shutil.rmtree(checkpoint.latest(resumed))
    (resumed / "summary.json").unlink()
    train(config.model_copy(update={"run_dir": str(resumed)}), progress=False, resume=True)
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in again] == [1, 2, 3]
    grad_keys = [f"domain/{t}/{key}" for t in TASKS for key in ("grad_weight", "grad_share")]
    assert [again[2][k] for k in grad_keys] == [records[2][k] for k in grad_keys], "the multipliers, exactly"
    final = checkpoint.load_state(checkpoint.latest(resumed))
    assert final["mixture"]["grad_weights"] == state["mixture"]["grad_weights"]
