"""Log-probabilities of tokens from a model's outputs: the one place this maths is written.

Two ways from the model's outputs to log-probs:

- the model's own logits (:func:`logprobs_from_logits`, :func:`pick_logprobs`): simple, and
  right for any model, but it holds the whole ``[tokens, vocab]`` logits (and their
  gradient) at once;
- chunked (:func:`chunked_logprobs`): from the last hidden states and the output layer's
  weight, a chunk of tokens at a time, recomputing each chunk's logits in the backward pass,
  so no more than one chunk of logits ever exists. It assumes logits are exactly
  ``hidden @ lm_head.weight.T``: models that scale or soft-cap their logits are refused
  (``tempering.learner.forward.output_weight``).

Running the model itself (layouts, shared prompts, which positions are wanted) is
``tempering.learner.forward``'s.
"""

from __future__ import annotations

from typing import Optional

import torch


def logprobs_from_logits(logits_BTV: torch.Tensor, input_ids_BT: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = False, entropy_grad: bool = False
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``logprobs_BT[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` from a forward pass's
    logits (``logits_BTV[:, t]`` predicts token ``t + 1``); position 0 is 0.

    Logits are divided by ``temperature`` first, matching what the sampler recorded.
    ``entropy_BT`` is the entropy of the same distributions when asked for, with gradient
    only if ``entropy_grad`` (an entropy bonus needs it; a metric does not).
    """
    picked_BT, entropy_BT = pick_logprobs(logits_BTV[:, :-1], input_ids_BT[:, 1:], temperature, with_entropy, entropy_grad)
    return (torch.nn.functional.pad(picked_BT, (1, 0)),
            None if entropy_BT is None else torch.nn.functional.pad(entropy_BT, (1, 0)))


def pick_logprobs(logits_NV: torch.Tensor, targets_N: torch.Tensor, temperature: float, with_entropy: bool,
          entropy_grad: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-probs of ``targets_N`` under ``softmax(logits / temperature)`` over the last
    dimension, in float32, and the entropies when asked for (with gradient if ``entropy_grad``)."""
    logits_NV = logits_NV.float()
    logp_NV = torch.log_softmax(logits_NV if temperature == 1 else logits_NV / temperature, dim=-1)
    picked_N = logp_NV.gather(-1, targets_N[..., None])[..., 0]
    entropy_N = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy_N = -(logp_NV.exp() * logp_NV).sum(-1)
    return picked_N, entropy_N


def _chunk_logits(hidden_CH: torch.Tensor, weight_VH: torch.Tensor, temperature: float) -> torch.Tensor:
    # under autocast the product runs in its lower precision, as the model's own lm_head would;
    # the softmax is in float32 at least. Dividing by 1 changes no bit, and over [C, V] logits
    # it costs a pass through memory (4% of a SmolLM2 learner step): skipped.
    z_CV = (hidden_CH @ weight_VH.T).to(torch.promote_types(hidden_CH.dtype, torch.float32))
    return z_CV if temperature == 1 else z_CV / temperature


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
            if temperature != 1:
                grad_z_CV.div_(temperature)
            grad_z_CV = grad_z_CV.to(torch.promote_types(hidden_CH.dtype, weight_VH.dtype))
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
