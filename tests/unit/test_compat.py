"""The transformers internals tempering relies on, checked on real (tiny, random) models of
three architectures, so that a transformers release that changes one fails here first."""

import pytest
import torch
from transformers import (GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from tempering.models import compat

SIZES = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _llama(**changes):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **SIZES, **changes)).eval()


def _qwen2(**changes):
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(num_key_value_heads=2, **SIZES, **changes)).eval()


def _neox():
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(GPTNeoXConfig(**SIZES)).eval()


MODELS = {"llama": _llama, "qwen2": _qwen2, "gpt_neox": _neox}


def _prompts():
    ids_BT = torch.randint(3, 50, (3, 6), generator=torch.Generator().manual_seed(1))
    mask_BT = torch.ones_like(ids_BT)
    mask_BT[1, :2] = 0  # left padding
    return ids_BT, mask_BT, (mask_BT.cumsum(-1) - 1).clamp(min=0)


def _decode(model, cache, select_B=None):
    """Logits of one decoding step after a prefill into ``cache`` (None: the model's own),
    with the cache's rows ``select_B`` taken between the two when given."""
    ids_BT, mask_BT, positions_BT = _prompts()
    name = compat.cache_argument(model.forward)
    keep = {compat.logits_to_keep_argument(model.forward): 1}
    with torch.no_grad():
        out = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT, use_cache=True,
                    **{name: cache}, **keep)
        assert out.logits.shape[1] == 1
        cache, rows_B = out[name], torch.arange(3)
        if select_B is not None:
            compat.select_cache_rows(cache, select_B)
            rows_B = select_B
        mask_BT = torch.nn.functional.pad(mask_BT[rows_B], (0, 1), value=1)
        out = model(input_ids=torch.tensor([[7]] * len(rows_B)), attention_mask=mask_BT,
                    position_ids=positions_BT[rows_B, -1:] + 1, use_cache=True, **{name: cache}, **keep)
    return out.logits[:, -1], out[name]


@pytest.mark.parametrize("architecture", MODELS)
def test_forward_arguments_are_the_ones_the_model_takes(architecture):
    model = MODELS[architecture]()
    assert compat.cache_argument(model.forward) in ("cache", "past_key_values")
    assert compat.logits_to_keep_argument(model.forward) in ("logits_to_keep", "num_logits_to_keep")
    assert compat.cache_argument(model.get_decoder().forward) == compat.cache_argument(model.forward)
    assert compat.logits_to_keep_argument(model.get_decoder().forward) is None


@pytest.mark.parametrize("architecture", MODELS)
def test_the_preallocated_cache_decodes_as_the_models_own_with_rows_selected(architecture):
    model = MODELS[architecture]()
    own_logits, own_cache = _decode(model, None, torch.tensor([2, 0, 0]))
    cache = compat.preallocated_cache(model.config, capacity=7, dtype=None)
    assert type(cache.layers[0]) is compat.PreallocatedLayer
    logits, cache = _decode(model, cache, torch.tensor([2, 0, 0]))
    torch.testing.assert_close(logits, own_logits, atol=1e-5, rtol=0)
    layers, own_layers = compat.cache_layers(cache), compat.cache_layers(own_cache)
    assert len(layers) == 2
    for (keys, values), (own_keys, own_values) in zip(layers, own_layers):
        assert keys.shape == (3, getattr(model.config, "num_key_value_heads", 4), 7, 8)
        torch.testing.assert_close(keys, own_keys, atol=1e-6, rtol=0)
        torch.testing.assert_close(values, own_values, atol=1e-6, rtol=0)


def test_caches_of_sliding_window_layers_are_not_full_attention():
    assert compat.full_attention_cache(_llama().config) is not None
    sliding = _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0).config
    assert compat.full_attention_cache(sliding) is None
    assert compat.preallocated_cache(sliding, capacity=8, dtype=None) is None


def test_checkpointing_follows_the_models_flag():
    model = _qwen2().train()
    assert not compat.checkpointing(model)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert compat.checkpointing(model)


def test_a_registered_attention_replaces_sdpa_only(monkeypatch):
    calls = []

    def counting(module, query, key, value, attention_mask, **kwargs):
        calls.append(query.shape)
        return compat.sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    compat.register_attention("test_counting_attention", counting)
    ids_BT, mask_BT, _ = _prompts()
    for architecture, make in MODELS.items():
        model = make()
        with torch.no_grad():
            expected = model(input_ids=ids_BT, attention_mask=mask_BT).logits
            compat.switch_sdpa_attention(model, "test_counting_attention")
            calls.clear()
            logits = model(input_ids=ids_BT, attention_mask=mask_BT).logits
        assert len(calls) == 2, architecture  # one per layer
        torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
    eager = LlamaForCausalLM(LlamaConfig(**SIZES, attn_implementation="eager"))
    compat.switch_sdpa_attention(eager, "test_counting_attention")
    assert eager.config._attn_implementation == "eager"


def test_the_fused_decoder_is_offered_only_what_it_computes_exactly():
    assert compat.fused_llama_supported(_llama())
    for change in ({"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"},
                   {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}):
        model = _llama()
        for key, value in change.items():
            setattr(model.config, key, value)
        assert not compat.fused_llama_supported(model), change
    assert not compat.fused_llama_supported(_qwen2())
    assert not compat.fused_llama_supported(_neox())


def test_a_smollm3_is_fused_with_its_layers_without_positions_and_not_with_a_sliding_window():
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    def smollm3(**changes):
        config = SmolLM3Config(num_key_value_heads=2, **SIZES, no_rope_layers=[1, 0], pad_token_id=0, **changes)
        return SmolLM3ForCausalLM(config).eval()

    model = smollm3()
    assert compat.fused_llama_supported(model)
    assert compat.llama_shape(model).rotary == (True, False)
    assert compat.llama_shape(_llama()).rotary == (True,) * _llama().config.num_hidden_layers
    assert not compat.fused_llama_supported(smollm3(use_sliding_window=True, sliding_window=8))


def test_llama_shape_and_weights_are_the_models_own(tiny_policy):
    model, _ = tiny_policy
    shape = compat.llama_shape(model)
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (2, 2, 16)
    assert shape.eps == model.config.rms_norm_eps and shape.theta == model.config.rope_parameters["rope_theta"]
    weights = compat.llama_weights(model)
    layer, module = weights.layers[0], model.model.layers[0]
    assert len(weights.layers) == 1
    pairs = [(weights.embed, model.model.embed_tokens.weight), (weights.head, model.lm_head.weight),
             (weights.final_norm, model.model.norm.weight), (layer.q, module.self_attn.q_proj.weight),
             (layer.down, module.mlp.down_proj.weight), (layer.post_norm, module.post_attention_layernorm.weight)]
    for read, parameter in pairs:  # views of the parameters, so the learner's updates show through
        assert read.data_ptr() == parameter.data_ptr() and not read.requires_grad


def test_selecting_buffer_rows_copies_changed_rows_and_grows_when_needed():
    store = torch.arange(3 * 4, dtype=torch.float32).view(3, 1, 4, 1)
    kept = compat.select_buffer_rows([store.clone()], torch.tensor([2, 1]), length=2)[0]
    assert kept[:2, 0, :2, 0].tolist() == [[8.0, 9.0], [4.0, 5.0]]
    grown = compat.select_buffer_rows([store], torch.tensor([0, 0, 1, 2]), length=3)[0]
    assert grown.shape == (4, 1, 4, 1)
    assert grown[:, 0, :3, 0].tolist() == [[0, 1, 2], [0, 1, 2], [4, 5, 6], [8, 9, 10]]
