"""Running a model for log-probabilities: the learner's forward pass, laid out as planned.

:func:`forward_logprobs` runs the model on the rows laid out as ``tempering.learner.plan``
chose (right-padded, packed with ``tempering.learner.packing``, or with shared prompts) and
computes log-probs only where they are wanted, usually the trained completion tokens, then
puts them back on the batch's rows. The maths on the logits (temperature, chunked log-softmax
and its backward pass) is ``tempering.algorithms.logprobs``'s; this module decides what the
model computes and where its outputs go.

**Shared prompts.** A group's samples repeat one prompt, and the learner would compute each
copy's forward and backward pass. In the shared layout, rows whose prompts are the
same token for token share one pass over it: the distinct prompts run first, keeping their
keys and values (with gradient), and each row's completion then runs on the cache of its
prompt, the way a sampler continues a prefilled prompt. A prompt's gradient is then the sum of
what its copies would have received, so log-probs and gradients are those of the separate
rows up to floating-point summation order. The plan chooses it when it computes fewer tokens
than the padded or packed rows would (completions are right-padded to the longest), needs a model
whose forward takes a cache and a plain output layer (see :func:`output_weight`), and shares
only within a micro-batch (the
learner's token-budget plans keep a prompt's rows together where they fit,
``tempering.learner.packing.plan_shared_micro_batches``). Under gradient checkpointing, which
drops a model's cache, the decoder is run here a layer at a time instead, each layer's prompt
and completion passes recomputed together in the backward pass
(:func:`_checkpointed_shared_hidden`), for decoders built as transformers' Llama family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from tempering.algorithms.logprobs import chunked_logprobs, pick_logprobs
from tempering.learner.packing import distinct_prompts, pack
from tempering.learner.plan import Layout, layout_of
from tempering.models.attention import NAME as ATTENTION_NAME
from tempering.models.compat import cache_argument, checkpointing, full_attention_cache, select_cache_rows


SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config fields of models whose logits are not the plain output projection."""


def output_weight(model: Any) -> torch.Tensor:
    """The output layer's weight, for :func:`chunked_logprobs`; a ValueError for models whose
    logits are more than ``hidden @ weight.T``."""
    head = model.get_output_embeddings()
    scaled = [name for name in SCALED_LOGITS if getattr(model.config, name, None) not in (None, 1, 1.0)]
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or scaled:
        why = f"its config sets {scaled[0]}" if scaled else "its output layer is not a plain linear map"
        raise ValueError(f"chunked log-probs need logits = hidden @ lm_head.weight.T, but {why}; "
                         "set learner.logprob_chunk=0 for this model")
    return head.weight


def plain_head(model: Any) -> bool:
    """Whether :func:`output_weight` serves ``model`` (its log-probs may be computed in chunks)."""
    try:
        output_weight(model)
    except ValueError:
        return False
    return True


@dataclass
class SharedPrompts:
    """Rows regrouped as their distinct prompts and their completions (see the module docstring)."""

    prompt_ids_PT: torch.Tensor
    """Distinct prompts, right-padded."""
    prompt_mask_PT: torch.Tensor
    prompt_of_B: torch.Tensor
    """Which distinct prompt each row continues."""
    completion_ids_BT: torch.Tensor
    """Each row's tokens after its prompt, right-padded."""
    completion_mask_BT: torch.Tensor
    positions_BT: torch.Tensor
    index_BT: torch.Tensor
    """Where the token at ``[b, t]`` is in the prompts' outputs followed by the completions'
    (flattened): with prompts ``span`` wide and completions ``reach`` wide, ``p * span + t`` in
    its prompt, ``P * span + b * reach + (t - prompt length)`` after it; -1 on padding."""

    @property
    def tokens(self) -> int:
        return self.prompt_ids_PT.numel() + self.completion_ids_BT.numel()


def can_share_prompts(model: Any, checkpointed: Optional[bool] = None) -> bool:
    """Whether :func:`forward_logprobs` can share prompts for ``model``: a plain output layer,
    a cache of plain full-attention layers, and under gradient checkpointing a decoder that
    can be run layer by layer (:func:`layer_by_layer`). ``checkpointed``: whether the learner
    will recompute the model's layers, for a model not set up for learning yet (``temper
    explain``'s); None reads it off the model."""
    if checkpointed is None:
        checkpointed = checkpointing(model)
    return (plain_head(model) and full_attention_cache(model.config) is not None
            and (not checkpointed or layer_by_layer(model)))


def layer_by_layer(model: Any) -> bool:
    """Whether the shared layout can run ``model``'s decoder one layer at a time, each layer
    recomputed in the backward pass (:func:`_checkpointed_shared_hidden`): an embedding,
    rotary embeddings, a list of layers and a final norm, as transformers' Llama-family
    decoders (Llama, Qwen2, SmolLM3, Mistral) have them, and attention that takes a boolean
    mask (sdpa, or tempering's autocast wrapper of it)."""
    decoder = model.get_decoder()
    parts = all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm"))
    return parts and getattr(model.config, "_attn_implementation", None) in ("sdpa", ATTENTION_NAME)


def share_prompts(input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                  prompt_lengths_B: torch.Tensor) -> Optional[SharedPrompts]:
    """The shared-prompt layout of right-padded rows whose first ``prompt_lengths_B`` tokens are
    their prompts, or None when no two rows share a prompt or some row has no prompt or no
    completion."""
    rows, width = input_ids_BT.shape
    lengths_B = attention_mask_BT.sum(dim=1)
    if rows < 2 or bool((prompt_lengths_B < 1).any()) or bool((lengths_B <= prompt_lengths_B).any()):
        return None
    prompts, prompt_of = distinct_prompts(input_ids_BT, prompt_lengths_B)
    if len(prompts) == rows:
        return None
    device = input_ids_BT.device
    prompt_of_B = torch.tensor(prompt_of, device=device)
    span = max(map(len, prompts))
    prompt_ids_PT = torch.zeros((len(prompts), span), dtype=input_ids_BT.dtype, device=device)
    prompt_mask_PT = torch.zeros((len(prompts), span), dtype=attention_mask_BT.dtype, device=device)
    for i, prompt in enumerate(prompts):
        prompt_ids_PT[i, : len(prompt)] = torch.tensor(prompt, dtype=input_ids_BT.dtype, device=device)
        prompt_mask_PT[i, : len(prompt)] = 1
    completion_lengths_B = lengths_B - prompt_lengths_B
    reach = int(completion_lengths_B.max())
    offsets_T = torch.arange(reach, device=device)
    completion_mask_BT = (offsets_T < completion_lengths_B[:, None]).to(attention_mask_BT.dtype)
    source_BT = (prompt_lengths_B[:, None] + offsets_T).clamp(max=width - 1)
    completion_ids_BT = input_ids_BT.gather(1, source_BT) * completion_mask_BT
    columns_T = torch.arange(width, device=device)
    in_prompt_BT = columns_T < prompt_lengths_B[:, None]
    index_BT = torch.where(in_prompt_BT, prompt_of_B[:, None] * span + columns_T,
                           len(prompts) * span + torch.arange(rows, device=device)[:, None] * reach
                           + (columns_T - prompt_lengths_B[:, None]))
    index_BT = index_BT.masked_fill(~attention_mask_BT.bool(), -1)
    return SharedPrompts(prompt_ids_PT, prompt_mask_PT, prompt_of_B, completion_ids_BT, completion_mask_BT,
                         source_BT, index_BT)


class _PromptKeys:
    """What one layer's attention takes for its cache in :func:`_checkpointed_shared_hidden`:
    the first call (the prompts) is kept and returned as it is; each later one (completions)
    gets its row's prompt's keys and values before its own."""

    def __init__(self, prompt_of_B: torch.Tensor):
        self.prompt_of_B = prompt_of_B
        self.prompts: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def update(self, keys: torch.Tensor, values: torch.Tensor, *_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prompts is None:
            self.prompts = keys, values
            return keys, values
        prompt_keys, prompt_values = self.prompts
        return (torch.cat([prompt_keys[self.prompt_of_B], keys], dim=2),
                torch.cat([prompt_values[self.prompt_of_B], values], dim=2))


def _layer_pair(layer: Any, prompts: torch.Tensor, completions: torch.Tensor, prompt_of_B: torch.Tensor,
                passes: tuple[dict, dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer on the prompts, then on the completions continuing them; the layer
    is called past transformers' checkpointing wrapper, which would drop the cache."""
    keys, outputs = _PromptKeys(prompt_of_B), []
    for hidden, settings in zip((prompts, completions), passes):
        out = torch.nn.Module.__call__(layer, hidden, past_key_values=keys, use_cache=True, **settings)
        outputs.append(out[0] if isinstance(out, tuple) else out)
    return outputs[0], outputs[1]


def _checkpointed_shared_hidden(model: Any, shared: SharedPrompts) -> torch.Tensor:
    """:func:`_shared_hidden` for a model that recomputes its layers: the decoder run here a
    layer at a time (:func:`layer_by_layer`), each layer's prompt and completion passes
    together under one activation checkpoint, so only the layers' inputs are kept, and the
    prompts' keys and values are recomputed with them in the backward pass."""
    decoder = model.get_decoder()
    (rows_P, span), (rows_B, reach) = shared.prompt_ids_PT.shape, shared.completion_ids_BT.shape
    device = shared.prompt_ids_PT.device
    positions_PT = torch.arange(span, device=device)[None].expand(rows_P, span)
    prompts, completions = decoder.embed_tokens(shared.prompt_ids_PT), decoder.embed_tokens(shared.completion_ids_BT)
    causal_SS = torch.ones((span, span), dtype=torch.bool, device=device).tril()
    causal_RR = torch.ones((reach, reach), dtype=torch.bool, device=device).tril()
    prompt_keys_P11S = shared.prompt_mask_PT.bool()[:, None, None, :]
    mask_B1RK = torch.cat([prompt_keys_P11S[shared.prompt_of_B].expand(rows_B, 1, reach, span),
                           causal_RR & shared.completion_mask_BT.bool()[:, None, None, :]], dim=-1)
    passes = ({"attention_mask": causal_SS & prompt_keys_P11S, "position_ids": positions_PT,
               "position_embeddings": decoder.rotary_emb(prompts, position_ids=positions_PT)},
              {"attention_mask": mask_B1RK, "position_ids": shared.positions_BT,
               "position_embeddings": decoder.rotary_emb(completions, position_ids=shared.positions_BT)})
    for layer in decoder.layers[: model.config.num_hidden_layers]:
        prompts, completions = torch.utils.checkpoint.checkpoint(
            _layer_pair, layer, prompts, completions, shared.prompt_of_B, passes, use_reentrant=False)
    size = prompts.shape[-1]
    return torch.cat([decoder.norm(prompts).reshape(-1, size), decoder.norm(completions).reshape(-1, size)])


def _shared_hidden(model: Any, shared: SharedPrompts) -> torch.Tensor:
    """The decoder's last hidden states of the shared prompts then of the completions,
    flattened to ``[tokens, hidden]`` in the order of ``shared.index_BT``."""
    if checkpointing(model):
        return _checkpointed_shared_hidden(model, shared)
    decoder = model.get_decoder()
    cache_arg = cache_argument(decoder.forward)
    prompt_ids_PT = shared.prompt_ids_PT
    positions_PT = torch.arange(prompt_ids_PT.shape[1], device=prompt_ids_PT.device)[None].expand_as(prompt_ids_PT)
    prompts = decoder(input_ids=prompt_ids_PT, attention_mask=shared.prompt_mask_PT, position_ids=positions_PT,
                      use_cache=True)
    cache = prompts[cache_arg]
    select_cache_rows(cache, shared.prompt_of_B)  # each row continues its prompt's keys and values
    mask_BS = torch.cat([shared.prompt_mask_PT[shared.prompt_of_B], shared.completion_mask_BT], dim=1)
    completions = decoder(input_ids=shared.completion_ids_BT, attention_mask=mask_BS,
                          position_ids=shared.positions_BT, use_cache=True, **{cache_arg: cache})
    size = prompts.last_hidden_state.shape[-1]
    return torch.cat([prompts.last_hidden_state.reshape(-1, size), completions.last_hidden_state.reshape(-1, size)])


@dataclass
class TokenOutputs:
    logprobs_BT: torch.Tensor
    """0 where not asked for, as on padding and at position 0."""
    entropy_BT: Optional[torch.Tensor] = None
    hidden_BTH: Optional[torch.Tensor] = None
    """The last hidden states on the batch's rows (0 on padding), when asked for."""


def forward_logprobs(model: Any, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                     temperature: float = 1.0, *, keep_BT: Optional[torch.Tensor] = None,
                     layout: Layout = Layout.PADDED, chunk: int = 0, with_entropy: bool = False,
                     entropy_grad: bool = False, with_hidden: bool = False,
                     prompt_lengths_B: Optional[torch.Tensor] = None) -> TokenOutputs:
    """Log-probs (and entropies) of the tokens of right-padded rows where ``keep_BT`` is
    nonzero (every real token after the first when None).

    The model runs on the rows as ``layout`` says (chosen by ``tempering.learner.plan``): padded,
    packed (``tempering.learner.packing.pack``), or sharing their prompts (see the module docstring;
    it needs ``prompt_lengths_B`` and a model that :func:`can_share_prompts`). ``chunk > 0``
    computes log-probs from hidden states ``chunk`` tokens at a time
    (:func:`chunked_logprobs`), ``chunk == 0`` from the model's own logits. Either way only the
    wanted positions' log-probs are formed. The values agree with :func:`logprobs_from_logits`
    on the padded rows up to floating-point summation order.
    """
    rows, width = input_ids_BT.shape
    real_BT = attention_mask_BT.bool()
    shared = packed = None
    if layout is Layout.SHARED:
        shared = share_prompts(input_ids_BT, attention_mask_BT, prompt_lengths_B)
        if shared is None:
            raise ValueError("the shared layout needs rows that repeat a prompt, each with a prompt and a completion")
        index_BT = shared.index_BT
    elif layout is Layout.PACKED:
        packed = pack(input_ids_BT, attention_mask_BT)
        inputs = {"input_ids": packed.input_ids_RW, "position_ids": packed.position_ids_RW}
        index_BT = packed.index_BT
    else:
        inputs = {"input_ids": input_ids_BT, "attention_mask": attention_mask_BT}
        index_BT = torch.arange(rows * width, device=input_ids_BT.device).view(rows, width)
    want_BT = real_BT.clone()
    want_BT[:, 0] = False
    if keep_BT is not None:
        want_BT &= keep_BT.bool()
    row_N, col_N = want_BT.nonzero(as_tuple=True)
    source_N = index_BT[row_N, col_N - 1]  # the position whose output predicts the token
    targets_N = input_ids_BT[row_N, col_N]
    if shared is not None or chunk > 0:  # from the decoder's hidden states and the output layer
        weight_VH = output_weight(model)
        hidden = (_shared_hidden(model, shared) if shared is not None
                  else model.get_decoder()(**inputs, use_cache=False).last_hidden_state)
        hidden_NH = hidden.reshape(-1, hidden.shape[-1])[source_N]
        if chunk > 0:
            logprobs_N, entropy_N = chunked_logprobs(hidden_NH, weight_VH, targets_N, temperature, chunk,
                                                     with_entropy, entropy_grad)
        else:
            logprobs_N, entropy_N = pick_logprobs(hidden_NH @ weight_VH.T, targets_N, temperature, with_entropy, entropy_grad)
    else:
        out = model(**inputs, use_cache=False, output_hidden_states=with_hidden)
        logits_NV = out.logits.reshape(-1, out.logits.shape[-1])[source_N]
        logprobs_N, entropy_N = pick_logprobs(logits_NV, targets_N, temperature, with_entropy, entropy_grad)
        hidden = out.hidden_states[-1] if with_hidden else None

    def on_rows(values_N: torch.Tensor) -> torch.Tensor:
        return values_N.new_zeros((rows, width)).index_put((row_N, col_N), values_N)

    hidden_BTH = None
    if with_hidden:
        hidden_BTH = hidden
        if packed is not None or shared is not None:
            flat_NH = hidden.reshape(-1, hidden.shape[-1])
            hidden_BTH = flat_NH[index_BT.clamp(min=0)] * real_BT[..., None]
    return TokenOutputs(on_rows(logprobs_N), None if entropy_N is None else on_rows(entropy_N), hidden_BTH)


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False, packing: bool = False, chunk: int = 0
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`forward_logprobs` of ``model`` on every real token of right-padded rows
    (positions count from 0 at the first token), packed or padded as ``packing`` says; the
    entropy, when asked for, is without gradient."""
    out = forward_logprobs(model, input_ids_BT, attention_mask_BT, temperature,
                           layout=layout_of(input_ids_BT, attention_mask_BT, packing), chunk=chunk,
                           with_entropy=with_entropy)
    return out.logprobs_BT, out.entropy_BT
