"""A real run of a long_context curriculum on the miniature model: every evaluation (before,
periodic, after) reads held-out accuracy at each length, the steps log the curriculum's length,
and the report of the run holds the accuracy-against-length plot."""

import json
import re

from tempering.config import TrainConfig
from tempering.reporting.html import build_report
from tempering.train import train

LENGTHS = [96, 160, 224]


def test_a_length_curriculum_run_reads_accuracy_at_every_length_at_every_evaluation(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    summary = train(TrainConfig.model_validate({
        "seed": 0, "steps": 3, "threads": 1, "model": {"path": str(tiny_model_dir)}, "run_dir": str(run_dir),
        "tasks": [{"name": "long_context", "options": {"lengths": LENGTHS, "chars_per_token": 1.0}}],
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6},
        "eval": {"problems_per_task": 2, "problems_per_length": 2, "max_new_tokens": 6, "every": 2},
        "checkpoint": {"every": 0}, "logging": {"samples": 0}}), progress=False)

    for when in ("eval_before", "eval_after"):
        curve = summary[when]["by_length"]["long_context"]
        assert list(curve) == [str(n) for n in LENGTHS] and all(0 <= v <= 1 for v in curve.values()), when
        depths = summary[when]["by_depth"]["long_context"]
        assert list(depths) == list(curve) and all(len(row) == 5 for row in depths.values()), when
    assert json.loads((run_dir / "summary.json").read_text())["eval_after"]["by_length"] == summary["eval_after"]["by_length"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["domain/long_context/length_tokens"] == LENGTHS[r["domain/long_context/level"]] for r in records)
    periodic = [r for r in records if any("/len_" in k for k in r)]
    assert [r["step"] for r in periodic] == [2]
    assert sorted(k for k in periodic[0] if "/len_" in k) == sorted(f"eval/long_context/len_{n}" for n in LENGTHS)

    page = build_report([run_dir], tmp_path / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1))
    plot = next(p for p in data["panels"] if p["title"] == "Accuracy against length · long_context")
    assert [s["key"] for s in plot["series"]] == ["before", "step 2", "after"]
    assert all([x for x, _ in s["points"]] == LENGTHS for s in plot["series"])
    maps = [m for m in data["heatmaps"] if m["family"] == "depth"]
    assert [m["title"].rsplit(" · ", 1)[1] for m in maps] == ["before", "after"]
    assert all(m["rows"] == [str(n) for n in LENGTHS] for m in maps)
    # beside the page, the same curves before and after as a picture of their own, a point per length
    picture = (tmp_path / "accuracy-by-length-long_context.svg").read_text()
    assert picture.count("<polyline") == 2 and picture.count("<circle") == 2 * len(LENGTHS)
    assert "<title>before</title>" in picture and "<title>after</title>" in picture
