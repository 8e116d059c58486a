"""``bench/gpu.py``: a clean skip without CUDA, and the same measurements on CPU with the miniature model."""

import pytest
import torch

SMALL = ["--steps", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "8", "--repeats", "1",
         "threads=1", "eval.problems_per_task=5"]


def test_without_cuda_the_bench_prints_only_a_note(bench_module):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the bench would run in full")
    result = bench_module("gpu").main([])
    assert list(result) == ["skipped"] and result["skipped"].startswith("no CUDA device")


def test_on_cpu_it_times_the_quickstart_and_a_models_sampler_call_and_learner_step(tiny_model_dir, bench_module):
    gpu = bench_module("gpu")
    small = [*SMALL, f"model.path={tiny_model_dir}"]
    result = gpu.main(["--device", "cpu", "--model", str(tiny_model_dir), *small])
    assert result["quickstart"]["steps"] == 1
    assert result["quickstart"]["model"] == str(tiny_model_dir)
    part = result["model"]
    assert part["completion_tokens"] > 0 and part["train_tokens"] > part["completion_tokens"]
    assert part["sample_tok_s"] > 0 and part["train_tok_s"] > 0
    missing = gpu.model_step(torch.device("cpu"), *gpu.parse(["--model", "/nonexistent/model", *small]))
    assert list(missing) == ["skipped"] and "does not exist" in missing["skipped"]
