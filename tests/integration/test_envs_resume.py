"""A multi-turn run SIGKILLed at named points and resumed each time ends with the weights and
step records of an uninterrupted one (sync mode): episodes replay exactly from the saved
generator state, environment and all."""

from __future__ import annotations

import signal
from pathlib import Path

from test_resume import step_records, temper, weights

ENV_TASKS = ("tasks=[{name: add, options: {digits: [2]}, env: {name: 'test_envs_train:Hint', max_turns: 3}},"
             " {name: mul, options: {digits: [2]}}]")
ARGS = ["steps=8", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
        "eval.problems_per_task=6", "eval.max_new_tokens=16", "checkpoint.every=1", "checkpoint.keep=2", ENV_TASKS]


def test_sigkilled_multi_turn_run_resumes_bitwise(tmp_path: Path, tiny_model_dir: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the environment's module, as a user's would be
    reference, run = tmp_path / "reference", tmp_path / "run"
    args = [*ARGS, f"model.path={tiny_model_dir}"]
    assert temper(*args, "--run-dir", str(reference)) == 0
    kills = ["sample:2", "learn:3", "checkpoint:2", "sample:3"]
    outcomes = [temper(*args, "--run-dir", str(run), kill_at=kills[0])]
    outcomes += [temper("--resume", str(run), kill_at=kill) for kill in kills[1:]]
    assert outcomes == [-signal.SIGKILL] * len(kills)
    assert temper("--resume", str(run)) == 0

    records = step_records(run)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert any(r["env/hints"] > 0 for r in records)  # the episodes had second turns
    assert records == step_records(reference)
    assert weights(run) == weights(reference)
