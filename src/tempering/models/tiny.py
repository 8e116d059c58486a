"""The built-in tiny model: a few-million-parameter Llama with a character-level tokenizer.

Characters keep the tokenizer trivial and the model honest on arithmetic (every digit is
its own token). Both are ordinary transformers objects: ``save_pretrained`` writes a
directory that ``AutoModelForCausalLM`` and ``AutoTokenizer`` load with no tempering code.
A model some of whose layers go without positions (``nope_layers``) is transformers' SmolLM3,
the Llama whose config lists the layers that apply no rotary positions.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, SmolLM3Config, SmolLM3ForCausalLM

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARACTERS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, plus pad/bos/eos/unk; encoding prepends <bos>."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    bos = vocab["<bos>"]
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_max_length=4096,
    )


def build_model(
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    max_positions: int,
    seed: int,
    pad_token_id: int,
    bos_token_id: int,
    eos_token_id: int,
    nope_layers: Sequence[int] = (),
) -> Any:
    """A freshly initialised Llama; the MLP is 8/3 of the hidden size, as in Llama. With
    ``nope_layers`` the same model as a SmolLM3, every layer still with its rotary positions:
    :func:`drop_positions` takes them from those layers later."""
    shape = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=int(hidden_size * 8 / 3) // 16 * 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    import torch

    torch.manual_seed(seed)
    if not nope_layers:
        return LlamaForCausalLM(LlamaConfig(**shape))
    llama = LlamaConfig()  # SmolLM3's own defaults differ: a rotary base of 2e6
    rope = {"rope_type": "default", "rope_theta": llama.rope_parameters["rope_theta"]}
    return SmolLM3ForCausalLM(SmolLM3Config(**shape, rms_norm_eps=llama.rms_norm_eps, rope_parameters=rope,
                                            no_rope_layers=[1] * layers))


def drop_positions(model: Any, layers: Sequence[int]) -> None:
    """Take the rotary positions from ``layers`` of a model :func:`build_model` made with them
    in ``nope_layers``: their attention reads by content alone from then on (NoPE), in this
    process and in the saved config (``no_rope_layers``)."""
    for index in layers:
        model.config.no_rope_layers[index] = 0
        model.model.layers[index].self_attn.use_rope = False
