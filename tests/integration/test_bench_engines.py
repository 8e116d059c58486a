"""``bench/engines.py``: a clean skip without vLLM (a failure under CI, which installs it); with it,
every engine's tokens/s on the miniature model."""

from test_vllm_server import VLLM_PRETRAIN, require_vllm


def test_the_bench_measures_every_engine_or_says_why_not(bench_module, tempering_cache):
    bench = bench_module("engines")
    why = bench.vllm_missing()
    overrides = [f"pretrain.{key}={value}" for key, value in VLLM_PRETRAIN.items()]
    result = bench.main(["--batch-sizes", "8", "--repeats", "1", "--threads", "1", "--skip-rl", *overrides])
    if why is not None:
        assert result == {"skipped": why}
        require_vllm()
    speeds = result["generation"]["batch_8"]
    assert set(speeds) == {"builtin_tok_s", "builtin_onednn_tok_s", "vllm_eager_tok_s"}
    assert all(value > 0 for value in speeds.values())
    assert result["settings"]["vllm"].startswith("0.32")
