"""Packing, chunked log-probs, gradient checkpointing and token budgets change how a learner
step is computed, never what it computes: each is checked against the plain path (padded rows,
the model's whole logits, every activation kept, one micro-batch) in fp32, through SGD(lr=1),
where a step's parameter change is exactly minus the gradient."""

import pytest
import torch
from test_learner import TEMPERATURE, VOCAB, _batch, _learner, _model
from transformers import LlamaConfig, LlamaForCausalLM

from tempering.algorithms.logprobs import chunked_logprobs, logprobs_from_logits
from tempering.build import build_learner, resolve_algorithm
from tempering.config import ConfigError, load_config
from tempering.learner.forward import forward_logprobs
from tempering.learner.packing import (activation_bytes_per_token, first_fit_decreasing, pack, parameter_count,
                                       plan_micro_batches, tokens_for_memory)
from tempering.learner.plan import Layout
from tempering.models.attention import NAME, upcast_attention
from tempering.models.tiny import build_model


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_packed_rows_hold_each_sequence_whole_with_positions_from_zero():
    ids_BT = torch.tensor([[5, 6, 7, 0, 0],
                           [8, 9, 0, 0, 0],
                           [3, 4, 5, 6, 7],
                           [9, 0, 0, 0, 0]])
    packing = pack(ids_BT, (ids_BT > 0).long())

    # width 5; first-fit decreasing: [row 2], [row 0, row 1], [row 3]
    assert packing.input_ids_RW.tolist() == [[3, 4, 5, 6, 7], [5, 6, 7, 8, 9], [9, 0, 0, 0, 0]]
    assert packing.position_ids_RW.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1], [0, 0, 1, 2, 3]]
    assert packing.index_BT.tolist() == [[5, 6, 7, -1, -1], [8, 9, -1, -1, -1], [0, 1, 2, 3, 4],
                                         [10, -1, -1, -1, -1]]


def test_a_packed_forward_gives_each_sequence_the_logprobs_it_has_alone():
    model = _model()
    batch = _batch(model)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
        plain_BT, entropy_BT = logprobs_from_logits(logits, batch.input_ids_BT, TEMPERATURE, with_entropy=True)
        for chunk in (0, 5):
            out = forward_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE,
                                   keep_BT=batch.loss_mask_BT, layout=Layout.PACKED, chunk=chunk,
                                   with_entropy=True)
            mask_BT = batch.loss_mask_BT
            torch.testing.assert_close(out.logprobs_BT, plain_BT * mask_BT, atol=1e-5, rtol=0)
            torch.testing.assert_close(out.entropy_BT, entropy_BT * mask_BT, atol=1e-5, rtol=0)
            assert (out.logprobs_BT[mask_BT == 0] == 0).all(), "nothing is computed off the trained tokens"


def test_without_use_cache_false_transformers_would_let_packed_sequences_see_each_other():
    # the reason forward_logprobs passes use_cache=False: this test fails if transformers
    # starts honouring packed position ids with a cache, and the comment in packing.py must go
    model = _model()
    ids_BT = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 3]])
    packing = pack(ids_BT, torch.ones_like(ids_BT))
    flat = {"input_ids": packing.input_ids_RW.view(1, -1), "position_ids": packing.position_ids_RW.view(1, -1)}
    with torch.no_grad():
        alone = model(input_ids=ids_BT[1:], use_cache=False).logits[0]
        packed = model(**flat, use_cache=False).logits[0, 4:]
        cached = model(**flat, use_cache=True).logits[0, 4:]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
    assert (cached - alone).abs().max() > 1e-3


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_chunked_logprobs_and_entropy_match_the_full_logits_in_value_and_gradient(dtype, atol):
    gen = torch.Generator().manual_seed(0)
    hidden_NH = (0.5 * torch.randn(37, 16, generator=gen, dtype=dtype)).requires_grad_()
    weight_VH = (0.5 * torch.randn(50, 16, generator=gen, dtype=dtype)).requires_grad_()
    targets_N = torch.randint(0, 50, (37,), generator=gen)
    up_N, up_entropy_N = torch.randn(37, generator=gen, dtype=dtype), torch.randn(37, generator=gen, dtype=dtype)

    logprobs_N, entropy_N = chunked_logprobs(hidden_NH, weight_VH, targets_N, 0.7, 8, True, True)
    (logprobs_N @ up_N + entropy_N @ up_entropy_N).backward()
    grads = hidden_NH.grad.clone(), weight_VH.grad.clone()
    hidden_NH.grad = weight_VH.grad = None

    logp_NV = torch.log_softmax(hidden_NH @ weight_VH.T / 0.7, dim=-1)
    full_N = logp_NV.gather(-1, targets_N[:, None])[:, 0]
    full_entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    (full_N @ up_N + full_entropy_N @ up_entropy_N).backward()

    torch.testing.assert_close(logprobs_N, full_N, atol=atol, rtol=0)
    torch.testing.assert_close(entropy_N, full_entropy_N, atol=atol, rtol=0)
    torch.testing.assert_close(grads[0], hidden_NH.grad, atol=atol, rtol=0)
    torch.testing.assert_close(grads[1], weight_VH.grad, atol=atol, rtol=0)


def test_an_entropy_without_gradient_sends_none_back():
    hidden_NH = torch.randn(6, 4, requires_grad=True)
    weight_VH = torch.randn(9, 4, requires_grad=True)
    targets_N = torch.arange(6)
    logprobs_N, entropy_N = chunked_logprobs(hidden_NH, weight_VH, targets_N, 1.0, 4, True, False)
    assert not entropy_N.requires_grad
    logprobs_N.sum().backward()
    expected = torch.autograd.grad(torch.log_softmax(hidden_NH @ weight_VH.T, -1)[torch.arange(6), targets_N].sum(),
                                   hidden_NH)[0]
    torch.testing.assert_close(hidden_NH.grad, expected, atol=1e-6, rtol=0)


def test_chunked_logprobs_refuse_models_whose_logits_are_scaled():
    model = _model()
    model.config.final_logit_softcapping = 30.0
    batch = _batch(model)
    with pytest.raises(ValueError, match="logprob_chunk=0"):
        forward_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, chunk=4)


def _sgd_change(critic=None, make_batch=_batch, **settings):
    """Parameter change and metrics of one SGD(lr=1) step on ``make_batch(model)`` with an
    entropy bonus and a KL term, so that every path through the loss is exercised."""
    model = _model()
    batch = make_batch(model)
    if critic:
        gen = torch.Generator().manual_seed(3)
        batch.values_BT = torch.zeros_like(batch.loss_mask_BT)
        batch.returns_BT = torch.randn(batch.loss_mask_BT.shape, generator=gen) * batch.loss_mask_BT
    learner = _learner(model, entropy_coef=0.01, kl_coef=0.1, critic=critic, **settings)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(2)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    before = _params(model)
    if critic:
        with torch.no_grad():  # a non-zero head, so the value loss reaches the trunk
            learner.critic.head.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(4))
    metrics = learner.step(batch)
    return before - _params(model), metrics


PATHS = {
    "packed": dict(packing=True),
    "chunked": dict(logprob_chunk=5),
    "checkpointed": dict(gradient_checkpointing=True),
    "token_budget": dict(token_budget=20),
    "packed_budget": dict(packing=True, token_budget=20),
    "all": dict(packing=True, logprob_chunk=3, gradient_checkpointing=True, token_budget=24),
}


@pytest.mark.parametrize("critic", [None, "head"])
@pytest.mark.parametrize("path", list(PATHS))
def test_every_way_of_computing_the_step_gives_the_plain_steps_loss_and_gradient(path, critic):
    plain, plain_metrics = _sgd_change(critic)
    assert plain.abs().max() > 1e-3, "the step must move the parameters for the comparison to mean anything"

    change, metrics = _sgd_change(critic, **PATHS[path])

    torch.testing.assert_close(change, plain, atol=1e-5, rtol=0)
    for key in ("loss", "entropy", "kl", "grad_norm", "clip_fraction") + (("value_loss",) if critic else ()):
        assert metrics[key] == pytest.approx(plain_metrics[key], abs=1e-5), key


def test_a_token_budget_cuts_the_batch_finer_and_the_update_stays_the_same():
    model = _model()
    batch = _batch(model)
    lengths = batch.attention_mask_BT.sum(1).tolist()
    learner = _learner(model, token_budget=20)
    micro_batches = [torch.tensor(part.rows) for part in learner.plan(batch, every_row=True).micro_batches]
    assert len(micro_batches) > 1
    assert sorted(torch.cat(micro_batches).tolist()) == list(range(len(batch)))
    for rows in micro_batches:
        widest = max(lengths[i] for i in rows)
        assert len(rows) == 1 or len(rows) * widest <= 20


def test_micro_batch_plans_cover_every_row_once_and_keep_to_the_budget():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (50,), generator=gen).tolist()
    width = max(lengths)
    for budget in (1, 45, 100, 10_000):
        padded = plan_micro_batches(lengths, budget, packing=False, max_rows=8)
        packed = plan_micro_batches(lengths, budget, packing=True, max_rows=8)
        for plan in (padded, packed):
            assert sorted(i for rows in plan for i in rows) == list(range(50))
        for rows in padded:
            assert len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= budget
        for rows in packed:
            packed_rows = len(first_fit_decreasing([lengths[i] for i in rows], width))
            assert packed_rows == 1 or packed_rows * width <= budget
    assert len(plan_micro_batches(lengths, 10_000, packing=True, max_rows=8)) == 1
    assert len(plan_micro_batches(lengths, 1, packing=True, max_rows=8)) == len(first_fit_decreasing(lengths, width))
    assert plan_micro_batches(lengths, 0, packing=True, max_rows=8)[1] == list(range(8, 16)), "no budget: runs of rows"


def test_packing_fills_rows_so_the_model_sees_fewer_tokens_than_padded():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 60, (64,), generator=gen)
    mask_BT = (torch.arange(60) < lengths[:, None]).long()
    packed = pack(torch.ones_like(mask_BT), mask_BT).input_ids_RW
    assert packed.numel() < 0.8 * mask_BT.numel()
    assert packed.numel() < 1.15 * int(lengths.sum()), "rows are nearly full"


def test_the_memory_budget_gives_more_tokens_for_more_memory_and_with_checkpointing():
    model = build_model(vocab_size=VOCAB, hidden_size=64, layers=4, heads=4, max_positions=64, seed=0,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    small, large = tokens_for_memory(1.0, model, False, 1024), tokens_for_memory(2.0, model, False, 1024)
    assert 0 < small < large
    assert tokens_for_memory(1.0, model, True, 1024) > 2 * small, "checkpointing keeps far less per token"
    reference = parameter_count(model)
    assert tokens_for_memory(1.0, model, False, 1024, frozen_parameters=reference) < small, "a reference model costs memory"
    # per token without checkpointing: 4 layers x (9 x 64 + 4 x 64 + 4 x 160) + 2 x 64 floats (MLP width 160)
    assert activation_bytes_per_token(model.config, False) == 4 * (4 * (9 * 64 + 4 * 64 + 4 * 160) + 2 * 64)
    with pytest.raises(ValueError, match="weights, gradients and optimizer state"):
        tokens_for_memory(1e-6, model, False, 1024)


def test_frozen_weights_need_no_gradients_or_optimizer_state():
    """With LoRA only the adapters train: the frozen base weights cost 4 bytes each, not 16."""
    model = build_model(vocab_size=VOCAB, hidden_size=256, layers=4, heads=4, max_positions=64, seed=0,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    budget = 0.6  # GB: the runtime (0.5 GB), the weights with their optimizer state, and some tokens
    trained = tokens_for_memory(budget, model, False, 0)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("embed" in name)
    assert tokens_for_memory(budget, model, False, 0) > trained


def _built(overrides, model=None):
    config = load_config(None, overrides)
    model = model or build_model(vocab_size=VOCAB, hidden_size=64, layers=4, heads=4, max_positions=64, seed=0,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return build_learner(model, config, resolve_algorithm(config)).settings


def test_the_config_maps_a_memory_budget_to_a_token_budget_and_an_explicit_budget_wins():
    assert _built(["learner.memory_budget_gb=0"]).token_budget == 0
    from_memory = _built(["learner.memory_budget_gb=1"]).token_budget
    assert from_memory > 0
    assert _built(["learner.memory_budget_gb=1", "algorithm.kl_coef=0.1"]).token_budget < from_memory
    assert _built(["learner.memory_budget_gb=1", "learner.token_budget=77"]).token_budget == 77
    settings = _built(["learner.packing=false", "learner.logprob_chunk=0", "learner.gradient_checkpointing=true"])
    assert (settings.packing, settings.logprob_chunk, settings.gradient_checkpointing) == (False, 0, True)


def test_impossible_learner_settings_are_config_errors_naming_the_field():
    with pytest.raises(ConfigError, match="learner.memory_budget_gb=1e-06: .* weights, gradients"):
        _built(["learner.memory_budget_gb=0.000001"])


def test_a_model_with_soft_capped_logits_takes_log_probs_from_its_own_logits():
    model = _model()
    model.config.final_logit_softcapping = 30.0
    assert _built([], model).logprob_chunk == 0
    assert _built(["learner.logprob_chunk=0"], model).logprob_chunk == 0
    assert _built([]).logprob_chunk == 1024


def test_bf16_autocast_runs_through_every_path_and_stays_near_the_fp32_step():
    plain, plain_metrics = _sgd_change()
    for settings in ({}, PATHS["all"]):
        change, metrics = _sgd_change(bf16=True, **settings)
        assert (change - plain).abs().max() < 0.01 * plain.abs().max()
        assert metrics["loss"] == pytest.approx(plain_metrics["loss"], abs=1e-3)


def test_the_memory_budget_for_a_smollm2_shaped_model_is_in_the_measured_range():
    # SmolLM2-135M's shape, built without memory on the meta device. bench/memory.py measured
    # one fp32 step with checkpointing at about 2.8 GB for 2048 tokens, growing well under
    # 0.1 MB per token, so 8 GB holds an 8192-token sequence with room to spare; without
    # checkpointing activations cost over 1 MB per token.
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    checkpointed = tokens_for_memory(8.0, model, True, 1024)
    assert 8192 < checkpointed < 100_000
    assert 1000 < tokens_for_memory(8.0, model, False, 1024) < 8192
    with pytest.raises(ValueError):
        tokens_for_memory(2.0, model, True, 1024)  # weights, gradients and AdamW alone take 2.2 GB


def test_upcast_attention_changes_nothing_without_autocast_and_is_not_saved(tmp_path):
    model = _model()
    batch = _batch(model)
    with torch.no_grad():
        before = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
        upcast_attention(model)
        after = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
    assert model.config._attn_implementation == NAME
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert (autocast.float() - before).abs().max() < 0.05
    model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
