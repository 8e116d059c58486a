"""The DPO family equals TRL's: TRL's own loss code run on the same tensors (float64), value and
gradient to 1e-6.

TRL computes DPO's and KTO's losses inside ``DPOTrainer._compute_loss`` and
``KTOTrainer._compute_loss``, which run the model themselves; here they run on a stand-in
model whose forward returns the given per-token log-probs (the fused head's ``log_probs``),
with the reference log-probs precomputed, as TRL's ``precompute_ref_log_probs`` feeds them.
SimPO and label-smoothed DPO are ``CPOTrainer.cpo_loss`` (TRL's DPO ``sigmoid`` has no label
smoothing; CPO's is conservative DPO's form, here given the log-ratios). Skipped without TRL
(``pip install 'tempering[bench]'``).
"""

from collections import defaultdict
from types import MethodType, SimpleNamespace

import pytest
import torch

from tempering.algorithms.preference import PairInputs, UnpairedInputs, dpo, ipo, kto, kto_kl, sequence_logprobs, simpo

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
trl_kto = pytest.importorskip("trl.trainer.kto_trainer")
trl_cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")

PAIRS, WIDTH = 4, 7


def _accelerator():
    return SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)


class _Outputs:
    """What TRL reads from a fused-head forward: its log-probs, and metrics inputs (zeros)."""

    def __init__(self, log_probs):
        self.log_probs = log_probs
        self.entropy = torch.zeros_like(log_probs.detach())
        self.mean_logits = torch.zeros_like(log_probs.detach())
        self.is_top1 = torch.zeros_like(log_probs.detach(), dtype=torch.bool)


class _Model:
    """Answers TRL's forward calls with the log-probs given for each input tensor."""

    training = True

    def __init__(self, by_input):
        self.by_input = by_input

    def __call__(self, input_ids, **_):
        return _Outputs(next(lp for ids, lp in self.by_input if ids is input_ids))


def _trainer(**fields):
    return SimpleNamespace(model=_Model([]), accelerator=_accelerator(), aux_loss_enabled=False, ld_alpha=None,
                           precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_weights=[1.0],
                           use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
                           _total_train_tokens=0, _tp_size=1, **fields)


def _completion_mask(rows: int, seed: int) -> torch.Tensor:
    """Rows of WIDTH tokens: a prompt of 1 to 3 tokens, then a completion of at least one, then padding."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(rows, WIDTH, dtype=torch.long)
    for row in range(rows):
        start = int(torch.randint(1, 4, (1,), generator=generator))
        end = int(torch.randint(start + 1, WIDTH + 1, (1,), generator=generator))
        mask[row, start:end] = 1
    return mask


def _token_logprobs(mask_BT: torch.Tensor, seed: int) -> torch.Tensor:
    """Per-token log-probs (position t predicts token t + 1), the leaf gradients are taken in."""
    generator = torch.Generator().manual_seed(seed)
    return (-torch.rand(mask_BT.shape[0], WIDTH - 1, generator=generator, dtype=torch.float64) * 3).requires_grad_()


def _fused(logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """TRL's fused head's ``log_probs``: 0 where the label is ignored (off the completion)."""
    return logprobs_BT * mask_BT[:, 1:]


def _pairs(seed=0):
    mask_BT = _completion_mask(2 * PAIRS, seed)
    logprobs_BT = _token_logprobs(mask_BT, seed + 1)
    ref_B = -torch.rand(2 * PAIRS, generator=torch.Generator().manual_seed(seed + 2), dtype=torch.float64) * 12
    return mask_BT, logprobs_BT, ref_B


def _ours(loss_fn, mask_BT, logprobs_BT, ref_B, **settings):
    logps_B, lengths_B = sequence_logprobs(logprobs_BT, mask_BT[:, 1:])
    inputs = PairInputs(logps_B[:PAIRS], logps_B[PAIRS:], lengths_B[:PAIRS], lengths_B[PAIRS:],
                        ref_B[:PAIRS], ref_B[PAIRS:], **settings)
    loss = loss_fn(inputs)[0].mean()
    return loss, torch.autograd.grad(loss, logprobs_BT)[0]


@pytest.mark.parametrize("ours, loss_type, beta", [(dpo, "sigmoid", 0.1), (dpo, "sigmoid", 0.7), (ipo, "ipo", 0.1),
                                                   (ipo, "ipo", 0.4)])
def test_dpo_and_ipo_equal_trls_dpo_trainer(ours, loss_type, beta):
    mask_BT, logprobs_BT, ref_B = _pairs()
    trainer = _trainer(loss_types=[loss_type], beta=beta, label_smoothing=0.0)
    input_ids = torch.arange(2 * PAIRS * WIDTH).view(2 * PAIRS, WIDTH)
    model = _Model([(input_ids, _fused(logprobs_BT, mask_BT))])
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": mask_BT,
              "ref_chosen_logps": ref_B[:PAIRS], "ref_rejected_logps": ref_B[PAIRS:]}
    theirs = trl_dpo.DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    their_grad = torch.autograd.grad(theirs, logprobs_BT)[0]

    loss, grad = _ours(ours, mask_BT, logprobs_BT, ref_B, beta=beta)
    assert abs(loss.item() - theirs.item()) < 1e-6 and 0 < loss.item()
    torch.testing.assert_close(grad, their_grad, atol=1e-6, rtol=0)
    assert trainer._metrics["train"]["rewards/chosen"][0] == pytest.approx(
        (beta * (sequence_logprobs(logprobs_BT, mask_BT[:, 1:])[0][:PAIRS] - ref_B[:PAIRS])).mean().item(), abs=1e-9)


def _cpo(loss_type, beta, label_smoothing, gamma):
    return SimpleNamespace(alpha=0.0, loss_type=loss_type, beta=beta, label_smoothing=label_smoothing,
                           simpo_gamma=gamma, accelerator=_accelerator())


@pytest.mark.parametrize("beta, label_smoothing, gamma", [(2.0, 0.0, 0.5), (2.5, 0.1, 1.0)])
def test_simpo_equals_trls_cpo_simpo_loss(beta, label_smoothing, gamma):
    mask_BT, logprobs_BT, ref_B = _pairs(seed=5)
    logps_B, lengths_B = sequence_logprobs(logprobs_BT, mask_BT[:, 1:])
    average_B = logps_B / lengths_B  # what CPO's forward returns for simpo: the mean token log-prob
    theirs = trl_cpo.CPOTrainer.cpo_loss(_cpo("simpo", beta, label_smoothing, gamma), average_B[:PAIRS],
                                         average_B[PAIRS:])[0].mean()
    their_grad = torch.autograd.grad(theirs, logprobs_BT)[0]

    loss, grad = _ours(simpo, mask_BT, logprobs_BT, ref_B, beta=beta,
                       label_smoothing=label_smoothing, gamma=gamma)
    assert abs(loss.item() - theirs.item()) < 1e-6
    torch.testing.assert_close(grad, their_grad, atol=1e-6, rtol=0)


def test_label_smoothed_dpo_equals_trls_conservative_sigmoid_on_log_ratios():
    mask_BT, logprobs_BT, ref_B = _pairs(seed=9)
    logps_B, _ = sequence_logprobs(logprobs_BT, mask_BT[:, 1:])
    ratios_B = logps_B - ref_B
    theirs = trl_cpo.CPOTrainer.cpo_loss(_cpo("sigmoid", 0.3, 0.2, 0.0), ratios_B[:PAIRS], ratios_B[PAIRS:])[0].mean()
    their_grad = torch.autograd.grad(theirs, logprobs_BT)[0]

    loss, grad = _ours(dpo, mask_BT, logprobs_BT, ref_B, beta=0.3, label_smoothing=0.2)
    assert abs(loss.item() - theirs.item()) < 1e-6
    torch.testing.assert_close(grad, their_grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("weights, seed", [((1.0, 1.0), 0), ((1.0, 1.33), 3), ((0.8, 1.0), 4)])
def test_kto_equals_trls_kto_trainer_with_its_kl_estimate(weights, seed):
    """TRL's KL rows pair each prompt with the previous example's completion; here they are
    any rows, since both sides are given the same ones."""
    rows = 6
    mask_BT, kl_mask_BT = _completion_mask(rows, seed), _completion_mask(rows, seed + 10)
    logprobs_BT, kl_logprobs_BT = _token_logprobs(mask_BT, seed + 1), _token_logprobs(kl_mask_BT, seed + 2).detach()
    generator = torch.Generator().manual_seed(seed + 3)
    ref_B = -torch.rand(rows, generator=generator, dtype=torch.float64) * 8
    ref_kl_B = -torch.rand(rows, generator=generator, dtype=torch.float64) * 8 - 4  # a positive KL point
    label_B = torch.tensor([True, False, True, True, False, False])
    input_ids, kl_input_ids = torch.zeros(rows, WIDTH, dtype=torch.long), torch.ones(rows, WIDTH, dtype=torch.long)
    model = _Model([(input_ids, _fused(logprobs_BT, mask_BT)), (kl_input_ids, _fused(kl_logprobs_BT, kl_mask_BT))])
    trainer = _trainer(loss_type="kto", beta=0.2, calculate_KL=True, desirable_weight=weights[0],
                       undesirable_weight=weights[1])
    trainer._compute_kl_logps = MethodType(trl_kto.KTOTrainer._compute_kl_logps, trainer)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "completion_mask": mask_BT,
             "KL_input_ids": kl_input_ids, "KL_attention_mask": torch.ones_like(kl_input_ids),
             "KL_completion_mask": kl_mask_BT, "label": label_B, "ref_logps": ref_B, "ref_KL_logps": ref_kl_B}
    theirs = trl_kto.KTOTrainer._compute_loss(trainer, model, batch, return_outputs=False)
    their_grad = torch.autograd.grad(theirs, logprobs_BT)[0]

    logps_B, _ = sequence_logprobs(logprobs_BT, mask_BT[:, 1:])
    kl = kto_kl(sequence_logprobs(kl_logprobs_BT, kl_mask_BT[:, 1:])[0], ref_kl_B)
    loss_B, rewards = kto(UnpairedInputs(logps_B, ref_B, label_B, kl, beta=0.2, desirable_weight=weights[0],
                                         undesirable_weight=weights[1]))
    loss = loss_B.mean()
    grad = torch.autograd.grad(loss, logprobs_BT)[0]
    assert kl.item() > 0 and trainer._metrics["train"]["kl"] == [pytest.approx(kl.item(), abs=1e-9)]
    assert abs(loss.item() - theirs.item()) < 1e-6
    torch.testing.assert_close(grad, their_grad, atol=1e-6, rtol=0)
    assert trainer._metrics["train"]["rewards/chosen"][0] == pytest.approx(rewards["rewards/chosen"].mean().item())
