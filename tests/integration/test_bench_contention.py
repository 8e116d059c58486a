"""``bench/contention.py`` on a miniature pre-training: each setting runs in its own process
with the thread count and OpenMP waits it names, idle and beside a real busy process."""

import os

import pytest

MINI = ["pretrain.hidden_size=16", "pretrain.layers=1", "pretrain.heads=2", "pretrain.batch_docs=2"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_contention_bench_runs_both_settings_idle_and_busy(bench_module):
    cores = len(os.sched_getaffinity(0))
    result = bench_module("contention").compare("pretrain", 1, MINI)

    assert set(result) == {"old", "new"}
    for setting in result.values():
        assert setting["idle"]["s_per_step"] > 0 and setting["busy"]["s_per_step"] > 0
        assert setting["busy_over_idle"] == pytest.approx(setting["busy"]["s_per_step"] / setting["idle"]["s_per_step"])
    assert result["old"]["busy"]["threads_at_end"] == cores
    assert result["new"]["busy"]["threads_at_end"] < cores
