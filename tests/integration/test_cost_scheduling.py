"""``scheduler.strategy: learnability_per_cost`` in ``temper train``: two arithmetic domains of
the same learnability, one graded by a reward that sleeps (``slow_reward.py``); the mixture
learns what each costs per rollout and draws the expensive one less than ``static`` does.
Every step logs each domain's share of the draws, tokens and reward time and its cost, and
every other step its share of the gradient norm."""

from __future__ import annotations

import json
from pathlib import Path

from slow_reward import SLEEP_S

from tempering.config import load_config
from tempering.explain import explain
from tempering.train import train

FAST, SLOW = "slow_reward:fast_add", "slow_reward:slow_sub"
STEPS = 6


def _config(tiny_model_dir: Path, run: Path, strategy: str, *extra: str):
    return load_config(None, [
        f"steps={STEPS}", "threads=1", f"run_dir={run}", f"model.path={tiny_model_dir}", "checkpoint.every=0",
        "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "eval.problems_per_task=2", "eval.max_new_tokens=16", f"scheduler.strategy={strategy}",
        f"tasks=[{{name: '{FAST}'}}, {{name: '{SLOW}'}}]", *extra])


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_cost_aware_mixture_draws_an_expensive_domain_less_than_static(tiny_model_dir: Path, tmp_path: Path):
    drawn = {}
    for strategy in ("static", "learnability_per_cost"):
        run = tmp_path / strategy
        train(_config(tiny_model_dir, run, strategy, "learner.grad_share_every=2"), progress=False)
        records = _records(run)
        assert len(records) == STEPS
        for record in records:
            for name in (FAST, SLOW):
                for key in ("draw_share", "token_share", "reward_time_share", "cost_s", "weight"):
                    assert f"domain/{name}/{key}" in record, (strategy, record["step"], name, key)
            assert sum(record[f"domain/{n}/draw_share"] for n in (FAST, SLOW)) == 1.0
            # Both domains pay the same share of the sampling time per token, which grows on a
            # loaded machine (4-16 ms a rollout seen): the slow one's sleep is the difference.
            assert record[f"domain/{SLOW}/cost_s"] >= SLEEP_S
            assert record[f"domain/{SLOW}/cost_s"] - record[f"domain/{FAST}/cost_s"] >= 0.5 * SLEEP_S
            if record[f"domain/{SLOW}/draw_share"]:
                assert record[f"domain/{SLOW}/reward_time_share"] > 0.9
            measured = record["step"] % 2 == 1  # learner versions 0, 2, 4
            trained = [n for n in (FAST, SLOW) if record[f"domain/{n}/draw_share"]]  # sync: the step trains its draws
            assert [n for n in (FAST, SLOW) if f"domain/{n}/grad_share" in record] == (trained if measured else [])
            if measured:
                assert abs(sum(record[f"domain/{n}/grad_share"] for n in trained) - 1.0) < 1e-9
        drawn[strategy] = sum(r[f"domain/{SLOW}/draw_share"] for r in records) / STEPS
        if strategy == "learnability_per_cost":
            assert all(r[f"domain/{SLOW}/weight"] >= 0.1 / 2 for r in records), "the floor keeps it drawn"
    assert drawn["learnability_per_cost"] < drawn["static"] / 2, drawn


def test_explain_gives_each_domains_expected_share_of_draws(tiny_model_dir: Path, tmp_path: Path):
    text = explain(_config(tiny_model_dir, tmp_path / "run", "learnability_per_cost"), probe=0)
    line = next(line for line in text.splitlines() if line.startswith("draws: "))
    assert f"{FAST} 50.0%, {SLOW} 50.0% expected at the start" in line
    assert "costs are learned as the run goes" in line and "at least 0.1 of them by the static weights" in line
    static = explain(_config(tiny_model_dir, tmp_path / "run", "static", "tasks.0.weight=3"), probe=0)
    assert f"draws: {FAST} 75.0%, {SLOW} 25.0% expected at the start (scheduler.strategy=static); fixed" in static
