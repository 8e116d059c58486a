"""The same small training on Ray actors (a local Ray cluster started by the run itself),
and a run whose rollout actor is killed mid-run and still completes; the learner's ranks on
Ray actors (``pipeline.learner=ray``), and a run whose learner actor dies, resumed. The
two-node cluster is ``test_ray_cluster.py``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_resume import step_records, weights

from tempering.config import load_config

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

ARGS = ["steps=6", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "eval.problems_per_task=6", "eval.max_new_tokens=24", "checkpoint.every=3", "pipeline.backend=ray"]
TEMPER = [sys.executable, "-m", "tempering.cli", "train", "--quiet"]


def config(tmp_path: Path, model_dir: Path, *extra: str):
    return load_config(None, [*ARGS, f"model.path={model_dir}", f"run_dir={tmp_path / 'run'}", *extra])


def test_training_runs_on_ray_actors_and_matches_local(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    on_ray = train(config(tmp_path / "ray", tiny_model_dir), progress=False)
    local = train(config(tmp_path / "local", tiny_model_dir, "pipeline.backend=local"), progress=False)
    assert not ray.is_initialized(), "a cluster the run started is shut down at its end"
    assert on_ray["rollouts"]["taken"] == local["rollouts"]["taken"] == 6 * 16
    assert on_ray["rollouts"]["worker_restarts"] == 0
    records = [json.loads(line) for line in (tmp_path / "ray" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 7))
    assert all(r["weight_sync_s"] > 0 for r in records), "weights travel to the rollout actor every step"
    # The actor samples with the learner's weights, the same seed and the same thread count
    # (threads=1: one each), so every step draws the same tokens as the local run: a weight
    # update that missed the actor would change step 2's completions on.
    local_records = [json.loads(line) for line in (tmp_path / "local" / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward", "completion_tokens", "loss", "grad_norm"):
        assert [r[key] for r in records] == [r[key] for r in local_records], key
    assert on_ray["eval_after"] == local["eval_after"]


def test_a_killed_rollout_actor_is_restarted_and_the_run_completes(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    cfg = config(tmp_path, tiny_model_dir, "steps=10", "pipeline.mode=async")
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(train(cfg, progress=False)))
    runner.start()
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.1)
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("tempering-rollout-")]
    assert len(actors) == 1, actors
    ray.kill(ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"]))
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert result["rollouts"]["worker_restarts"] >= 1
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert records[-1]["worker_restarts"] >= 1


def test_two_rollout_and_two_reward_actors_share_each_round_in_a_placement_group(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    cfg = config(tmp_path, tiny_model_dir, "steps=4", "pipeline.rollout_workers=2", "pipeline.reward_workers=2",
                 "pipeline.rollout_cpus=0.25", "pipeline.reward_cpus=0.25", "pipeline.placement=pack")
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(train(cfg, progress=False)))
    runner.start()
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (not metrics.exists() or not metrics.read_text()):
        time.sleep(0.1)
    names = sorted(a["name"].split("-")[1] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith("tempering-"))
    groups = list(ray.util.placement_group_table().values())
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert names == ["reward", "reward", "rollout", "rollout"]
    assert [(g["strategy"], len(g["bundles"])) for g in groups] == [("PACK", 4)]
    assert result["rollouts"]["taken"] == 4 * 16, "each round's 4 problems are shared between the actors"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(0 <= r["accuracy"] <= 1 for r in records)


@pytest.mark.slow
def test_two_learner_ranks_on_ray_actors_train_as_one_process_does(tmp_path: Path, tiny_model_dir: Path):
    from tempering.train import train

    on_ray = train(config(tmp_path / "ray", tiny_model_dir, "steps=4", "pipeline.backend=local",
                          "pipeline.learner=ray", "pipeline.learner_workers=2"), progress=False)
    local = train(config(tmp_path / "local", tiny_model_dir, "steps=4", "pipeline.backend=local"), progress=False)
    assert len(on_ray["ray_nodes"]["learner"]) == 2 and on_ray["ray_nodes"]["rollout"] == []
    records, local_records = (step_records(tmp_path / name / "run") for name in ("ray", "local"))
    # The ranks sum their shares' gradients: the same step up to summation order, so the sampler
    # in this process, given the actors' weights each step, draws the same tokens.
    assert [r["completion_tokens"] for r in records] == [r["completion_tokens"] for r in local_records]
    assert [r["reward"] for r in records] == [r["reward"] for r in local_records]
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in records] == pytest.approx([r[key] for r in local_records], rel=1e-5, abs=1e-7), key
    assert on_ray["eval_after"] == local["eval_after"]


@pytest.mark.slow
def test_a_learner_actor_that_dies_stops_the_run_and_resume_ends_as_if_uninterrupted(tmp_path: Path,
                                                                                     tiny_model_dir: Path):
    args = [*ARGS, f"model.path={tiny_model_dir}", "pipeline.learner=ray", "checkpoint.every=2"]
    assert subprocess.run([*TEMPER, *args, "--run-dir", str(tmp_path / "reference")]).returncode == 0
    # The learner's actor inherits the variable from the local cluster the run starts, and kills
    # itself in its third step: after step 2's checkpoint.
    died = subprocess.run([*TEMPER, *args, "--run-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          env={**os.environ, "TEMPERING_KILL_AT": "learn:3"})
    assert died.returncode == 1, died.stderr[-3000:]
    assert "learner's Ray actor" in died.stderr and f"temper train --resume {tmp_path / 'run'}" in died.stderr
    assert "Traceback" not in died.stderr
    assert subprocess.run([*TEMPER, "--resume", str(tmp_path / "run")]).returncode == 0
    assert weights(tmp_path / "run") == weights(tmp_path / "reference")
    assert step_records(tmp_path / "run") == step_records(tmp_path / "reference")
