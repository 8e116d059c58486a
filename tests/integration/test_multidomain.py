"""The ``multidomain`` config trains end to end on the miniature model with an adaptive mixture,
logging per-domain metrics every step and printing the per-domain tables."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from tempering.config import load_config  # noqa: E402
from tempering.train import train  # noqa: E402


def test_multidomain_logs_every_domain_each_step_and_prints_the_tables(tiny_model_dir, tmp_path, capsys):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    overrides = ["steps=2", "threads=1", f"run_dir={tmp_path / 'run'}", f"pretrain={json.dumps(pretrain)}",
                 "rollout.prompts_per_step=8", "rollout.group_size=2", "rollout.max_new_tokens=16",
                 "eval.problems_per_task=2", "eval.max_new_tokens=16"]
    config = load_config("multidomain", overrides)
    names = [spec.name for spec in config.tasks]
    assert len(names) >= 8 and sum(n.startswith("rg:") for n in names) >= 4
    summary = train(config, progress=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        weights = [record[f"domain/{name}/weight"] for name in names]
        assert sum(weights) == pytest.approx(1.0) and min(weights) >= 0.2 / len(names) - 1e-9
        assert all(f"domain/{name}/dropped_groups" in record for name in names)
        shares = [[record[f"domain/{name}/{key}"] for name in names] for key in ("draw_share", "token_share")]
        assert all(sum(share) == pytest.approx(1.0) for share in shares)
    drawn = [k for k in records[0] if k.endswith("/success")]
    assert drawn and all(f"domain/{k.split('/')[1]}/completion_tokens" in records[0] for k in drawn)
    assert all(f"domain/{k.split('/')[1]}/grad_share" in records[0] for k in drawn), "learner.grad_share_every: 5"
    assert not any(k.endswith("/grad_share") for k in records[1])
    assert set(summary["eval_after"]["per_task"]) == set(names)
    printed = capsys.readouterr().out
    assert "rg:chain_sum" in printed and "dropped" in printed
