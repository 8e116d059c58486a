"""The one guarded optimizer step: clipped, taken when finite, skipped (never applied) when not."""

import math

import torch

from tempering.learner.optim import guarded_step


def _sgd(grad: list[float]) -> tuple[torch.nn.Parameter, torch.optim.SGD]:
    weight = torch.nn.Parameter(torch.zeros(len(grad)))
    weight.grad = torch.tensor(grad)
    return weight, torch.optim.SGD([weight], lr=1.0)


def test_a_finite_step_is_clipped_and_taken():
    weight, optimizer = _sgd([3.0, 4.0])
    norm, stepped = guarded_step(optimizer, loss=0.5, grad_clip=1.0)
    assert stepped and norm == 5.0  # the norm before clipping
    assert torch.allclose(weight.detach(), torch.tensor([-0.6, -0.8]), atol=1e-6)  # lr 1 x the gradient at norm 1
    assert weight.grad is None


def test_no_clip_measures_the_norm_and_steps_with_the_whole_gradient():
    weight, optimizer = _sgd([3.0, 4.0])
    norm, stepped = guarded_step(optimizer, loss=0.5, grad_clip=0.0)
    assert stepped and norm == 5.0
    assert torch.equal(weight.detach(), torch.tensor([-3.0, -4.0]))


def test_a_non_finite_loss_or_gradient_is_skipped_and_the_gradient_cleared():
    for loss, grad in ((float("nan"), [1.0, 1.0]), (0.5, [float("inf"), 1.0]), (0.5, [float("nan"), 0.0])):
        weight, optimizer = _sgd(grad)
        norm, stepped = guarded_step(optimizer, loss=loss, grad_clip=1.0)
        assert not stepped and (math.isfinite(loss) is False or not math.isfinite(norm))
        assert torch.equal(weight.detach(), torch.zeros(2)) and weight.grad is None
