"""Log-probabilities of the tokens in a batch under a model: the one place this is computed."""

from __future__ import annotations

from typing import Optional

import torch


def token_logprobs(model, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor,
                   temperature: float = 1.0, with_entropy: bool = False
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``logprobs_BT[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; position 0 is 0.

    Logits are divided by ``temperature`` first, matching what the sampler recorded. Rows
    must be right-padded (positions count from 0 at the first token). ``entropy_BT`` is the
    entropy of the same distributions, without gradient, when asked for.
    """
    logits_BTV = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT).logits[:, :-1].float()
    logp_BTV = torch.log_softmax(logits_BTV / temperature, dim=-1)
    picked_BT = logp_BTV.gather(-1, input_ids_BT[:, 1:, None])[..., 0]
    logprobs_BT = torch.nn.functional.pad(picked_BT, (1, 0))
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():
            entropy_BT = torch.nn.functional.pad(-(logp_BTV.exp() * logp_BTV).sum(-1), (1, 0))
    return logprobs_BT, entropy_BT
