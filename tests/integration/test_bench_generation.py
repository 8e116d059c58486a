"""``bench/generation.py --quick`` on the miniature model: it runs and reports what it promises."""

import pytest


def test_quick_generation_bench_reports_both_sides_per_batch_size(tiny_model_dir, bench_module):
    result = bench_module("generation").main(["--quick", "--model", str(tiny_model_dir), "--threads", "1",
                            "--precisions", "fp32,bf16", "--workloads", "group,group_fixed"])
    for batch in ("batch_1", "batch_8"):
        row = result[batch]
        assert set(row) == {"tempering_tok_s", "generate_tok_s", "ratio"}
        assert row["tempering_tok_s"] > 0 and row["generate_tok_s"] > 0
        assert row["ratio"] == pytest.approx(row["tempering_tok_s"] / row["generate_tok_s"], abs=0.01)
    assert result[batch] == result["results"]["fp32"]["group"][batch]
    assert set(result["results"]["bf16"]) == {"group", "group_fixed"}
