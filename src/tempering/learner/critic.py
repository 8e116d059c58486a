"""A critic for PPO with GAE: a linear value head, on the policy's trunk or on its own copy.

``values_BT[:, t]`` estimates the return from the state just before token ``t``, so it is
read from the hidden state at ``t - 1``, the same position whose logits give the log-prob
of token ``t`` (``tempering.learner.forward``). Position 0 is 0.

Two placements:

- ``shared=True``: the head sits on the policy's last hidden state; the value loss trains
  the head and, through it, the policy's trunk (weighted by the value coefficient). One
  forward pass gives both log-probs and values.
- ``shared=False``: the head sits on a separate copy of the initial policy (a critic model);
  the value loss never touches the policy.

The head starts at zero (every value 0), so the first advantages are plain returns, and
the first update sends no gradient into a shared trunk (the head's weights are 0). The
critic trains with the policy's optimizer and learning rate; its loss is
``tempering.algorithms.losses.clipped_value_loss``. Not done: saving the critic with the final
checkpoint (it is only needed to keep training).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class Critic:
    """A value head on a trunk: the policy itself (``shared``) or a copy of it."""

    def __init__(self, policy: Any, shared: bool):
        self.shared = shared
        self.trunk = policy if shared else copy.deepcopy(policy)
        self.head = torch.nn.Linear(policy.config.hidden_size, 1, device=next(policy.parameters()).device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the critic adds to the optimizer (a shared trunk's are the policy's)."""
        own = list(self.head.parameters())
        return own if self.shared else own + list(self.trunk.parameters())

    def values_from_hidden(self, hidden_BTH: torch.Tensor) -> torch.Tensor:
        """Values aligned with token positions from the trunk's last hidden states."""
        values_BT = self.head(hidden_BTH[:, :-1].float())[..., 0]
        return torch.nn.functional.pad(values_BT, (1, 0))

    def values(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """Values of a batch, running the trunk."""
        out = self.trunk(input_ids=input_ids_BT, attention_mask=attention_mask_BT, output_hidden_states=True)
        return self.values_from_hidden(out.hidden_states[-1])
