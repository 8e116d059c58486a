"""LoRA through peft: only adapters train, merging is exact, the KL reference is the base.

Models are small random Llamas in float32, so the comparisons are tight (1e-5).
"""

import copy
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from tempering.build import check_parallel, learner_settings, resolve_algorithm
from tempering.checkpoint import save_model
from tempering.config import ConfigError, load_config
from tempering.learner.forward import forward_logprobs
from tempering.learner.optim import adamw
from tempering.learner.step import Learner, collate
from tempering.models.lora import adapters_off, apply_lora, merged_copy
from tempering.models.tiny import build_model, build_tokenizer
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.types import Problem, Rollout
from real_settings import run_settings

VOCAB = len(build_tokenizer())
PROBLEM = Problem(task="t", id="0", prompt="", answer="0")


def _base() -> torch.nn.Module:
    return build_model(vocab_size=VOCAB, hidden_size=32, layers=2, heads=2, max_positions=64, seed=0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2).eval()


def _adapted(base=None, trained: bool = True):
    """Adapters on ``base``; ``trained`` gives B random values, as after some training (a fresh
    adapter has B = 0 and changes nothing)."""
    model = apply_lora(base if base is not None else _base(), rank=4, alpha=8.0, dropout=0.0,
                       target_modules="all-linear")
    if trained:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    return model.eval()


def _batch(advantage: float = 1.0):
    rollouts = [Rollout(problem=PROBLEM, prompt_ids=[1, 5, 6], completion_ids=c, logprobs=[-1.0] * len(c),
                        text="", finish_reason="stop", policy_version=0) for c in ([7, 8, 9], [7, 3], [10, 11, 12, 2])]
    batch = collate(rollouts, pad_id=0)
    batch.advantages_BT = batch.loss_mask_BT * torch.tensor([[advantage], [-advantage], [advantage]])
    return batch


def _logprobs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return forward_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT).logprobs_BT


def _learner(model, **settings) -> Learner:
    return Learner(model, adamw(model, 1e-2, (0.9, 0.99), 0.0), lambda step: 1.0, run_settings(**settings))


def test_a_lora_step_changes_only_adapter_weights():
    model = _adapted()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    learner = _learner(model)
    trained = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert trained == {id(p) for name, p in model.named_parameters() if "lora_" in name}

    learner.step(_batch())

    after = dict(model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed, "the step moved something"
    assert all("lora_" in name for name in changed), sorted(changed)[:5]


def test_merged_model_has_the_adapter_models_logprobs(tmp_path):
    model, batch = _adapted(), _batch()
    merged = merged_copy(model)
    assert not hasattr(merged, "peft_config"), "a plain model"
    torch.testing.assert_close(_logprobs(merged, batch), _logprobs(model, batch), atol=1e-5, rtol=0)
    assert any("lora_" in name for name, _ in model.named_parameters()), "the adapted model is left as it was"

    save_model(model, None, tmp_path / "merged")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    torch.testing.assert_close(_logprobs(reloaded, batch), _logprobs(model, batch), atol=1e-5, rtol=0)
    assert not _logprobs(model, batch).equal(_logprobs(_base(), batch)), "the adapters do change the model"


def test_adapter_saves_hold_only_the_adapters(tmp_path):
    save_model(_adapted(), None, tmp_path / "adapter", merged=False)
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"]


def test_the_kl_reference_is_the_model_itself_with_its_adapters_off():
    base = _base()
    model, batch = _adapted(copy.deepcopy(base)), _batch()
    learner = _learner(model, kl_coef=0.1)

    assert learner.reference is model, "no second copy of the model"
    assert "reference" not in learner.state_dict()
    with adapters_off(learner.reference):
        reference_BT = _logprobs(learner.reference, batch)
    torch.testing.assert_close(reference_BT, _logprobs(base, batch), atol=1e-6, rtol=0)
    assert not _logprobs(model, batch).equal(reference_BT), "back on once the context ends"


def test_fresh_adapters_start_at_zero_kl_and_it_grows_as_they_train():
    learner = _learner(_adapted(trained=False), kl_coef=0.1)
    first = learner.step(_batch())
    second = learner.step(_batch())
    assert first["kl"] == pytest.approx(0.0, abs=1e-7), "B = 0: the policy is its base"
    assert second["kl"] > 1e-6


def test_learner_state_restores_the_adapters_exactly():
    model = _adapted()
    learner = _learner(model)
    learner.step(_batch())
    state = learner.state_dict()
    saved = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    learner.step(_batch())

    learner.load_state_dict(state)

    for name, parameter in model.named_parameters():
        if "lora_" in name:
            assert torch.equal(parameter, saved[name]), name


def test_the_sampler_runs_the_adapted_modules_and_records_their_logprobs():
    model = _adapted()
    generator = HFGenerator(model, build_tokenizer(), chat_template=False)
    assert not generator.fast, "the fused decoder reads plain weights; adapters take transformers' path"

    groups = generator.generate([Problem(task="t", id="0", prompt="123", answer="")], 3,
                                SamplingParams(max_new_tokens=6), generator=torch.Generator().manual_seed(0))

    batch = collate([r for g in groups for r in g.rollouts], pad_id=0)
    torch.testing.assert_close(_logprobs(model, batch) * batch.loss_mask_BT, batch.old_logprobs_BT,
                               atol=1e-5, rtol=0)


def test_lora_without_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ConfigError, match=r"tempering\[lora\]"):
        apply_lora(_base(), rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


def test_a_target_that_matches_nothing_is_a_config_error():
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        apply_lora(_base(), rank=4, alpha=8.0, dropout=0.0, target_modules=["no_such_proj"])


def test_fsdp_refuses_lora_adapters_it_would_checkpoint_as_shards():
    config = load_config(None, ["learner.parallel=fsdp", "model.lora={rank: 4}"])
    with pytest.raises(ConfigError, match="learner.parallel=fsdp: model.lora"):
        check_parallel(config, learner_settings(config, resolve_algorithm(config), 0))
