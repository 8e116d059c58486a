"""``precision``: what fp32, bf16 and auto choose on each kind of CPU, the measurement kept per
CPU model and model shape, and the config a choice gives the run (tempering.models.precision)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tempering.config import ConfigError, load_config
from tempering.models import precision
from tempering.models.precision import Choice
from tempering.policy import PRECISION_FILE, resolve_precision

AMD_WITHOUT_BF16 = ("processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2\n")
AMD_WITH_AVX512_BF16 = AMD_WITHOUT_BF16.replace("7B12", "9B14").replace("avx2", "avx2 avx512f avx512_bf16")
INTEL_WITH_AMX = (AMD_WITHOUT_BF16.replace("AMD EPYC 7B12", "Intel(R) Xeon(R) Platinum 8481C")
                  .replace("avx2", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile"))
CPU = torch.device("cpu")


def small_llama(hidden: int = 32, layers: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM  # after tempering, which hides torchvision

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                                        max_position_embeddings=64))


class Timer:
    """A stand-in for timing the passes (or, named so, a decoding step's products): the speeds
    it is told, and how often it was asked."""

    def __init__(self, slow_s: float, fast_s: float, names: tuple[str, str] = ("fp32_s", "bf16_s")):
        self.seconds, self.calls = dict(zip(names, (slow_s, fast_s))), 0

    def __call__(self, model) -> dict[str, float]:
        self.calls += 1
        return dict(self.seconds)


def never(model):
    raise AssertionError("nothing is to be measured here")


def test_a_cpu_without_bf16_instructions_keeps_float32_and_measures_nothing():
    choice = precision.choose("auto", CPU, small_llama(), None, AMD_WITHOUT_BF16, "x86_64", measure=never)
    assert choice.bf16 is False and choice.measured is None
    assert "AMD EPYC 7B12 has no bf16 instructions" in choice.reason


def test_an_amx_cpu_takes_bf16_where_the_model_runs_fast_enough_in_it(tmp_path: Path):
    fast, slow = Timer(1.0, 0.2), Timer(1.0, 0.9)
    taken = precision.choose("auto", CPU, small_llama(), tmp_path / "a.json", INTEL_WITH_AMX, "x86_64", measure=fast)
    kept = precision.choose("auto", CPU, small_llama(), tmp_path / "b.json", INTEL_WITH_AMX, "x86_64", measure=slow)
    assert taken.bf16 is True and "5.00x" in taken.reason and "Xeon(R) Platinum 8481C" in taken.reason
    assert kept.bf16 is False and "1.11x" in kept.reason and f"under {precision.MIN_SPEEDUP}x" in kept.reason


def test_the_verdict_follows_the_measured_speed_up_not_the_flags_alone():
    # an AMD EPYC with AVX512-BF16 (Zen 4): bf16 products exist, whether the whole pass gains is measured
    slow = precision.choose("auto", CPU, small_llama(), None, AMD_WITH_AVX512_BF16, "x86_64", measure=Timer(1.0, 0.8))
    fast = precision.choose("auto", CPU, small_llama(), None, AMD_WITH_AVX512_BF16, "x86_64", measure=Timer(1.0, 0.5))
    assert (slow.bf16, fast.bf16) == (False, True)


def test_a_measurement_is_kept_per_cpu_model_and_model_shape(tmp_path: Path):
    cache, timer = tmp_path / PRECISION_FILE, Timer(1.0, 0.25)
    for _ in range(3):
        assert precision.choose("auto", CPU, small_llama(), cache, INTEL_WITH_AMX, "x86_64", measure=timer).bf16
    assert timer.calls == 1
    precision.choose("auto", CPU, small_llama(hidden=48), cache, INTEL_WITH_AMX, "x86_64", measure=timer)
    precision.choose("auto", CPU, small_llama(), cache, AMD_WITH_AVX512_BF16, "x86_64", measure=timer)
    assert timer.calls == 3
    entries = json.loads(cache.read_text())
    assert len(entries) == 3 and all(set(e) == {"fp32_s", "bf16_s"} for e in entries.values())


def test_a_damaged_cache_is_measured_again_and_rewritten(tmp_path: Path):
    cache, timer = tmp_path / PRECISION_FILE, Timer(1.0, 0.25)
    cache.write_text("{not json")
    assert precision.choose("auto", CPU, small_llama(), cache, INTEL_WITH_AMX, "x86_64", measure=timer).bf16
    key = next(iter(json.loads(cache.read_text())))
    cache.write_text(json.dumps({key: {"fp32_s": "fast", "bf16_s": 0}}))
    precision.choose("auto", CPU, small_llama(), cache, INTEL_WITH_AMX, "x86_64", measure=timer)
    assert timer.calls == 2 and json.loads(cache.read_text())[key] == {"fp32_s": 1.0, "bf16_s": 0.25}


def test_fp32_and_bf16_decide_without_looking_at_the_cpu():
    assert precision.choose("fp32", CPU, None, None, INTEL_WITH_AMX, "x86_64", measure=never).bf16 is False
    assert precision.choose("bf16", CPU, None, None, AMD_WITHOUT_BF16, "x86_64", measure=never).bf16 is True
    with pytest.raises(ValueError, match="fp32, bf16 or auto"):
        precision.choose("fp16", CPU, None)


def test_bf16_forced_on_a_cpu_without_it_is_said_to_be_emulated():
    reason = precision.emulated(CPU, Choice(True, "precision=bf16"), AMD_WITHOUT_BF16, "x86_64")
    assert reason.startswith("precision=bf16, but this CPU") and "set precision=auto (float32 here) or fp32" in reason
    assert precision.emulated(CPU, Choice(True, "x"), INTEL_WITH_AMX, "x86_64") is None
    assert precision.emulated(CPU, Choice(False, "x"), AMD_WITHOUT_BF16, "x86_64") is None


def test_timing_the_passes_leaves_the_model_the_random_state_and_the_threads_as_they_were():
    model = small_llama()
    model.train()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    next(model.parameters()).grad = torch.ones_like(next(model.parameters()))
    threads, state = torch.get_num_threads(), torch.random.get_rng_state()
    seconds = precision.time_passes(model, tokens=16, repeats=1)
    assert set(seconds) == {"fp32_s", "bf16_s"} and all(s > 0 for s in seconds.values())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    grads = [p.grad for p in model.parameters()]
    assert torch.equal(grads[0], torch.ones_like(grads[0])) and all(g is None for g in grads[1:])
    assert model.training and torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_choice_sets_both_sides_and_the_mismatch_correction():
    config = load_config(None, ["precision=auto", "learner.bf16=false", "rollout.bf16=true"])
    taken = precision.apply(config, Choice(True, "x"))
    assert (taken.learner.bf16, taken.rollout.bf16, taken.pipeline.mismatch_correction) == (True, True, "tis")
    kept = precision.apply(config, Choice(False, "x"))
    assert (kept.learner.bf16, kept.rollout.bf16, kept.pipeline.mismatch_correction) == (False, False, "none")
    chosen = load_config(None, ["precision=auto", "pipeline.mismatch_correction=mis_token"])
    assert precision.apply(chosen, Choice(True, "x")).pipeline.mismatch_correction == "mis_token"
    assert config.learner.bf16 is False and config.rollout.bf16 is True  # the original is not changed


def test_unset_precision_leaves_the_config_as_it_is():
    config = load_config(None, ["rollout.bf16=true"])
    assert resolve_precision(config, small_llama()) == (config, None)


def test_a_resumed_run_computes_in_the_precision_it_began_with(tmp_path: Path):
    (tmp_path / PRECISION_FILE).write_text(json.dumps({"bf16": True, "reason": "chosen at the start", "measured": None}))
    config = load_config(None, ["precision=auto", f"run_dir={tmp_path}"])
    resumed, choice = resolve_precision(config, small_llama(), resume=True)
    assert choice == Choice(True, "chosen at the start") and resumed.learner.bf16 and resumed.rollout.bf16


def test_an_unknown_precision_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="precision"):
        load_config(None, ["precision=fp16"])


def Products(mkl_s: float, onednn_s: float) -> Timer:
    return Timer(mkl_s, onednn_s, ("mkl_s", "onednn_s"))

def test_the_sampler_products_are_onednn_where_they_run_a_decoding_step_fast_enough(tmp_path: Path):
    fp32 = Choice(False, "precision=auto: float32")
    fast, slow = Products(1.0, 0.6), Products(1.0, 0.9)
    taken = precision.choose_products(fp32, small_llama(), fast, tmp_path / "a.json", AMD_WITH_AVX512_BF16)
    kept = precision.choose_products(fp32, small_llama(), slow, tmp_path / "b.json", AMD_WITH_AVX512_BF16)
    assert taken.onednn is True and "sampler products by oneDNN" in taken.describe() and "1.67x" in taken.describe()
    assert kept.onednn is False and "sampler products by MKL" in kept.describe()
    assert f"under {precision.MIN_ONEDNN_SPEEDUP}x" in kept.describe()
    assert precision.choose_products(fp32, small_llama(), never, tmp_path / "a.json", AMD_WITH_AVX512_BF16) == taken
    other_cpu = precision.choose_products(fp32, small_llama(), slow, tmp_path / "a.json", INTEL_WITH_AMX)
    assert other_cpu.onednn is False and slow.calls == 2  # measured again on another CPU model
    bf16 = Choice(True, "precision=auto: bf16")
    assert precision.choose_products(bf16, small_llama(), never, None, INTEL_WITH_AMX) == bf16


def test_a_products_choice_sets_the_sampler_kernel_and_survives_the_run_folder(tmp_path: Path):
    config = load_config(None, [f"run_dir={tmp_path}", "precision=auto"])
    choice = Choice(False, "precision=auto: float32", onednn=True, products={"mkl_s": 1.0, "onednn_s": 0.5})
    assert precision.apply(config, choice).rollout.onednn is True
    assert precision.apply(config, Choice(False, "x")).rollout.onednn == "auto"
    from tempering.policy import record_precision

    record_precision(tmp_path, choice)
    resumed, again = resolve_precision(config, small_llama(), resume=True)
    assert again == choice and resumed.rollout.onednn is True


def test_timing_the_products_measures_both_kernels_and_keeps_the_threads():
    from tempering.rollout.fast_llama import ONEDNN, time_products

    if not ONEDNN:
        pytest.skip("this torch has no oneDNN prepacked products")
    threads = torch.get_num_threads()
    seconds = time_products(small_llama(hidden=64, layers=2), rows=4, repeats=1)
    assert set(seconds) == {"mkl_s", "onednn_s"} and all(s > 0 for s in seconds.values())
    assert torch.get_num_threads() == threads


def test_pretraining_keeps_float32_where_the_cpu_has_no_bf16_instructions(tmp_path: Path, monkeypatch):
    """bf16 autocast emulated made the default model's pre-training 27 s a step instead of 2.5
    (AMD EPYC, AVX2 only): there the model is pre-trained in float32, keyed and recorded so."""
    from tempering.config import PretrainConfig
    from tempering.models import device
    from tempering.pretrain import cached_model_dir, ensure_pretrained

    config = PretrainConfig(hidden_size=16, layers=1, heads=2, steps=2, batch_docs=2, warmup_steps=0)
    float32 = config.model_copy(update={"bf16": False})
    monkeypatch.setenv("TEMPERING_CACHE", str(tmp_path))
    monkeypatch.setattr(device, "_read_cpuinfo", lambda: AMD_WITHOUT_BF16)
    assert cached_model_dir(config) == cached_model_dir(float32)
    made = ensure_pretrained(config, progress=False)
    assert json.loads((made / "pretrain.json").read_text())["config"]["bf16"] is False
    monkeypatch.setattr(device, "_read_cpuinfo", lambda: INTEL_WITH_AMX)
    assert cached_model_dir(config) != cached_model_dir(float32)


def test_pretraining_as_run_here_takes_bf16_only_where_the_cpu_computes_it():
    from tempering.config import PretrainConfig
    from tempering.pretrain import as_run_here

    config = PretrainConfig()
    assert as_run_here(config, AMD_WITHOUT_BF16, "x86_64").bf16 is False
    assert as_run_here(config, AMD_WITH_AVX512_BF16, "x86_64").bf16 is True
    assert as_run_here(config, INTEL_WITH_AMX, "x86_64") is config
    assert as_run_here(config.model_copy(update={"bf16": False}), INTEL_WITH_AMX, "x86_64").bf16 is False
