"""Log-probabilities of the tokens in a batch under a model: the one place this is computed.

Two ways from the model to log-probs:

- the model's own logits (:func:`logprobs_from_logits`): simple, and right for any model,
  but it holds the whole ``[tokens, vocab]`` logits (and their gradient) at once;
- chunked (:func:`chunked_logprobs`): from the last hidden states and the output layer's
  weight, a chunk of tokens at a time, recomputing each chunk's logits in the backward pass,
  so no more than one chunk of logits ever exists. It assumes logits are exactly
  ``hidden @ lm_head.weight.T``: models that scale or soft-cap their logits are refused.

:func:`forward_logprobs` runs the model on the rows laid out as ``tempering.plan`` chose
(right-padded, packed with ``tempering.packing``, or with shared prompts) and computes log-probs only where they are
wanted, usually the trained completion tokens, then puts them back on the batch's rows.

**Shared prompts.** A group's samples repeat one prompt, and the learner would compute each
copy's forward and backward pass. In the shared layout, rows whose prompts are the
same token for token share one pass over it: the distinct prompts run first, keeping their
keys and values (with gradient), and each row's completion then runs on the cache of its
prompt, the way a sampler continues a prefilled prompt. A prompt's gradient is then the sum of
what its copies would have received, so log-probs and gradients are those of the separate
rows up to floating-point summation order. The plan chooses it when it computes fewer tokens
than the padded or packed rows would (completions are right-padded to the longest), needs a model
whose forward takes a cache (not with gradient checkpointing, which drops the cache) and a
plain output layer (see :func:`output_weight`), and shares only within a micro-batch (the
learner's token-budget plans keep a prompt's rows together where they fit,
``tempering.packing.plan_shared_micro_batches``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from tempering.models.compat import cache_argument, checkpointing, full_attention_cache, select_cache_rows
from tempering.packing import distinct_prompts, pack
from tempering.plan import Layout, layout_of

SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config fields of models whose logits are not the plain output projection."""


def logprobs_from_logits(logits_BTV: torch.Tensor, input_ids_BT: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, entropy_grad: bool = False
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``logprobs_BT[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` from a forward pass's
    logits (``logits_BTV[:, t]`` predicts token ``t + 1``); position 0 is 0.

    Logits are divided by ``temperature`` first, matching what the sampler recorded.
    ``entropy_BT`` is the entropy of the same distributions when asked for, with gradient
    only if ``entropy_grad`` (an entropy bonus needs it; a metric does not).
    """
    picked_BT, entropy_BT = _pick(logits_BTV[:, :-1], input_ids_BT[:, 1:], temperature, with_entropy, entropy_grad)
    return (torch.nn.functional.pad(picked_BT, (1, 0)),
            None if entropy_BT is None else torch.nn.functional.pad(entropy_BT, (1, 0)))


def _pick(logits_NV: torch.Tensor, targets_N: torch.Tensor, temperature: float, with_entropy: bool,
          entropy_grad: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs of ``targets_N`` under ``softmax(logits / temperature)`` over the last
    dimension, in float32, and the entropies when asked for (with gradient if ``entropy_grad``)."""
    logp_NV = torch.log_softmax(logits_NV.float() / temperature, dim=-1)
    picked_N = logp_NV.gather(-1, targets_N[..., None])[..., 0]
    entropy_N = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return picked_N, entropy_N


def _chunk_logits(hidden_CH: torch.Tensor, weight_VH: torch.Tensor, temperature: float) -> torch.Tensor:
    # under autocast the product runs in its lower precision, as the model's own lm_head would;
    # the softmax is in float32 at least
    return (hidden_CH @ weight_VH.T).to(torch.promote_types(hidden_CH.dtype, torch.float32)) / temperature


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs and entropies of ``targets_N`` from hidden states, one chunk of logits at a time.

    With ``z`` a token's temperature-scaled logits, ``p = softmax(z)`` and ``H`` its entropy:
    ``d logp(y) / dz = onehot(y) - p`` and ``dH / dz = -p * (log p + H)``; both are formed
    per chunk in the backward pass from recomputed logits and the saved log-sum-exp.

    The backward pass recomputes the logits under the forward pass's autocast state (on the
    hidden states' device type), as ``torch.amp.custom_fwd``/``custom_bwd`` do for one fixed
    device type.
    """

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, targets_N, temperature, chunk, with_entropy):
        ctx.set_materialize_grads(False)
        device = hidden_NH.device
        ctx.autocast = (device.type, torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        n, dtype = hidden_NH.shape[0], torch.promote_types(hidden_NH.dtype, torch.float32)
        logprobs_N = torch.empty(n, dtype=dtype, device=device)
        entropy_N = torch.empty(n if with_entropy else 0, dtype=dtype, device=device)
        lse_N = torch.empty(n, dtype=dtype, device=device)
        for start in range(0, n, chunk):
            z_CV = _chunk_logits(hidden_NH[start : start + chunk], weight_VH, temperature)
            lse_C = z_CV.logsumexp(-1)
            lse_N[start : start + chunk] = lse_C
            logprobs_N[start : start + chunk] = z_CV.gather(-1, targets_N[start : start + chunk, None])[:, 0] - lse_C
            if with_entropy:
                p_CV = (z_CV - lse_C[:, None]).exp_()
                entropy_N[start : start + chunk] = lse_C - torch.linalg.vecdot(p_CV, z_CV)
        ctx.save_for_backward(hidden_NH, weight_VH, targets_N, lse_N, entropy_N)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, grad_entropy_N):
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            return _ChunkedLogprobs._backward(ctx, grad_logprobs_N, grad_entropy_N)

    @staticmethod
    def _backward(ctx, grad_logprobs_N, grad_entropy_N):
        hidden_NH, weight_VH, targets_N, lse_N, entropy_N = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        grad_hidden_NH = torch.zeros_like(hidden_NH) if ctx.needs_input_grad[0] else None
        grad_weight_VH = torch.zeros_like(weight_VH, dtype=lse_N.dtype) if ctx.needs_input_grad[1] else None
        if grad_logprobs_N is None and grad_entropy_N is None:
            return grad_hidden_NH, grad_weight_VH, None, None, None, None
        for start in range(0, hidden_NH.shape[0], chunk):
            end = start + chunk
            hidden_CH = hidden_NH[start:end]
            # two [C, V] buffers: log p (becoming the weights of -p), and p (becoming the gradient)
            logp_CV = _chunk_logits(hidden_CH, weight_VH, temperature).sub_(lse_N[start:end, None])
            grad_z_CV = logp_CV.exp()
            g_C = (logp_CV.new_zeros(len(hidden_CH)) if grad_logprobs_N is None
                   else grad_logprobs_N[start:end])
            if grad_entropy_N is None:
                grad_z_CV.mul_(-g_C[:, None])
            else:
                weights_CV = logp_CV.add_(entropy_N[start:end, None]).mul_(grad_entropy_N[start:end, None])
                grad_z_CV.mul_(weights_CV.add_(g_C[:, None])).neg_()
            del logp_CV
            grad_z_CV.scatter_add_(-1, targets_N[start:end, None], g_C[:, None])
            grad_z_CV = grad_z_CV.div_(temperature).to(torch.promote_types(hidden_CH.dtype, weight_VH.dtype))
            if grad_hidden_NH is not None:
                grad_hidden_NH[start:end] = grad_z_CV @ weight_VH
            if grad_weight_VH is not None:
                grad_weight_VH += grad_z_CV.T @ hidden_CH
        if grad_weight_VH is not None:
            grad_weight_VH = grad_weight_VH.to(weight_VH.dtype)
        return grad_hidden_NH, grad_weight_VH, None, None, None, None


def chunked_logprobs(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, targets_N: torch.Tensor,
                     temperature: float = 1.0, chunk: int = 1024, with_entropy: bool = False,
                     entropy_grad: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``log softmax(hidden @ weight.T / temperature)`` at ``targets_N``, and the entropy when
    asked for (with gradient only if ``entropy_grad``), ``chunk`` tokens of logits at a time.

    Equal to the same maths on the full logits up to floating-point summation order; the
    full ``[N, V]`` logits never exist, here or in the backward pass.
    """
    logprobs_N, entropy_N = _ChunkedLogprobs.apply(hidden_NH, weight_VH, targets_N, temperature, chunk,
                                                   with_entropy)
    if not with_entropy:
        return logprobs_N, None
    return logprobs_N, entropy_N if entropy_grad else entropy_N.detach()


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


def can_share_prompts(model: Any) -> bool:
    """Whether :func:`forward_logprobs` can share prompts for ``model``: no gradient
    checkpointing, a plain output layer, and a cache of plain full-attention layers."""
    return not checkpointing(model) and plain_head(model) and full_attention_cache(model.config) is not None


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


def _shared_hidden(model: Any, shared: SharedPrompts) -> torch.Tensor:
    """The decoder's last hidden states of the shared prompts then of the completions,
    flattened to ``[tokens, hidden]`` in the order of ``shared.index_BT``."""
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

    The model runs on the rows as ``layout`` says (chosen by ``tempering.plan``): padded,
    packed (``tempering.packing.pack``), or sharing their prompts (see the module docstring;
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
            logprobs_N, entropy_N = _pick(hidden_NH @ weight_VH.T, targets_N, temperature, with_entropy, entropy_grad)
    else:
        out = model(**inputs, use_cache=False, output_hidden_states=with_hidden)
        logits_NV = out.logits.reshape(-1, out.logits.shape[-1])[source_N]
        logprobs_N, entropy_N = _pick(logits_NV, targets_N, temperature, with_entropy, entropy_grad)
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
