"""The sampler's token draw: the distribution it draws from and the log-probs it records.

Draws are checked by frequency against the exact distribution over many rows at once; the
vocabulary sizes span several of the sampler's cumulative-sum blocks and one that is not a
whole number of them.
"""

import pytest
import torch

from tempering.rollout.hf import SamplingParams, _top_p_filter, pick_tokens, processed_logits

DRAWS = 40_000


def _logits(width: int, seed: int = 0) -> torch.Tensor:
    """A peaked distribution over ``width`` tokens with its heavy tokens spread over the range."""
    logits_V = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    heavy = torch.linspace(0, width - 1, 6).long()
    logits_V[heavy] += torch.tensor([6.0, 5.0, 4.5, 4.0, 3.0, 2.0])
    logits_V[heavy[1] + 1] = -float("inf")  # a token that must never be drawn
    return logits_V


def _frequencies(logits_V: torch.Tensor, params: SamplingParams, seed: int = 0) -> torch.Tensor:
    logits_BV = logits_V.expand(DRAWS, -1).contiguous()
    next_B, _, _ = pick_tokens(logits_BV, params, torch.Generator().manual_seed(seed))
    return torch.bincount(next_B, minlength=len(logits_V)).double() / DRAWS


def _assert_close_in_distribution(frequencies_V: torch.Tensor, probs_V: torch.Tensor) -> None:
    # each token within five standard errors, and Pearson's chi-square over the tokens expected
    # five times or more within six standard deviations of its mean (the degrees of freedom)
    tolerance_V = 5 * (probs_V * (1 - probs_V) / DRAWS).sqrt() + 1e-4
    assert ((frequencies_V - probs_V).abs() <= tolerance_V).all()
    counted_V = probs_V * DRAWS >= 5
    chi_square = float((DRAWS * (frequencies_V - probs_V)[counted_V] ** 2 / probs_V[counted_V]).sum())
    freedom = int(counted_V.sum())
    assert chi_square < freedom + 6 * (2 * freedom) ** 0.5


@pytest.mark.parametrize("width", [7, 256, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_follow_the_tempered_distribution(width, temperature):
    logits_V = _logits(width)
    frequencies_V = _frequencies(logits_V, SamplingParams(temperature=temperature))
    _assert_close_in_distribution(frequencies_V, torch.softmax(logits_V.double() / temperature, -1))
    assert frequencies_V[torch.isinf(logits_V)].sum() == 0


def _nucleus(probs_BV: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: sort everything; a token is in while the mass before it is within top_p."""
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True)
    inside_BV = sorted_BV.cumsum(-1) - sorted_BV <= top_p
    return torch.zeros_like(probs_BV).scatter(-1, order_BV, torch.where(inside_BV, sorted_BV, 0.0))


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_draws_follow_the_renormalised_nucleus(top_p):
    logits_V = _logits(300)
    nucleus_V = _nucleus(torch.softmax(logits_V.double(), -1)[None], top_p)[0]
    frequencies_V = _frequencies(logits_V, SamplingParams(top_p=top_p))
    _assert_close_in_distribution(frequencies_V, nucleus_V / nucleus_V.sum())
    assert frequencies_V[nucleus_V == 0].sum() == 0


@pytest.mark.parametrize("scale", [10.0, 1.0, 0.01])
def test_the_nucleus_is_the_same_however_many_tokens_it_holds(scale):
    # peaked rows keep a handful of tokens, nearly uniform ones most of the vocabulary
    probs_BV = torch.softmax(scale * torch.randn(8, 5000, generator=torch.Generator().manual_seed(1)), -1)
    kept_BK, order_BK = _top_p_filter(probs_BV.clone(), 0.95)
    found_BV = torch.zeros_like(probs_BV).scatter(-1, order_BK, kept_BK)
    assert torch.equal(found_BV > 0, _nucleus(probs_BV, 0.95) > 0)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.8),
                                    SamplingParams(greedy=True)])
def test_recorded_log_probs_are_the_log_softmax_of_the_drawn_tokens(params):
    logits_BV = 4 * torch.randn(64, 5000, generator=torch.Generator().manual_seed(2))
    next_B, logprob_B, _ = pick_tokens(logits_BV, params, torch.Generator().manual_seed(0))
    temperature = 1.0 if params.greedy else params.temperature
    expected_B = torch.log_softmax(logits_BV / temperature, -1).gather(-1, next_B[:, None])[:, 0]
    assert torch.allclose(logprob_B, expected_B, atol=1e-6)
    if params.greedy:
        assert torch.equal(next_B, logits_BV.argmax(-1))


def test_the_same_seed_draws_the_same_tokens():
    logits_BV = torch.randn(16, 3000, generator=torch.Generator().manual_seed(3))
    first, _, _ = pick_tokens(logits_BV, SamplingParams(), torch.Generator().manual_seed(5))
    again, _, _ = pick_tokens(logits_BV, SamplingParams(), torch.Generator().manual_seed(5))
    other, _, _ = pick_tokens(logits_BV, SamplingParams(), torch.Generator().manual_seed(6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("top_k, min_p", [(5, 0.0), (0, 0.05), (40, 0.01)])
def test_top_k_and_min_p_draws_follow_the_renormalised_truncation(top_k, min_p):
    logits_V = _logits(300)
    probs_V = torch.softmax(logits_V.double(), -1)
    kept_V = probs_V >= min_p * probs_V.max()
    if top_k:
        kept_V &= probs_V >= probs_V.topk(top_k).values[-1]
    truncated_V = torch.where(kept_V, probs_V, 0.0)
    frequencies_V = _frequencies(logits_V, SamplingParams(top_k=top_k, min_p=min_p))
    _assert_close_in_distribution(frequencies_V, truncated_V / truncated_V.sum())
    assert frequencies_V[~kept_V].sum() == 0


def test_truncation_decides_what_is_drawn_not_the_recorded_log_probs():
    logits_BV = 4 * torch.randn(64, 5000, generator=torch.Generator().manual_seed(2))
    next_B, logprob_B, _ = pick_tokens(logits_BV, SamplingParams(top_k=3, min_p=0.01), torch.Generator().manual_seed(0))
    assert torch.allclose(logprob_B, torch.log_softmax(logits_BV, -1).gather(-1, next_B[:, None])[:, 0], atol=1e-6)
    assert bool((next_B[:, None] == logits_BV.topk(3).indices).any(-1).all())


def test_penalties_follow_the_tokens_each_row_drew():
    logits_BV = torch.tensor([[1.0, -1.0, 2.0, 0.5], [1.0, -1.0, 2.0, 0.5]])
    drawn_BT = torch.tensor([[0, 0, 1], [3, 3, 3]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    found = processed_logits(logits_BV.clone(), params, drawn_BT, None, torch.tensor([2]))
    assert found.tolist() == [[1.0 - 0.5 - 0.5, -1.0 - 0.5 - 0.25, 2.0, 0.5],
                              [1.0, -1.0, 2.0, 0.5 - 0.5 - 0.75]]
    repeated = processed_logits(logits_BV.clone(), SamplingParams(repetition_penalty=2.0), drawn_BT,
                                torch.tensor([[False, False, True, False]] * 2), torch.tensor([2]))
    assert repeated.tolist() == [[0.5, -2.0, 1.0, 0.5], [1.0, -1.0, 1.0, 0.25]]
    early = processed_logits(logits_BV.clone(), SamplingParams(min_tokens=4), drawn_BT, None, torch.tensor([2]))
    assert early[:, 2].tolist() == [float("-inf")] * 2 and early[:, :2].tolist() == logits_BV[:, :2].tolist()
