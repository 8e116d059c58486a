"""pretrain.nope_layers: layers that drop their rotary positions at a step and read by content
alone after it (builtin:tiny-long's last layer), saved as transformers' SmolLM3 so that any
loader reads the model as it was trained."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tempering.config import PretrainConfig
from tempering.models.tiny import build_model, drop_positions
from tempering.pretrain import cache_key, fresh_model, pretrain


def _model(nope_layers=(0, 1)):
    return build_model(vocab_size=40, hidden_size=32, layers=2, heads=2, max_positions=512, seed=0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, nope_layers=nope_layers)


def _moves_with_position(model) -> bool:
    """Whether the last token's logits change when the distance between a row's halves grows by 100
    (rotary positions are relative: a shift of every position would change nothing)."""
    ids = torch.randint(3, 40, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        near = model(input_ids=ids, position_ids=torch.arange(12)[None]).logits[0, -1]
        far = model(input_ids=ids, position_ids=(torch.arange(12) + 100 * (torch.arange(12) >= 6))[None]).logits[0, -1]
    return not torch.allclose(near, far, atol=1e-5)


def test_a_model_with_nope_layers_keeps_its_positions_until_they_are_dropped_and_is_then_position_free():
    model = _model()
    assert model.config.model_type == "smollm3" and model.config.no_rope_layers == [1, 1]
    assert _moves_with_position(model)
    drop_positions(model, [0, 1])
    assert model.config.no_rope_layers == [0, 0] and not _moves_with_position(model)


def test_dropping_one_layer_leaves_the_others_their_positions():
    model = _model()
    drop_positions(model, [1])
    assert model.config.no_rope_layers == [1, 0]
    assert [layer.self_attn.use_rope for layer in model.model.layers] == [True, False]
    assert _moves_with_position(model)


def test_without_nope_layers_the_model_is_the_plain_llama():
    assert _model(nope_layers=()).config.model_type == "llama"


def test_pretraining_drops_the_positions_at_nope_from_step_and_saves_a_model_any_loader_reads_so(tmp_path, monkeypatch):
    import tempering.pretrain as module

    dropped_at, steps = [], []
    real_drop, real_step = module.drop_positions, module.train_step
    monkeypatch.setattr(module, "drop_positions", lambda model, layers: (dropped_at.append((len(steps), list(layers))),
                                                                         real_drop(model, layers)))
    monkeypatch.setattr(module, "train_step", lambda *args: (steps.append(1), real_step(*args))[1])
    config = PretrainConfig(hidden_size=32, layers=2, heads=2, steps=4, batch_docs=2, nope_layers=[1], nope_from_step=2)
    pretrain(config, tmp_path, progress=False)
    assert dropped_at == [(2, [1])] and len(steps) == 4  # before the third step
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.no_rope_layers == [1, 0]
    assert [layer.self_attn.use_rope for layer in loaded.model.layers] == [True, False]


def test_nope_from_step_zero_builds_the_layers_without_positions():
    model, _, _ = fresh_model(PretrainConfig(hidden_size=32, layers=2, heads=2, nope_layers=[0]))
    assert model.config.no_rope_layers == [0, 1]


@pytest.mark.parametrize("fields, message", [
    ({"layers": 2, "nope_layers": [2]}, "not among the model's layers 0 to 1"),
    ({"nope_layers": [1, 1]}, "names a layer twice"),
    ({"nope_from_step": 5}, "nope_layers is empty"),
    ({"steps": 10, "nope_layers": [0], "nope_from_step": 10}, "would never drop"),
])
def test_nope_settings_that_cannot_happen_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        PretrainConfig(**fields)


def test_nope_fields_keep_old_cache_keys_at_their_defaults_and_make_new_entries_otherwise():
    keys = {cache_key(PretrainConfig(**change)) for change in (
        {}, {"nope_layers": [1]}, {"nope_layers": [1], "nope_from_step": 3})}
    assert len(keys) == 3
    assert cache_key(PretrainConfig(nope_layers=[], nope_from_step=0)) == cache_key(PretrainConfig())
