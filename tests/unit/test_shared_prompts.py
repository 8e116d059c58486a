"""Rows with the same prompt share one pass over it in the learner: log-probs, entropies,
hidden states and whole learner steps must be those of the separate rows (fp32, 1e-5), through
SGD(lr=1), where a step's parameter change is exactly minus the gradient. Also the batched
attention the learner uses for short rows under CPU autocast."""

import pytest
import torch
from test_learner import PAD, TEMPERATURE, VOCAB, _model, _rollout
from test_packing import _sgd_change as sgd_change
from transformers import LlamaConfig, LlamaForCausalLM

from tempering.algorithms import AdvantageInputs
from tempering.algorithms.advantages import grpo
from tempering.learner import forward as logprobs_module
from tempering.learner.forward import forward_logprobs, share_prompts, token_logprobs
from tempering.learner.packing import plan_shared_micro_batches
from tempering.learner.plan import Layout
from tempering.learner.step import collate
from tempering.models.attention import matmul_attention, upcast_attention
from tempering.models.compat import checkpointing, enable_checkpointing


def _group_batch(model):
    """Three groups of three samples (prompts of 4, 2 and 5 tokens, completions of 1 to 6),
    one sample with a masked-out token, old log-probs the model's own plus noise."""
    gen = torch.Generator().manual_seed(1)
    rollouts, groups = [], []
    for group, (prompt_len, completion_lens) in enumerate([(4, (3, 1, 5)), (2, (6, 2, 4)), (5, (2, 3, 2))]):
        prompt = torch.randint(3, VOCAB, (prompt_len,), generator=gen).tolist()
        for length in completion_lens:
            completion = torch.randint(3, VOCAB, (length,), generator=gen).tolist()
            rollouts.append(_rollout(prompt, completion, [0.0] * length))
            groups.append(group)
    rollouts[3].loss_mask = [1, 0, 1, 1, 1, 1]
    batch = collate(rollouts, PAD)
    with torch.no_grad():
        current_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE)
    batch.old_logprobs_BT = (current_BT + 0.3 * torch.randn(current_BT.shape, generator=gen)) * batch.loss_mask_BT
    rewards_B = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    batch.advantages_BT = grpo(AdvantageInputs(rewards_B, torch.tensor(groups), batch.loss_mask_BT))
    return batch


def _gqa_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=False, pad_token_id=PAD)
    return LlamaForCausalLM(config)


def test_the_layout_runs_each_distinct_prompt_once_and_maps_every_token_back():
    model = _model()
    batch = _group_batch(model)
    shared = share_prompts(batch.input_ids_BT, batch.attention_mask_BT, batch.prompt_lengths_B)
    assert shared.prompt_ids_PT.shape == (3, 5)
    assert shared.prompt_of_B.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert shared.tokens < batch.input_ids_BT.numel()
    # every real token is found again where the layout says it went
    flat = torch.cat([shared.prompt_ids_PT.flatten(), shared.completion_ids_BT.flatten()])
    real_BT = batch.attention_mask_BT.bool()
    assert (flat[shared.index_BT[real_BT]] == batch.input_ids_BT[real_BT]).all()
    assert (shared.index_BT[~real_BT] == -1).all()
    # nothing to share: distinct prompts
    distinct = batch.input_ids_BT.clone()
    distinct[:, 0] = torch.arange(len(distinct)) + 3
    assert share_prompts(distinct, batch.attention_mask_BT, batch.prompt_lengths_B) is None


def _nope_model():
    """builtin:tiny-long's kind: a SmolLM3 whose second layer goes without positions."""
    from tempering.models.tiny import build_model, drop_positions

    model = build_model(vocab_size=VOCAB, hidden_size=16, layers=2, heads=2, max_positions=32, seed=0,
                        pad_token_id=PAD, bos_token_id=1, eos_token_id=2, nope_layers=[1])
    drop_positions(model, [1])
    return model


def _checkpointed(make_model):
    def made():
        model = make_model()
        enable_checkpointing(model)
        model.train()
        return model
    made.__name__ = f"checkpointed{make_model.__name__}"
    return made


@pytest.mark.parametrize("make_model", [_model, _gqa_model, _nope_model, _checkpointed(_model),
                                        _checkpointed(_gqa_model), _checkpointed(_nope_model)])
@pytest.mark.parametrize("chunk", [0, 4])
def test_shared_prompts_give_each_row_its_own_logprobs_entropy_hidden_and_gradient(make_model, chunk, monkeypatch):
    model = make_model()
    layered = []
    real = logprobs_module._checkpointed_shared_hidden
    monkeypatch.setattr(logprobs_module, "_checkpointed_shared_hidden", lambda *a: layered.append(1) or real(*a))
    batch = _group_batch(model)
    up_BT = torch.randn(batch.loss_mask_BT.shape, generator=torch.Generator().manual_seed(5))
    real_BT = batch.attention_mask_BT[..., None]

    def run(layout):
        model.zero_grad()
        out = forward_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE,
                               keep_BT=batch.loss_mask_BT, chunk=chunk, with_entropy=True, entropy_grad=True,
                               with_hidden=True, layout=layout, prompt_lengths_B=batch.prompt_lengths_B)
        hidden_BTH = out.hidden_BTH * real_BT
        ((out.logprobs_BT + out.entropy_BT) * up_BT).sum().add(hidden_BTH.square().mean()).backward()
        return out, hidden_BTH, torch.cat([p.grad.flatten() for p in model.parameters()])

    alone, alone_hidden, alone_grad = run(Layout.PADDED)
    shared, shared_hidden, shared_grad = run(Layout.SHARED)
    assert alone_grad.abs().max() > 1e-3
    assert bool(layered) == checkpointing(model), "checkpointed models share layer by layer, the others not"
    torch.testing.assert_close(shared.logprobs_BT, alone.logprobs_BT, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared.entropy_BT, alone.entropy_BT, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_hidden, alone_hidden, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_grad, alone_grad, atol=1e-5, rtol=0)


def _sgd_change(share, critic=None, **settings):
    return sgd_change(critic, _group_batch, share_prompts=share, **settings)


@pytest.fixture
def shared_passes(monkeypatch):
    """Counts the forward passes that shared prompts."""
    calls = []
    real = logprobs_module._shared_hidden

    def counted(model, shared):
        calls.append(len(shared.prompt_of_B))
        return real(model, shared)

    monkeypatch.setattr(logprobs_module, "_shared_hidden", counted)
    return calls


@pytest.mark.parametrize("critic", [None, "head"])
@pytest.mark.parametrize("settings", [{}, {"packing": True, "logprob_chunk": 3}, {"micro_batch_size": 5},
                                      {"token_budget": 30}, {"token_budget": 14, "packing": True}])
def test_a_learner_step_with_shared_prompts_is_the_step_without(settings, critic, shared_passes):
    alone, alone_metrics = _sgd_change(False, critic, **settings)
    assert not shared_passes
    shared, metrics = _sgd_change(True, critic, **settings)
    assert shared_passes, "the step must have shared prompts for the comparison to mean anything"
    assert alone.abs().max() > 1e-3
    torch.testing.assert_close(shared, alone, atol=1e-5, rtol=0)
    for key in ("loss", "entropy", "kl", "grad_norm") + (("value_loss",) if critic else ()):
        assert metrics[key] == pytest.approx(alone_metrics[key], abs=1e-5), key


def test_gradient_checkpointing_keeps_sharing_and_bf16_stays_near_fp32(shared_passes):
    fp32, _ = _sgd_change(True)
    passes = len(shared_passes)
    checkpointed, _ = _sgd_change(True, gradient_checkpointing=True)
    assert len(shared_passes) == 2 * passes, "checkpointed steps share prompts too"
    torch.testing.assert_close(checkpointed, fp32, atol=1e-5, rtol=0)
    bf16, _ = _sgd_change(True, bf16=True)
    assert (bf16 - fp32).abs().max() < 0.01 * fp32.abs().max()


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_batched_attention_is_sdpas_including_rows_that_see_nothing(kv_heads):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 8, generator=gen)
    k, v = torch.randn(3, kv_heads, 7, 8, generator=gen), torch.randn(3, kv_heads, 7, 8, generator=gen)
    repeat = 4 // kv_heads
    k_full, v_full = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    # causal with 2 cached positions (query i sees keys up to i + 2)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k_full, v_full, attn_mask=torch.ones(5, 7, dtype=torch.bool).tril(2))
    torch.testing.assert_close(matmul_attention(q, k, v, None, 8 ** -0.5), expected.transpose(1, 2),
                               atol=1e-5, rtol=0)
    mask = torch.rand(3, 1, 5, 7, generator=gen) > 0.4
    mask[:, :, :, 0] = True
    expected = torch.nn.functional.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask)
    torch.testing.assert_close(matmul_attention(q, k, v, mask, 8 ** -0.5), expected.transpose(1, 2),
                               atol=1e-5, rtol=0)
    mask[1, :, 2] = False  # a query that may see no key (left padding) gets a finite output
    assert torch.isfinite(matmul_attention(q, k, v, mask, 8 ** -0.5)).all()


def test_under_autocast_a_left_padded_forward_stays_finite_and_near_fp32():
    model = _gqa_model().eval()
    ids_BT = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    mask_BT = torch.ones_like(ids_BT)
    mask_BT[0, :3] = 0
    positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        fp32 = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT).logits
        upcast_attention(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT, output_hidden_states=True)
    assert all(torch.isfinite(h).all() for h in out.hidden_states)
    assert (out.logits.float() - fp32)[mask_BT.bool()].abs().max() < 0.05


def test_token_budget_plans_keep_a_prompts_rows_together_within_the_budget():
    model = _model()
    batch = _group_batch(model)
    prompt_of = share_prompts(batch.input_ids_BT, batch.attention_mask_BT, batch.prompt_lengths_B).prompt_of_B.tolist()
    lengths = batch.attention_mask_BT.sum(1).tolist()
    prompt_lengths = batch.prompt_lengths_B.tolist()
    for budget in (8, 14, 20, 30, 1000):
        plans = plan_shared_micro_batches(prompt_of, prompt_lengths, lengths, budget)
        assert sorted(r for rows in plans for r in rows) == list(range(len(batch)))
        split = [g for g in set(prompt_of) if len({i for i, rows in enumerate(plans) for r in rows if prompt_of[r] == g}) > 1]
        for rows in plans:
            prompts = {prompt_of[r] for r in rows}
            cost = len(prompts) * max(prompt_lengths[r] for r in rows) + len(rows) * max(
                lengths[r] - prompt_lengths[r] for r in rows)
            assert len(rows) == 1 or cost <= budget, (budget, rows)
            # a group is cut only when it does not fit alone
            for g in prompts & set(split):
                group = [r for r in range(len(batch)) if prompt_of[r] == g]
                assert prompt_lengths[group[0]] + len(group) * max(lengths[r] - prompt_lengths[r] for r in group) > budget
    assert len(plan_shared_micro_batches(prompt_of, prompt_lengths, lengths, 1000)) == 1


def test_checkpointed_sharing_keeps_only_the_layers_inputs_for_the_backward_pass():
    """What recomputing buys: the bytes autograd keeps for the backward pass of a shared
    forward, checkpointed against not."""

    def saved_bytes(model) -> int:
        batch = _group_batch(model)
        kept = []

        def pack(tensor):
            kept.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            forward_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, TEMPERATURE, layout=Layout.SHARED,
                             prompt_lengths_B=batch.prompt_lengths_B)
        return sum(kept)

    plain, recomputed = saved_bytes(_gqa_model()), saved_bytes(_checkpointed(_gqa_model)())
    assert recomputed < plain / 3, (recomputed, plain)


def test_under_checkpointing_only_a_decoder_that_runs_layer_by_layer_shares_prompts():
    from tempering.learner.forward import can_share_prompts

    model = _gqa_model()
    assert can_share_prompts(model, checkpointed=True) and can_share_prompts(model, checkpointed=False)
    model.config._attn_implementation = "eager"  # its masks are additive, not the boolean ones built here
    assert can_share_prompts(model, checkpointed=False) and not can_share_prompts(model, checkpointed=True)
