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


ODD = '<b>"quoted" & odd</b>'
"""A domain name with characters that HTML and JSON both care about."""


def _forty_domains(folder, steps=50):
    """A run of 40 domains: domain i succeeds at about i/40 (the odd-named one at 0.31), the
    shares follow the success order backwards, and held-out accuracy is logged every 10 steps."""
    names = [f"rg:task_{i:02d}" for i in range(39)] + [ODD]
    skill = {name: (i + 1) / 41 for i, name in enumerate(names)} | {ODD: 0.31}
    records = []
    for step in range(1, steps + 1):
        record = {"step": step, "reward": 0.5, "accuracy": 0.5}
        for name in names:
            record[f"domain/{name}/success"] = skill[name] * (0.5 + step / (2 * steps))
            record[f"domain/{name}/weight"] = 1 / 40
            record[f"domain/{name}/grad_share"] = (1 - skill[name]) / 20
            if step % 10 == 0:
                record[f"eval/{name}"] = skill[name] * step / steps
        records.append(record)
    return _run(folder, records), sorted(names, key=lambda n: skill[n])


def test_forty_domains_are_heatmaps_with_the_weakest_domains_on_top(tmp_path):
    run, weakest_first = _forty_domains(tmp_path / "a")
    html = build_report([run], tmp_path / "r.html").read_text()
    data = _data(html)

    maps = {m["family"]: m for m in data["heatmaps"]}
    assert list(maps) == ["success", "eval/", "weight", "grad_share"]
    success = maps["success"]
    assert success["rows"] == weakest_first and success["rows"][0] == "rg:task_00"
    assert len(success["cells"]) == 40 and {len(row) for row in success["cells"]} == {50}
    assert success["columns"][0] == [1, 1] and success["columns"][-1] == [50, 50]
    assert (success["low"], success["high"]) == (0.0, 1.0), "accuracy-like: one fixed scale"
    assert success["cells"][0][-1] == success["last"][0] == pytest.approx(1 / 41)
    assert maps["eval/"]["rows"] == weakest_first and len(maps["eval/"]["columns"]) == 5
    assert maps["grad_share"]["rows"] == weakest_first, "other families keep the run's (success) order"
    assert maps["grad_share"]["low"] == 0.0 and maps["grad_share"]["high"] == pytest.approx(40 / 41 / 20)
    assert all(not s["key"].startswith(("domain/", "eval/rg")) for p in data["panels"] for s in p["series"]), \
        "no per-domain line in the plots"
    assert [s["key"] for s in next(p for p in data["panels"] if p["title"] == "Accuracy")["series"]] == ["accuracy"]
    assert ODD not in html and "<b>" not in html, "the name reaches the page only inside the escaped JSON"
    assert html.count("<script") == 3


def test_a_few_domains_stay_lines_shares_are_heatmaps_and_unknown_metrics_are_shown(tmp_path):
    records = [{"step": s, "domain/add/weight": 0.5, "domain/sub/weight": 0.5, "domain/add/draw_share": 0.75,
                "domain/sub/draw_share": 0.25, "domain/add/novelty": s, "domain/sub/novelty": 2 * s}
               for s in (1, 2)]
    data = _data(build_report([_run(tmp_path / "a", records)], tmp_path / "r.html").read_text())

    shown = {p["title"]: sorted(s["key"] for s in p["series"]) for p in data["panels"]}
    assert shown == {"Mixture weights": ["domain/add/weight", "domain/sub/weight"],
                     "novelty per domain": ["domain/add/novelty", "domain/sub/novelty"]}
    (share,) = data["heatmaps"]
    assert share["family"] == "draw_share" and share["rows"] == ["add", "sub"], "no success logged: by name"
    assert share["cells"] == [[0.75, 0.75], [0.25, 0.25]] and share["order"] == "by name"


def test_a_new_per_domain_metric_of_many_domains_is_a_heatmap_titled_by_its_name(tmp_path):
    records = [{"step": 1, **{f"domain/d{i}/novelty": float(i) for i in range(7)}}]
    data = _data(build_report([_run(tmp_path / "a", records)], tmp_path / "r.html").read_text())
    (novelty,) = data["heatmaps"]
    assert novelty["title"] == "novelty per domain" and novelty["rows"] == [f"d{i}" for i in range(7)]
    assert (novelty["low"], novelty["high"]) == (0.0, 6.0) and data["panels"] == []


def test_long_runs_have_their_steps_grouped_into_at_most_a_hundred_columns(tmp_path):
    records = [{"step": s, **{f"domain/d{i}/success": (s % 2) * 0.5 for i in range(7)}} for s in range(1, 251)]
    data = _data(build_report([_run(tmp_path / "a", records)], tmp_path / "r.html").read_text())
    (success,) = data["heatmaps"]
    assert len(success["columns"]) == 84 and success["columns"][:2] == [[1, 3], [4, 6]]
    assert success["cells"][0][:2] == [pytest.approx(1 / 3), pytest.approx(1 / 6)], "the mean of a column's steps"
    assert success["columns"][-1] == [250, 250]


def test_held_out_accuracy_per_task_first_and_last_most_dropped_first_and_across_runs(tmp_path):
    a = _run(tmp_path / "a", [{"step": 2, "eval/add": 0.5, "eval/sub": 0.25, "eval/accuracy": 0.375},
                              {"step": 4, "eval/add": 0.75, "eval/sub": 0.5, "eval/accuracy": 0.625}])
    (a / "summary.json").write_text(json.dumps({
        "steps": 4, "eval_before": {"accuracy": 0.4, "per_task": {"add": 0.2, "sub": 0.6, "mul": 0.1}},
        "eval_after": {"accuracy": 0.5, "per_task": {"add": 0.9, "sub": 0.3, "mul": None}}}))
    b = _run(tmp_path / "b", [{"step": 2, "eval/add": 0.5, "eval/sub": 0.5},
                              {"step": 4, "eval/add": 0.25, "eval/sub": 0.75}])
    c = _run(tmp_path / "c", [{"step": 1, "reward": 0.0}])

    data = _data(build_report([a, b, c], tmp_path / "r.html").read_text())

    first, second, third = data["heldout"]
    assert [(r["task"], r["first_at"], r["last_at"]) for r in first] == [
        ("sub", "before", "after"), ("add", "before", "after"), ("mul", "before", "before")]
    assert [r["change"] for r in first] == [pytest.approx(-0.3), pytest.approx(0.7), None]
    assert [(r["task"], r["change"]) for r in second] == [("add", -0.25), ("sub", 0.25)] and third == []
    across = data["heatmaps"][-1]
    assert across["family"] == "heldout_change" and across["columns"] == ["a", "b"]
    assert across["rows"] == ["sub", "add"] and across["cells"] == [[pytest.approx(-0.3), 0.25],
                                                                     [pytest.approx(0.7), -0.25]]
    assert across["high"] == -across["low"] == pytest.approx(0.7), "a scale centred on no change"


def test_accuracy_against_length_is_one_line_per_evaluation_and_only_where_lengths_were_evaluated(tmp_path):
    curve = lambda a, b, c: {"256": a, "1024": b, "4096": c}  # noqa: E731
    a = _run(tmp_path / "a", [{"step": 1, "reward": 0.5, "domain/lc/length_tokens": 256, "eval/lc": 0.5},
                              {"step": 2, "reward": 0.6, "eval/lc": 0.75, "eval/accuracy": 0.75,
                               "eval/lc/len_256": 1.0, "eval/lc/len_1024": 0.5, "eval/lc/len_4096": 0.0}])
    (a / "summary.json").write_text(json.dumps({
        "steps": 2, "eval_before": {"accuracy": 0.5, "per_task": {"lc": 0.5}, "by_length": {"lc": curve(0.75, 0.25, None)}},
        "eval_after": {"accuracy": 0.8, "per_task": {"lc": 0.8}, "by_length": {"lc": curve(1.0, 0.75, 0.25)}}}))
    b = _run(tmp_path / "b", [{"step": 1, "reward": 0.5, "eval/lc": 0.5}, {"step": 2, "reward": 0.5, "eval/lc": 0.6}])

    with_lengths = _data(build_report([a], tmp_path / "a.html").read_text())
    titles = [p["title"] for p in with_lengths["panels"]]
    assert titles.index("Accuracy against length · lc") == titles.index("Accuracy") + 1
    panel = with_lengths["panels"][titles.index("Accuracy against length · lc")]
    assert panel["x"] == "tokens" and [(s["key"], s["points"]) for s in panel["series"]] == [
        ("before", [[256, 0.75], [1024, 0.25]]), ("step 2", [[256, 1.0], [1024, 0.5], [4096, 0.0]]),
        ("after", [[256, 1.0], [1024, 0.75], [4096, 0.25]])]
    step_keys = {s["key"] for p in with_lengths["panels"] if "x" not in p for s in p["series"]}
    assert "eval/lc" in step_keys and not any("/len_" in k for k in step_keys), "per-length keys: only against length"
    assert "domain/lc/length_tokens" in step_keys
    assert [r["task"] for r in with_lengths["heldout"][0]] == ["lc"]

    without = _data(build_report([b], tmp_path / "b.html").read_text())
    assert not any("x" in p or "length" in p["title"] for p in without["panels"])
    both = _data(build_report([a, b], tmp_path / "ab.html").read_text())
    assert [p["title"] for p in both["panels"] if "x" in p] == ["Accuracy against length · lc · a"]


def test_the_length_picture_places_lengths_on_a_log_scale_and_accuracy_upwards():
    from tempering.reporting.lengths import length_svg, length_svgs

    svg = length_svg([("before", {256: 0.0, 1024: 0.5, 4096: 1.0})], "lc <x>")
    points = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', svg).group(1).split()]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    assert abs((xs[1] - xs[0]) - (xs[2] - xs[1])) < 0.2  # 256 -> 1,024 and 1,024 -> 4,096 are both x4
    assert ys[0] > ys[1] > ys[2]  # higher accuracy drawn higher
    assert "lc &lt;x&gt;" in svg  # the title escaped
    run = {"summary": {"eval_after": {"by_length": {"long_context:a": {"256": 1.0}}}}, "metrics": []}
    assert list(length_svgs([run, run], ["r1", "r2"])) == ["accuracy-by-length-r1-long_context_a.svg",
                                                          "accuracy-by-length-r2-long_context_a.svg"]
