"""`temper eval --n N --k ...` end to end: the real CLI, sampler and graders on the miniature model.

What the miniature model writes is not good arithmetic, so these tests check what must hold
whatever it writes: the JSON's fields, and the identities between metrics (pass@1 is the mean
sample score; best of one sample, by any selector, is pass@1; best of n by the grader is pass@n).
"""

import json
import os
import subprocess
import sys

import pytest
import yaml


def _temper(args, cwd, cache, timeout=600):
    env = {**os.environ, "TEMPERING_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "tempering.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _mini_pretrain(model_dir) -> str:
    """An override that makes ``builtin:tiny`` the cached miniature model (its pre-training config)."""
    return "pretrain=" + json.dumps(json.loads((model_dir / "pretrain.json").read_text())["config"])


def test_temper_eval_builtin_tiny_reports_pass_maj_and_best_of_k_with_intervals(
        tmp_path, tiny_model_dir, tempering_cache):
    args = ["eval", "builtin:tiny", _mini_pretrain(tiny_model_dir), "--tasks", "add,mul", "--n", "4", "--k", "1,2",
            "--problems", "6", "--max-new-tokens", "32", "--best-of", "verifier",
            "--best-of", f"rm:{tiny_model_dir}", "--json", "-", "--quiet"]

    result = _temper(args, tmp_path, tempering_cache)

    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(result.stdout)
    assert printed["model"] == str(tiny_model_dir)
    assert f"model {tiny_model_dir}" in result.stderr
    assert printed["settings"]["n"] == 4 and printed["settings"]["k"] == [1, 2]
    assert list(printed["metrics"]) == ["add", "mul"] and printed["problems"] == {"add": 6, "mul": 6}
    for name in ("add", "mul"):
        metrics, counts = printed["metrics"][name], printed["samples"][name]
        assert set(metrics) == {"greedy", "pass@1", "pass@2", "maj@1", "maj@2", "best_of@1[verifier]",
                                "best_of@2[verifier]", "best_of@1[rm]", "best_of@2[rm]"}
        for entry in metrics.values():
            low, high = entry["ci"]
            assert 0 <= low <= entry["value"] <= high <= 1 and entry["problems"] == 6
        assert metrics["greedy"]["value"] == printed["per_task"][name], "greedy is evaluate()'s number"
        assert counts["samples"] == 24 and counts["grader_errors"] == 0
        assert metrics["pass@1"]["value"] == pytest.approx(counts["mean_score"], abs=1e-9)
        assert metrics["maj@1"]["value"] == pytest.approx(metrics["pass@1"]["value"], abs=1e-9)
        assert metrics["best_of@1[rm]"]["value"] == pytest.approx(metrics["pass@1"]["value"], abs=1e-9)
        assert metrics["best_of@2[verifier]"]["value"] == pytest.approx(metrics["pass@2"]["value"], abs=1e-9)
        assert metrics["pass@1"]["value"] <= metrics["pass@2"]["value"]
    table = result.stderr.splitlines()
    assert any(line.split()[:1] == ["pass@2"] for line in table), "the table goes to stderr under --json -"


def test_temper_eval_scores_a_checkpoint_of_a_short_training_run(tmp_path, tiny_model_dir, tempering_cache):
    run_dir = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "steps": 2, "threads": 1, "run_dir": str(run_dir),
        "pretrain": json.loads((tiny_model_dir / "pretrain.json").read_text())["config"],
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16},
        "eval": {"problems_per_task": 2, "max_new_tokens": 16}, "checkpoint": {"every": 1}}))
    trained = _temper(["train", str(config), "--quiet"], tmp_path, tempering_cache)
    assert trained.returncode == 0, trained.stderr[-2000:]
    checkpoint = run_dir / "checkpoints" / "step-00000002" / "model"
    out = tmp_path / "eval.json"

    result = _temper(["eval", str(checkpoint), str(config), "--tasks", "add", "--n", "3", "--problems", "4",
                      "--json", str(out), "--quiet"], tmp_path, tempering_cache)

    assert result.returncode == 0, result.stderr[-2000:]
    printed = json.loads(out.read_text())
    assert printed["model"] == str(checkpoint)
    assert printed["settings"]["k"] == [1, 3], "k defaults to 1 and n"
    assert set(printed["metrics"]["add"]) == {"greedy", "pass@1", "pass@3", "maj@1", "maj@3"}
    assert printed["samples"]["add"]["samples"] == 12
    assert result.stdout.splitlines()[0].split() == ["metric", "add"], "the table on stdout"


@pytest.mark.parametrize("args, expected", [
    (["eval", "--k", "1,5"], "--k and --best-of need --n"),
    (["eval", "--n", "2", "--k", "1,3"], "--k 1,3: each k must be between 1 and --n 2"),
    (["eval", "--n", "2", "--k", "one"], "--k 'one': expected whole numbers"),
    (["eval", "--n", "2", "--best-of", "judge"], "--best-of 'judge': expected verifier or rm:PATH"),
    (["eval", "--tasks", "add,nosuch"], "tasks.1 (nosuch): unknown task 'nosuch'"),
    (["eval", "builtin:tiny", "builtin:smollm2"], "more than one model given"),
    (["eval", "--problems", "0"], "eval.problems_per_task=0"),
    (["eval", "--json", "nosuch/out.json"], "--json nosuch/out.json: its folder does not exist"),
    (["eval", "--json", "."], "--json .: is a folder; name a file in it"),
    (["eval", "--n", "2", "--best-of", "rm:a", "--best-of", "rm:b"], "more than one reward model given (a, b)"),
    (["eval", "--n", "2", "--best-of", "prm:a", "--best-of", "prm:b"], "more than one process reward model given (a, b)"),
    (["eval", "--n", "2", "--best-of", "prm:"], "--best-of 'prm:': expected verifier or rm:PATH"),
])
def test_bad_eval_arguments_exit_2_with_one_message_before_any_model_work(tmp_path, args, expected):
    cache, cwd = tmp_path / "cache", tmp_path / "cwd"
    cache.mkdir()
    cwd.mkdir()

    result = _temper(args, cwd, cache, timeout=120)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.startswith("temper eval: ")
    assert expected in result.stderr
    assert not any(cache.iterdir()), "nothing was pre-trained"
