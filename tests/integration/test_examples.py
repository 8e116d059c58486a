"""Every script in ``examples/`` runs, as a user would run it, at small settings: the
miniature model and a couple of steps, given as ``key=value`` overrides on its command line.
Each check reads what the run wrote, not only its exit status."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["steps=2", "threads=1", "checkpoint.every=0", "rollout.prompts_per_step=2", "rollout.group_size=2",
         "rollout.max_new_tokens=16", "eval.problems_per_task=4", "eval.max_new_tokens=16"]


def _example(name, *args, cwd, cache, timeout=240):
    env = {**os.environ, "TEMPERING_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def small(tiny_model_dir, tmp_path):
    return [f"model.path={tiny_model_dir}", f"run_dir={tmp_path / 'run'}", *SMALL]


def test_reward_in_python(small, tmp_path, tempering_cache):
    out = _example("reward_in_python.py", *small, cwd=tmp_path, cache=tempering_cache)
    assert "held-out accuracy" in out
    assert all("reward/concise" in step for step in _steps(tmp_path / "run"))
    doctest = subprocess.run([sys.executable, "-m", "doctest", str(EXAMPLES / "reward_in_python.py")],
                             capture_output=True, text=True, timeout=120)
    assert doctest.returncode == 0, doctest.stdout


def test_task_from_records(small, tmp_path, tempering_cache):
    out = _example("task_from_records.py", *small, cwd=tmp_path, cache=tempering_cache)
    assert "sums: held-out accuracy" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_after"]["problems"] == {"sums": 4}
    assert all("domain/sums/reward" in step for step in _steps(tmp_path / "run"))


def test_retry_env(small, tmp_path, tempering_cache):
    _example("retry_env.py", *small, cwd=tmp_path, cache=tempering_cache)
    steps = _steps(tmp_path / "run")
    assert all(1 <= step["env/turns"] <= 3 for step in steps), "episodes of one to three turns"
    assert any(step.get("env/retries", 0) > 0 for step in steps), "the miniature model is wrong often enough"


def test_train_and_evaluate(small, tmp_path, tempering_cache):
    out = _example("train_and_evaluate.py", *small, cwd=tmp_path, cache=tempering_cache)
    lines = out.splitlines()
    assert any(line.startswith("run folder: ") for line in lines)
    assert {line.split(":")[0] for line in lines if line.split(":")[0] in ("add", "mul", "sub")} == {"add", "mul", "sub"}
    assert lines[-1].strip(), "the checkpoint, loaded back, completed the prompt"


def test_sandbox_library(tmp_path, tempering_cache, sandbox_executor):
    out = _example("sandbox_library.py", cwd=tmp_path, cache=tempering_cache)
    assert "run: ok '6\\n'" in out
    assert "right: passed 2 of 2" in out and "wrong: passed 0 of 2" in out and "cheat: passed 0 of 2" in out
    assert "'while True: pass': timeout" in out and ": memory_limit" in out


def test_against_vllm(small, tmp_path, tempering_cache):
    from test_vllm_server import VLLM_PRETRAIN, require_vllm

    if importlib.util.find_spec("vllm") is None:
        out = _example("against_vllm.py", *small, cwd=tmp_path, cache=tempering_cache)
        assert out.startswith("skipped: vllm is not installed")
        require_vllm()  # skips, saying why (fails under CI, which installs vLLM)
    # the miniature model with heads vLLM's CPU attention takes (32 dimensions)
    mini = [o for o in small if not o.startswith("model.path=")] + [
        "model.path=builtin:tiny", *(f"pretrain.{key}={value}" for key, value in VLLM_PRETRAIN.items()),
        "rollout.vllm.kv_cache_gib=0.25"]
    out = _example("against_vllm.py", *mini, cwd=tmp_path, cache=tempering_cache, timeout=600)
    assert "held-out accuracy" in out
    steps = _steps(tmp_path / "run")
    assert [step["policy_version"] for step in steps] == [1, 2]
    assert all(step["mismatch/abs_logp"] < 1e-6 for step in steps), "fp32 vLLM, weights reloaded every step"
