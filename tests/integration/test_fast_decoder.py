"""The sampler's own decoding steps for Llama models compute what the model computes."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tempering.learner.optim import adamw
from tempering.models import compat
from tempering.rollout import fast_llama
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.types import Problem


def _grouped_query_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                         rope_theta=500.0, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def _smollm3_model():
    """A SmolLM3: the Llama above with its middle layer's positions dropped (as
    builtin:tiny-long's last layer)."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(0)
    config = SmolLM3Config(vocab_size=40, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                           num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                           rope_theta=500.0, tie_word_embeddings=False, no_rope_layers=[1, 0, 1],
                           use_sliding_window=False, pad_token_id=0)
    return SmolLM3ForCausalLM(config).eval()


MODELS = {"llama": _grouped_query_model, "smollm3": _smollm3_model}


def _model_steps(model, ids_BT, mask_BT, new_BS):
    """Logits of transformers' forward for each of the tokens ``new_BS`` after the prompt."""
    positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    name = compat.cache_argument(model.forward)  # "cache" since transformers 5.2x, "past_key_values" before
    with torch.no_grad():
        out = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT, use_cache=True)
        cache, position_B, logits = out[name], positions_BT[:, -1], []
        for step in range(new_BS.shape[1]):
            mask_BT = torch.nn.functional.pad(mask_BT, (0, 1), value=1)
            position_B = position_B + 1
            out = model(input_ids=new_BS[:, step : step + 1], attention_mask=mask_BT,
                        position_ids=position_B[:, None], use_cache=True, **{name: cache})
            cache = out[name]
            logits.append(out.logits[:, -1])
    return logits


# rows to keep before each of 4 decoding steps; [0, 4, 2, 3] moves row 4 into the hole of
# row 1 in place, [3, 1] is a general pick
@pytest.mark.parametrize("selections", [[None] * 4, [None, torch.tensor([0, 4, 2, 3]), torch.tensor([3, 1]), None]])
@pytest.mark.parametrize("onednn", [False, pytest.param(True, marks=pytest.mark.skipif(
    not fast_llama.ONEDNN, reason="this torch has no oneDNN prepacked linear product"))])
@pytest.mark.parametrize("kind", list(MODELS))
def test_decoding_steps_give_the_models_logits_as_rows_leave(selections, onednn, kind):
    model = MODELS[kind]()  # 6 query heads share 2 key heads
    gen = torch.Generator().manual_seed(1)
    ids_BT = torch.randint(3, 40, (5, 7), generator=gen)
    mask_BT = torch.ones_like(ids_BT)
    mask_BT[1, :4] = 0  # left padding
    mask_BT[3, :2] = 0
    new_BS = torch.randint(3, 40, (5, len(selections)), generator=gen)
    expected = _model_steps(model, ids_BT, mask_BT, new_BS)

    positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        prefill = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT, use_cache=True)
    decoder = fast_llama.LlamaDecoder(model, onednn)
    decoder.start(prefill[compat.cache_argument(model.forward)], capacity=7 + len(selections), dtype=None)
    rows, position_B, mask = torch.arange(5), positions_BT[:, -1], mask_BT
    for step, keep in enumerate(selections):
        if keep is not None:
            decoder.select_rows(keep)
            rows, position_B, mask = rows[keep], position_B[keep], mask[keep]
        mask = torch.nn.functional.pad(mask, (0, 1), value=1)
        position_B = position_B + 1
        logits = decoder.step(new_BS[rows, step], position_B, mask)
        torch.testing.assert_close(logits, expected[step][rows], atol=1e-5, rtol=0)


def assert_sampled_alike(model, tokenizer, onednn: bool = False):
    """The sampler draws the same rollouts (completions and log-probs) with the fused decoder
    as through transformers' modules, from the same random numbers."""
    problems = [Problem(task="add", id=str(i), prompt=p, answer="0") for i, p in enumerate(["7+8\n", "123+456\n"])]
    params = SamplingParams(temperature=1.1, max_new_tokens=20)

    def sample(fast: bool):
        generator = HFGenerator(model, tokenizer, fast=fast, onednn=onednn)
        assert generator.fast == fast
        groups = generator.generate(problems, 4, params, generator=torch.Generator().manual_seed(3))
        return [r for g in groups for r in g.rollouts]

    for one, other in zip(sample(True), sample(False)):
        assert one.completion_ids == other.completion_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)


@pytest.mark.parametrize("onednn", [False, True])
def test_the_sampler_draws_the_same_rollouts_with_and_without_the_decoder(tiny_policy, onednn):
    assert_sampled_alike(*tiny_policy, onednn)


def test_a_model_whose_layer_dropped_its_positions_is_sampled_alike_with_and_without_the_decoder(tiny_policy):
    """builtin:tiny-long's kind: the tiny policy's weights in a SmolLM3 whose layer then goes
    without positions (tempering.models.tiny.drop_positions, as pre-training does)."""
    from tempering.models.tiny import build_model, drop_positions

    llama, tokenizer = tiny_policy
    c = llama.config
    model = build_model(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                        c.max_position_embeddings, 0, c.pad_token_id, c.bos_token_id, c.eos_token_id,
                        nope_layers=[0])
    model.load_state_dict(llama.state_dict())
    drop_positions(model, [0])
    assert_sampled_alike(model.eval(), tokenizer)


def test_the_bf16_decoder_stays_close_to_float32(tiny_policy):
    model, tokenizer = tiny_policy
    decoder = fast_llama.LlamaDecoder(model)
    ids_BT = torch.tensor([tokenizer("47+38\n")["input_ids"]] * 2)
    mask_BT = torch.ones_like(ids_BT)
    with torch.no_grad():
        prefill = model(input_ids=ids_BT, attention_mask=mask_BT, use_cache=True)
    logits = {}
    for dtype in (None, torch.bfloat16):
        decoder.start(prefill[compat.cache_argument(model.forward)], capacity=ids_BT.shape[1] + 1, dtype=dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            logits[dtype] = decoder.step(torch.tensor([5, 6]), torch.full((2,), ids_BT.shape[1]),
                                         torch.ones(2, ids_BT.shape[1] + 1, dtype=torch.long))
    gap = (logits[None].log_softmax(-1) - logits[torch.bfloat16].log_softmax(-1)).abs().max()
    assert 1e-4 < gap < 0.2, "bf16 products: close to the float32 numbers, but not them"


def test_the_decoder_sees_every_update_of_the_weights():
    """The learner's fused AdamW counts no tensor version: projections are made again at each start."""
    model = _grouped_query_model()
    gen = torch.Generator().manual_seed(2)
    ids_BT, new_BS = torch.randint(3, 40, (3, 6), generator=gen), torch.randint(3, 40, (3, 1), generator=gen)
    mask_BT = torch.ones_like(ids_BT)
    positions_BT = mask_BT.cumsum(-1) - 1
    decoder = fast_llama.LlamaDecoder(model)
    optimizer = adamw(model, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)  # the learner's, one fused kernel

    def decoded():
        with torch.no_grad():
            prefill = model(input_ids=ids_BT, attention_mask=mask_BT, position_ids=positions_BT, use_cache=True)
        decoder.start(prefill[compat.cache_argument(model.forward)], capacity=7, dtype=None)
        return decoder.step(new_BS[:, 0], positions_BT[:, -1] + 1, torch.nn.functional.pad(mask_BT, (0, 1), value=1))

    decoded()
    model(input_ids=ids_BT).logits.square().mean().backward()
    optimizer.step()
    torch.testing.assert_close(decoded(), _model_steps(model, ids_BT, mask_BT, new_BS)[0], atol=1e-5, rtol=0)
    state = {name: tensor + 0.1 for name, tensor in model.state_dict().items()}
    model.load_state_dict(state)
    torch.testing.assert_close(decoded(), _model_steps(model, ids_BT, mask_BT, new_BS)[0], atol=1e-5, rtol=0)
