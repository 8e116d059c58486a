"""``bench/vllm_rollouts.py``: a clean skip where vLLM or a CUDA device is missing."""

import pytest


def test_without_vllm_or_a_gpu_the_bench_prints_only_why(bench_module):
    bench = bench_module("vllm_rollouts")
    why = bench.unavailable()
    if why is None:
        pytest.skip("vLLM and a CUDA device are here: the bench would run in full")
    assert bench.main([]) == {"skipped": why}
