"""``temper report`` on hand-written run folders: which plots appear, what the rollout browser
picks, and that the page is self-contained and cannot be broken by what a model wrote."""

import json
import re

import pytest

from tempering.cli import main
from tempering.reporting.html import build_report


def _run(folder, metrics, samples=()):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics) + '{"step": 9, "rew')
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (folder / "config.yaml").write_text("seed: 0\nsteps: 2\n")
    return folder


def _sample(step, reward, completion="answer: 1", **extra):
    return {"step": step, "task": "add", "domain": "add", "prompt": "1+0=", "answer": "1", "completion": completion,
            "reward": reward, "reward_parts": {"exact_match": reward}, "finish_reason": "stop",
            "completion_tokens": 3, "policy_version": step - 1, **extra}


def _data(html):
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def test_plots_appear_for_the_metrics_a_run_has_and_runs_share_them(tmp_path):
    a = _run(tmp_path / "a", [{"step": 1, "reward": 0.5, "kl": 0.1, "monitor/harness": 0.0,
                               "monitor/harness/alert": 0.0},
                              {"step": 2, "reward": float("nan"), "kl": 0.2, "monitor/harness": 0.4,
                               "monitor/harness/alert": 1.0}])
    b = _run(tmp_path / "b", [{"step": 1, "reward": 0.25, "entropy": 1.5, "domain/add/weight": 1.0}])

    data = _data(build_report([a, b], tmp_path / "r.html").read_text())

    titles = [p["title"] for p in data["panels"]]
    assert titles == ["Reward", "Mixture weights", "KL", "Entropy", "Monitors"]
    reward = data["panels"][0]["series"]
    assert [(s["run"], s["key"], s["points"]) for s in reward] == [(0, "reward", [[1, 0.5]]), (1, "reward", [[1, 0.25]])]
    assert data["alerts"] == [{"run": 0, "step": 2, "monitor": "harness", "value": 0.4}]
    assert [r["name"] for r in data["runs"]] == ["a", "b"] and data["runs"][0]["config"].startswith("seed: 0")


def test_the_browser_shows_best_worst_and_random_per_domain_and_the_page_stays_whole(tmp_path):
    samples = [_sample(1, r / 10) for r in range(10)]
    samples[3]["completion"] = "</script><script>alert(1)</script>"
    samples.append(_sample(2, 1.0, turns=[{"text": "<calc>1</calc>", "finish_reason": "stop",
                                           "observation": "<result>1</result>", "rewards": {}, "info": {}}]) | {
        "domain": "tools"})
    html = build_report([_run(tmp_path / "a", [{"step": 1, "reward": 0.5}], samples)], tmp_path / "r.html").read_text()

    data = _data(html)
    add, tools = data["samples"]
    assert [s["reward"] for s in add["best"]] == [0.9, 0.8, 0.7] and [s["reward"] for s in add["worst"]] == [0, 0.1, 0.2]
    assert len(add["random"]) == 3 and all(0.3 <= s["reward"] <= 0.6 for s in add["random"])
    assert add["random"] == _data(build_report([tmp_path / "a"], tmp_path / "again.html").read_text())["samples"][0]["random"]
    assert tools["domain"] == "tools" and tools["best"][0]["turns"][0]["observation"] == "<result>1</result>"
    assert html.count("<script") == 3, "nothing a model wrote opens or closes a script"
    assert "<link" not in html and " src=" not in html, "the page loads nothing"


def test_a_folder_without_metrics_is_one_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["report", str(tmp_path)])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == f"temper report: {tmp_path}: not a run folder (no metrics.jsonl in it)"


def test_series_of_different_scale_go_to_separate_axes_and_plots(tmp_path):
    steps = [{"step": s, "ratio_mean": 1.0 + s * 1e-8, "behaviour_weight": 0.99, "mismatch/abs_logp": s * 1e-7,
              "mismatch/outside_clip": 0.0, "mismatch/k3": s * 1e-14, "kl": 0.1} for s in (1, 2)]
    data = _data(build_report([_run(tmp_path / "a", steps)], tmp_path / "r.html").read_text())

    shown = {p["title"]: p for p in data["panels"]}
    first, second = shown["Sampler/learner mismatch"], shown["Sampler/learner mismatch (2)"]
    assert first["axes"] == 2 and second["axes"] == 1
    assert {s["key"]: s["axis"] for s in first["series"]} == {
        "ratio_mean": 0, "behaviour_weight": 0, "mismatch/outside_clip": 0, "mismatch/abs_logp": 1}
    assert [s["key"] for s in second["series"]] == ["mismatch/k3"] and shown["KL"]["axes"] == 1


def test_the_header_says_model_algorithm_steps_time_and_accuracy_of_finished_and_unfinished_runs(tmp_path):
    done = _run(tmp_path / "done", [{"step": 1, "step_s": 2.0}, {"step": 2, "step_s": 2.5}])
    (done / "config.yaml").write_text("steps: 2\nmodel: {path: builtin:tiny}\nalgorithm: {advantage: rloo, "
                                      "loss: cispo, kl_coef: 0.05}\n")
    (done / "summary.json").write_text(json.dumps({"model": "/cache/tiny-1", "wall_s": 61.5, "steps": 2,
                                                   "eval_before": {"accuracy": 0.25}, "eval_after": {"accuracy": 0.5}}))
    going = _run(tmp_path / "going", [{"step": 1, "step_s": 2.0}, {"step": 2, "step_s": 2.5}])

    data = _data(build_report([done, going], tmp_path / "r.html").read_text())

    assert data["header"] == [
        {"name": "done", "model": "/cache/tiny-1", "algorithm": "rloo · cispo · KL 0.05", "steps": 2, "planned": 2,
         "wall_s": 61.5, "finished": True, "before": 0.25, "after": 0.5},
        {"name": "going", "model": None, "algorithm": "grpo · ppo_clip", "steps": 2, "planned": 2, "wall_s": 4.5,
         "finished": False, "before": None, "after": None}]
