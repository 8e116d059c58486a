"""Log-probs at a sampling temperature: the chunked path (logits a chunk at a time, recomputed in
the backward pass) against log-softmax of the full logits divided by the temperature, values
and gradients; at temperature 1 the division is skipped, which must change no bit."""

from __future__ import annotations

import pytest
import torch

from tempering.algorithms.logprobs import chunked_logprobs, pick_logprobs


def both_ways(temperature: float, with_entropy: bool):
    gen = torch.Generator().manual_seed(0)
    hidden_NH, weight_VH = torch.randn(10, 8, generator=gen), torch.randn(50, 8, generator=gen)
    targets_N, scale_N = torch.randint(0, 50, (10,), generator=gen), torch.randn(10, generator=gen)
    results = []
    for chunked in (True, False):
        hidden, weight = hidden_NH.clone().requires_grad_(), weight_VH.clone().requires_grad_()
        if chunked:
            logprobs_N, entropy_N = chunked_logprobs(hidden, weight, targets_N, temperature, 3, with_entropy, True)
        else:
            logprobs_N, entropy_N = pick_logprobs(hidden @ weight.T, targets_N, temperature, with_entropy, True)
        loss = (logprobs_N * scale_N).sum() + (0 if entropy_N is None else 0.3 * entropy_N.sum())
        loss.backward()
        results.append((logprobs_N.detach(), hidden.grad, weight.grad))
    return results


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_logprobs_at_a_temperature_equal_the_full_softmaxs(temperature, with_entropy):
    chunked, full = both_ways(temperature, with_entropy)
    for a, b in zip(chunked, full):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # float32 summation order


def test_at_temperature_1_the_logits_are_those_of_a_division_by_1():
    gen = torch.Generator().manual_seed(1)
    logits_NV, targets_N = torch.randn(6, 30, generator=gen), torch.randint(0, 30, (6,), generator=gen)
    picked_N, _ = pick_logprobs(logits_NV, targets_N, 1.0, False, False)
    expected_N = torch.log_softmax(logits_NV / 1.0, dim=-1).gather(-1, targets_N[:, None])[:, 0]
    assert torch.equal(picked_N, expected_N)
