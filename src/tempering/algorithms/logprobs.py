"""Log-probabilities of the tokens in a batch under a model: the one place this is computed."""

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
    logp_BTV = torch.log_softmax(logits_BTV[:, :-1].float() / temperature, dim=-1)
    picked_BT = logp_BTV.gather(-1, input_ids_BT[:, 1:, None])[..., 0]
    logprobs_BT = torch.nn.functional.pad(picked_BT, (1, 0))
    entropy_BT = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy_BT = torch.nn.functional.pad(-(logp_BTV.exp() * logp_BTV).sum(-1), (1, 0))
    return logprobs_BT, entropy_BT


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`logprobs_from_logits` of ``model`` on right-padded rows (positions count from 0
    at the first token); the entropy, when asked for, is without gradient."""
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits
    return logprobs_from_logits(logits_BTV, input_ids_BT, temperature, with_entropy)
