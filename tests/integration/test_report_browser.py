"""The report of two short real runs, rendered by headless Chromium: the page runs without an
error, every plot has points, both runs are in the legends and the rollout browser lists
samples. A screenshot is kept under the test's tmp folder and, when the environment variable
TEMPERING_TEST_ARTIFACTS names a folder, there too.

Chromium is Debian's ``chromium``, installed with apt-get when missing; the test is skipped,
saying why, only where it cannot be installed.
"""

from __future__ import annotations

import json
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


def _browse(chromium: str, page: Path, *args: str) -> str:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--virtual-time-budget=10000", *args, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def _run(tiny_model_dir, run_dir: Path, seed: int) -> Path:
    train(TrainConfig.model_validate({
        "seed": seed, "steps": 3, "threads": 1, "model": {"path": str(tiny_model_dir)}, "run_dir": str(run_dir),
        "rollout": {"prompts_per_step": 3, "group_size": 4, "max_new_tokens": 12},
        "eval": {"problems_per_task": 2, "max_new_tokens": 12, "every": 2},
        "algorithm": {"kl_coef": 0.01}, "checkpoint": {"every": 0}, "logging": {"samples": 0.5}}), progress=False)
    return run_dir


def test_the_report_of_two_runs_renders_in_chromium_with_data_in_every_plot(tiny_model_dir, tmp_path, chromium):
    runs = [_run(tiny_model_dir, tmp_path / f"seed{seed}", seed) for seed in (0, 1)]
    page = tmp_path / "report.html"
    with pytest.raises(SystemExit) as done:
        main(["report", *map(str, runs), "--out", str(page)])
    assert done.value.code == 0

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
