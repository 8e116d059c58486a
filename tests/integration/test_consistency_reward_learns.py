"""The consistency reward teaches a policy to cite the statement its answer rests on, where the
outcome reward does not: ``bench/cite_rewards.py`` as docs/benchmarks.md runs it, then its
control.

The policy is builtin:tiny-long fine-tuned to answer long-context retrieval (a code changed
later in the document, its lines numbered) with the latest value after a cite of the stale line
half the time and of the right line otherwise. Both arms train 100 steps from it, 3 seeds; the
held-out share of answers right and citing exactly their evidence (``cites_right``) must end
higher under the consistency reward than under the outcome reward by more than the seed spread
and by at least :data:`MARGIN`. The control is the same bench at ``--weight 0`` (the consistency
reward paying the outcome alone): its margin must not pass the spread, so the gain is the
grounding's and not the reward's plumbing. Measured on a shared AMD EPYC (one thread a run,
float32): margin +33.3 points against a spread of 25.0 (docs/tasks-and-rewards.md). With the
reward broken (its grounding reading the stale statement as the evidence) the consistency arm
ends at 0% in every seed, 24.5 points under the outcome arm, and the test fails.

Marked slow: the long model's pre-training (about 10 minutes), the fine-tuning (about 5) and
nine runs of 100 steps (about 1 minute each).
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARGIN = 0.15
"""The least ``cites_right`` margin of the consistency arm over the outcome arm (means over seeds)."""


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.mark.slow
def test_the_consistency_reward_raises_right_cites_past_the_seed_spread_and_its_control_does_not(
        tempering_cache, bench_module, tmp_path):
    bench = bench_module("cite_rewards")
    report = bench.main(["--out", str(tmp_path), "threads=1"])
    found = report["checks"]["consistency"]
    assert found["beyond_spread"] and found["cites_right_margin"] >= MARGIN, found
    assert report["arms"]["consistency"]["cites_right"]["change"]["mean"] >= MARGIN, report["arms"]
    control = bench.main(["--out", str(tmp_path), "--weight", "0", "threads=1"])["checks"]["consistency"]
    assert not control["beyond_spread"] and abs(control["cites_right_margin"]) < MARGIN, control
