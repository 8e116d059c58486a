"""The report of two short real runs, rendered by headless Chromium: the page runs without an
error, every plot has points, both runs are in the legends and the rollout browser lists
samples. A screenshot is kept under the test's tmp folder and, when the environment variable
TEMPERING_TEST_ARTIFACTS names a folder, there too.

Chromium is Debian's ``chromium``, installed with apt-get when missing; the test is skipped,
saying why, only where it cannot be installed.
"""

from __future__ import annotations

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
