"""The critic: clipped value loss on hand-computed values, value alignment, parameter ownership."""

import torch

from tempering.algorithms.losses import clipped_value_loss
from tempering.learner.critic import Critic
from tempering.models.tiny import build_model


def test_clipped_value_loss_golden_values_and_gradients():
    values_BT = torch.tensor([[0.4, 1.0, -0.2, 0.9]], requires_grad=True)
    old_BT = torch.tensor([[0.3, 0.3, 0.0, 0.3]])
    returns_BT = torch.tensor([[1.0, 0.0, 0.5, 1.0]])

    loss_BT = clipped_value_loss(values_BT, old_BT, returns_BT, clip=0.2)

    # v_clipped = old + clamp(v - old, -0.2, 0.2); loss = 0.5 * max((v - R)², (v_clipped - R)²)
    # v=0.4  old=0.3 R=1: (0.4 - 1)² = 0.36, v_clipped 0.4 (inside) -> 0.36 -> 0.18
    # v=1.0  old=0.3 R=0: (1 - 0)² = 1,      v_clipped 0.5 -> 0.25          -> 0.5
    # v=-0.2 old=0   R=0.5: 0.7² = 0.49,     v_clipped -0.2 (inside) -> 0.49 -> 0.245
    # v=0.9  old=0.3 R=1: 0.1² = 0.01,       v_clipped 0.5 -> 0.5² = 0.25    -> 0.125 (the clipped term wins)
    torch.testing.assert_close(loss_BT.detach(), torch.tensor([[0.18, 0.5, 0.245, 0.125]]), atol=1e-6, rtol=0)
    loss_BT.sum().backward()
    # gradient v - R where v is inside the clip range or the unclipped term is the larger;
    # 0 where the clipped term wins (it is constant in v)
    torch.testing.assert_close(values_BT.grad, torch.tensor([[-0.6, 1.0, -0.7, 0.0]]), atol=1e-6, rtol=0)


def test_value_loss_without_clipping_is_half_the_squared_error():
    values_BT = torch.tensor([[0.9, -1.0]])
    loss_BT = clipped_value_loss(values_BT, torch.zeros(1, 2), torch.tensor([[1.0, 1.0]]), clip=0.0)
    # 0.5 * 0.1² = 0.005 and 0.5 * 2² = 2
    torch.testing.assert_close(loss_BT, torch.tensor([[0.005, 2.0]]), atol=1e-7, rtol=0)


def _model():
    return build_model(vocab_size=12, hidden_size=16, layers=1, heads=2, max_positions=16, seed=0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def test_values_are_read_one_position_back_like_log_probs():
    critic = Critic(_model(), shared=True)
    with torch.no_grad():
        critic.head.weight.copy_(torch.tensor([[1.0] + [0.0] * 15]))
        critic.head.bias.fill_(0.5)
    hidden_BTH = torch.zeros(1, 3, 16)
    hidden_BTH[0, :, 0] = torch.tensor([10.0, 20.0, 30.0])
    # position t holds head(hidden[t - 1]) = hidden[t - 1, 0] + 0.5; position 0 is 0
    torch.testing.assert_close(critic.values_from_hidden(hidden_BTH), torch.tensor([[0.0, 10.5, 20.5]]))


def test_a_shared_head_adds_only_its_own_parameters_and_a_critic_model_adds_a_copy():
    policy = _model()
    shared, separate = Critic(policy, shared=True), Critic(policy, shared=False)
    assert shared.trunk is policy
    assert len(shared.parameters()) == 2, "weight and bias of the head"
    assert separate.trunk is not policy
    policy_ids = {id(p) for p in policy.parameters()}
    assert not policy_ids & {id(p) for p in separate.parameters()}
    assert len(separate.parameters()) == 2 + len(list(policy.parameters()))
    ids_BT = torch.tensor([[1, 5, 6, 7]])
    values_BT = separate.values(ids_BT, torch.ones_like(ids_BT))
    assert values_BT.shape == (1, 4) and not values_BT.any(), "a zero-initialised head starts at 0"
