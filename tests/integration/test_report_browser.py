"""The report of two short real runs, rendered by headless Chromium: the page runs without an
error, every plot has points, both runs are in the legends and the rollout browser lists
samples; and the report of a run of 40 domains (its metrics.jsonl written here) draws its
per-domain metrics as heat-maps, weakest domains on top. A screenshot is kept under the test's tmp folder and, when the environment variable
TEMPERING_TEST_ARTIFACTS names a folder, there too.

Chromium is Debian's ``chromium``, installed with apt-get when missing; the test is skipped,
saying why, only where it cannot be installed.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tempering.cli import main
from tempering.config import TrainConfig
from tempering.train import train


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of a chromium binary, installed with apt-get when missing."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        install = ["apt-get", "install", "-y", "-q", "chromium"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
            subprocess.run(install, env=env, capture_output=True, timeout=900)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("chromium is not installed and `apt-get install -y chromium` could not install it "
                    "(needs root and Debian's package lists)")
    return found


def _browse(chromium: str, page: Path, *args: str, fragment: str = "") -> str:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--virtual-time-budget=10000", *args, page.as_uri() + fragment]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def _run(tiny_model_dir, run_dir: Path, seed: int) -> Path:
    train(TrainConfig.model_validate({
        "seed": seed, "steps": 3, "threads": 1, "model": {"path": str(tiny_model_dir)}, "run_dir": str(run_dir),
        "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 12},
        "eval": {"problems_per_task": 2, "max_new_tokens": 12, "every": 2},
        "algorithm": {"kl_coef": 0.01}, "checkpoint": {"every": 0}, "logging": {"samples": 0.5}}), progress=False)
    return run_dir


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir, tmp_path_factory):
    """The report page of two short runs (seeds 0 and 1)."""
    folder = tmp_path_factory.mktemp("report")
    runs = [_run(tiny_model_dir, folder / f"seed{seed}", seed) for seed in (0, 1)]
    page = folder / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", *map(str, runs), "--out", str(page)])
    assert done.value.code == 0
    return runs, page


def _ticks(svg: str, side: str) -> list[float]:
    """The values a plot's axis labels read: ``left`` (y), ``right`` (y) or ``step`` (x)."""
    anchor = {"left": 'text-anchor="end"', "right": 'text-anchor="start"', "step": 'class="tick step"'}[side]
    return [float(t) for t in re.findall(rf'<text[^>]*{anchor}[^>]*>([^<]+)</text>', svg)]


def _round_step(values: list[float]) -> bool:
    """Whether ticks are evenly spaced by 1, 2 or 5 times a power of ten, each a multiple of it."""
    steps = {round(b - a, 12) for a, b in zip(values, values[1:])}
    if len(values) < 2 or len(steps) != 1 or not all(math.isclose(s, min(steps), rel_tol=1e-6) for s in steps):
        return False
    step = min(steps)
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 5)) and all(
        math.isclose(v / step, round(v / step), abs_tol=1e-6) for v in values)


def test_the_report_of_two_runs_renders_in_chromium_with_data_in_every_plot(two_runs, tmp_path, chromium):
    runs, page = two_runs
    dom = _browse(chromium, page, "--dump-dom")
    screenshot = tmp_path / "report.png"
    _browse(chromium, page, "--window-size=1280,3000", f"--screenshot={screenshot}")
    if os.environ.get("TEMPERING_TEST_ARTIFACTS"):
        artifacts = Path(os.environ["TEMPERING_TEST_ARTIFACTS"])
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(screenshot, artifacts / "report.png")
        shutil.copy(page, artifacts / "report.html")

    errors = re.search(r'<html[^>]* data-errors="([^"]*)"', dom)
    assert errors is None, f"the page reported errors: {errors.group(1) if errors else ''}"
    assert re.search(r'<body[^>]* data-rendered="1"', dom), "the script did not finish"
    plots = re.findall(r'<svg[^>]*class="plot"[^>]*>', dom)
    titles = [re.search(r'data-title="([^"]*)"', p).group(1) for p in plots]
    assert {"Reward", "Accuracy", "Mixture weights", "Completion length", "KL", "Entropy", "Clip fraction",
            "Dropped groups", "Stale rollouts", "Monitors", "Throughput", "Time split"} <= set(titles)
    for plot, title in zip(plots, titles):
        assert int(re.search(r'data-points="(\d+)"', plot).group(1)) > 0, f"plot {title} has no points"
    assert "seed0 · reward" in dom and "seed1 · reward" in dom, "both runs in the legends"
    samples = re.findall(r'<details class="sample" data-kind="(\w+)"', dom)
    assert {"best", "worst"} <= set(samples) and len(samples) >= 2 * 3 * 2
    assert screenshot.stat().st_size > 10_000
    assert json.loads((runs[0] / "summary.json").read_text())["steps"] == 3


def test_the_header_names_each_run_and_ticks_sit_at_round_numbers(two_runs, chromium, tiny_model_dir):
    runs, page = two_runs
    dom = _browse(chromium, page, "--dump-dom")
    header = re.search(r'<table id="header">(.*?)</table>', dom, re.S).group(1)
    rows = [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", header)]
    assert rows[0] == ["run", "model", "algorithm", "steps", "wall time", "held-out accuracy"]
    for row, run in zip(rows[1:], runs):
        summary = json.loads((run / "summary.json").read_text())
        assert row[:4] == [run.name, str(tiny_model_dir), "grpo · ppo_clip · KL 0.01", "3"]
        assert re.fullmatch(r"\d+(\.\d)? s|\d+ min \d+ s", row[4]), row[4]
        before, after = (f"{v:.4g}" if v else "0" for v in (summary["eval_before"]["accuracy"],
                                                         summary["eval_after"]["accuracy"]))
        assert row[5] == f"{before} → {after}"
    for svg in re.findall(r'<svg[^>]*class="plot".*?</svg>', dom, re.S):
        title = re.search(r'data-title="([^"]*)"', svg).group(1)
        assert _round_step(_ticks(svg, "left")), f"{title}: y ticks {_ticks(svg, 'left')}"
        assert _ticks(svg, "step") == [1, 2, 3], f"{title}: x ticks {_ticks(svg, 'step')}"
        if 'data-axes="2"' in svg:
            assert _round_step(_ticks(svg, "right")), f"{title}: right ticks {_ticks(svg, 'right')}"


def test_the_mismatch_plot_reads_ratio_and_log_prob_gap_on_separate_axes(two_runs, chromium):
    _, page = two_runs
    dom = _browse(chromium, page, "--dump-dom")
    mismatch = re.search(r'<svg[^>]*data-title="Sampler/learner mismatch".*?</svg>', dom, re.S).group(0)
    axis = {key: int(a) for key, a in re.findall(r'<polyline[^>]*data-key="([^"]+)" data-axis="(\d)"', mismatch)}
    assert axis["ratio_mean"] != axis["mismatch/abs_logp"], axis
    left, right = _ticks(mismatch, "left"), _ticks(mismatch, "right")
    assert max(map(abs, left)) / max(map(abs, right)) > 30 or max(map(abs, right)) / max(map(abs, left)) > 30


def test_the_smoothing_control_draws_a_moving_average_over_faint_raw_lines(two_runs, chromium):
    _, page = two_runs
    smoothed = _browse(chromium, page, "--dump-dom")
    assert re.search(r'<body[^>]* data-smoothing="0.6"', smoothed), "TensorBoard's default"
    plain = _browse(chromium, page, "--dump-dom", fragment="#smoothing=0")
    assert re.search(r'<body[^>]* data-smoothing="0"', plain)
    def lines(dom, kind):
        return re.findall(rf'<polyline points="([^"]+)"[^>]*class="{kind}" data-key="([^"]+)"', dom)

    raw, faint, averaged = lines(plain, "raw"), lines(smoothed, "raw faint"), lines(smoothed, "smoothed")
    assert faint == raw and len(averaged) == len(raw), "every raw line is kept, faint, under its average"
    changed = [key for (points, key), (mean, _) in zip(raw, averaged) if points != mean]
    assert "entropy" in changed, "a series that varies is smoothed"
    assert all(points.split()[0] == mean.split()[0] for (points, _), (mean, _) in zip(raw, averaged)), \
        "debiased: each average starts at its first value"
    assert '<input id="smoothing" type="range"' in smoothed


ODD = '<b>"quoted" & odd</b>'


@pytest.fixture(scope="module")
def forty_domains(tmp_path_factory) -> tuple[Path, list[str]]:
    """The report of a run of 40 domains x 50 steps (domain i succeeding at about i/40, one
    with a name HTML must escape), and its domains weakest first."""
    folder = tmp_path_factory.mktemp("forty")
    names = [f"rg:task_{i:02d}" for i in range(39)] + [ODD]
    skill = {name: (i + 1) / 41 for i, name in enumerate(names)} | {ODD: 0.05}
    records = []
    for step in range(1, 51):
        record = {"step": step, "reward": 0.5, "accuracy": 0.5, "step_s": 1.0}
        for name in names:
            record |= {f"domain/{name}/success": skill[name] * (0.5 + step / 100), f"domain/{name}/weight": 1 / 40,
                       f"domain/{name}/draw_share": 1 / 40, f"domain/{name}/grad_share": (1 - skill[name]) / 20,
                       f"domain/{name}/paused": float(name == "rg:task_03" and 20 < step < 30)}
            if step % 10 == 0:
                record[f"eval/{name}"] = skill[name] * step / 50
        records.append(record)
    run = folder / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"steps": 50, "eval_before": {
        "accuracy": 0.1, "per_task": {name: 0.1 for name in names} | {"rg:task_20": 0.99}}}))
    page = folder / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", str(run), "--out", str(page)])
    assert done.value.code == 0
    return page, sorted(names, key=lambda n: skill[n])


def test_the_report_of_forty_domains_draws_heatmaps_with_the_weakest_domains_on_top(forty_domains, chromium,
                                                                                     tmp_path):
    page, weakest_first = forty_domains
    dom = _browse(chromium, page, "--dump-dom")
    screenshot = tmp_path / "forty.png"
    _browse(chromium, page, "--window-size=1500,4000", f"--screenshot={screenshot}")
    if os.environ.get("TEMPERING_TEST_ARTIFACTS"):
        shutil.copy(screenshot, Path(os.environ["TEMPERING_TEST_ARTIFACTS"]) / "report-40-domains.png")

    errors = re.search(r'<html[^>]* data-errors="([^"]*)"', dom)
    assert errors is None, f"the page reported errors: {errors.group(1) if errors else ''}"
    assert re.search(r'<body[^>]* data-rendered="1"', dom), "the script did not finish"
    maps = {re.search(r'data-family="([^"]*)"', m.group(1)).group(1): m.group(0)
            for m in re.finditer(r'<svg([^>]*class="heatmap"[^>]*)>.*?</svg>', dom, re.S)}
    assert list(maps) == ["success", "eval/", "weight", "draw_share", "grad_share", "paused"]
    for family, svg in maps.items():
        rows = [html.unescape(d) for d in re.findall(r'<g class="row" data-domain="([^"]*)"', svg)]
        assert rows == weakest_first, f"{family}: rows {rows[:3]}..."
        assert len(re.findall(r"<rect", svg)) >= 40 * (5 if family == "eval/" else 50)
    assert '>&lt;b&gt;"quoted" &amp; odd&lt;/b&gt;<' in maps["success"], "the odd name is a row's text"
    assert '<b>"quoted"' not in dom, "and never markup"
    paused = re.search(r'<g class="row" data-domain="rg:task_03".*?</g>', maps["paused"], re.S).group(0)
    assert "rg:task_03\nstep 25: 1</title>" in paused and "rg:task_03\nstep 30: 0</title>" in paused
    assert not re.findall(r'<polyline[^>]*data-key="domain/', dom), "no per-domain line is drawn"
    heldout = re.search(r'<table class="heldout".*?</table>', dom, re.S).group(0)
    tasks = [html.unescape(t) for t in re.findall(r'<tr data-task="([^"]*)"', heldout)]
    assert tasks[0] == "rg:task_20", "the task that fell from 99% to about 51% is first"
    assert screenshot.stat().st_size > 10_000


def test_accuracy_against_length_draws_a_line_per_evaluation_over_tokens_unsmoothed(tmp_path, chromium):
    by_length = lambda a, b, c: {"256": a, "1024": b, "4096": c}  # noqa: E731
    records = [{"step": step, "reward": 0.1 * step, "domain/lc/length_tokens": 256 if step < 3 else 1024}
               | ({"eval/lc": 0.5, "eval/lc/len_256": 0.9, "eval/lc/len_1024": 0.5, "eval/lc/len_4096": 0.1}
                  if step == 2 else {}) for step in range(1, 5)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps({"steps": 4, "eval_before": {"by_length": {"lc": by_length(0.5, 0.2, 0.0)}},
                                                  "eval_after": {"by_length": {"lc": by_length(1.0, 0.8, 0.3)}}}))
    page = tmp_path / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", str(run), "--out", str(page)])
    assert done.value.code == 0

    dom = _browse(chromium, page, "--dump-dom")  # the page's default smoothing, 0.6

    errors = re.search(r'<html[^>]* data-errors="([^"]*)"', dom)
    assert errors is None, f"the page reported errors: {errors.group(1) if errors else ''}"
    svg = re.search(r'<svg[^>]*data-title="Accuracy against length · lc".*?</svg>', dom, re.S).group(0)
    assert 'data-points="9"' in svg and ">tokens</text>" in svg
    lines = re.findall(r'<polyline points="([^"]+)"[^>]*class="(\w+)" data-key="([^"]+)"', svg)
    assert [(kind, key) for _, kind, key in lines] == [("raw", "before"), ("raw", "step 2"), ("raw", "after")]
    xs = [[float(p.split(",")[0]) for p in points.split()] for points, _, _ in lines]
    assert all(x == xs[0] and x == sorted(x) and len(set(x)) == 3 for x in xs), "the same three lengths, rising"
    assert '1024 tokens: 0.8</title>' in svg


def test_accuracy_by_evidence_depth_is_a_heat_map_per_evaluation_lengths_down_depths_across(tmp_path, chromium):
    bins = ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"]
    grid = lambda far, near: {"256": dict(zip(bins, [1.0] * 5)),  # noqa: E731
                              "1024": dict(zip(bins, [far, far, None, near, near])),
                              "4096": dict(zip(bins, [0.0, 0.0, 0.0, far, near]))}
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.1 * s}) + "\n" for s in range(1, 5)))
    lengths = lambda a, b: {"256": 1.0, "1024": a, "4096": b}  # noqa: E731
    (run / "summary.json").write_text(json.dumps({
        "steps": 4, "eval_before": {"by_length": {"lc": lengths(0.4, 0.1)}, "by_depth": {"lc": grid(0.0, 0.5)}},
        "eval_after": {"by_length": {"lc": lengths(0.9, 0.3)}, "by_depth": {"lc": grid(0.75, 1.0)}}}))
    page = tmp_path / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", str(run), "--out", str(page)])
    assert done.value.code == 0

    dom = _browse(chromium, page, "--dump-dom")

    errors = re.search(r'<html[^>]* data-errors="([^"]*)"', dom)
    assert errors is None, f"the page reported errors: {errors.group(1) if errors else ''}"
    for when, far in (("before", "0"), ("after", "0.75")):
        svg = re.search(rf'<svg[^>]*data-title="Accuracy by length and evidence depth · lc · {when}"[^>]*>.*?</svg>',
                        dom, re.S).group(0)
        assert 'data-rows="3"' in svg and 'data-columns="5"' in svg
        rows = re.findall(r'<g class="row" data-domain="(\d+)"', svg)
        assert rows == ["256", "1024", "4096"], "lengths down, shortest first"
        assert f"1024\nevidence at 0-20%: {far}</title>" in svg
        assert 'fill="#f2f2f2"' in svg, "the empty bin is grey"
        assert ">0-20%</text>" in svg and ">80-100%</text>" in svg and ">all</text>" in svg
    assert re.search(r'<g class="row" data-domain="1024" data-last="0.9"', dom), "the row ends with its accuracy"
