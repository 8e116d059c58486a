"""configs/smollm2-many.yaml: thirty or more domains of three kinds, every reasoning-gym type
graded leniently at the small settings bench/domain_screen.py screened it at."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tempering.build import build_tasks
from tempering.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_smollm2_many_builds_thirty_domains_each_with_held_out_problems():
    pytest.importorskip("reasoning_gym")
    config = load_config("smollm2-many")
    tasks = build_tasks(config)
    kinds = {name.partition(":")[0] if ":" in name else "arithmetic" for name in (t.name for t in tasks)}
    assert len(tasks) >= 30 and kinds == {"arithmetic", "code", "rg"}
    for task in tasks:
        problems = task.eval_problems(2)
        assert len(problems) == 2 and problems[0].prompt != problems[1].prompt, task.name


def test_each_reasoning_gym_domain_is_graded_leniently_at_the_settings_it_was_screened_at():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from domain_screen import EASY
    finally:  # the bench's modules (domain_screen, and report beside it) stay out of other tests' imports
        sys.path.remove(str(ROOT / "bench"))
        sys.modules.pop("domain_screen", None)
        sys.modules.pop("report", None)
    for spec in load_config("smollm2-many").tasks:
        if spec.name.startswith("rg:"):
            assert spec.options["grading"] == "lenient" and spec.options["style"] == "chat", spec.name
            if "config" in spec.options:
                assert spec.options["config"] == EASY[spec.name.removeprefix("rg:")], spec.name
