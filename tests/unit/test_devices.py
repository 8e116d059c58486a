"""No tensor is made on a hard-coded device: the learner and the sampler work on whatever
device the model's parameters are on.

With ``torch.set_default_device("meta")``, a tensor made without ``device=`` is a meta tensor
(no data). Some CPU kernels take a meta input without complaint and compute garbage, so the
tests also fail at the first torch call that returns a meta tensor, naming it. A learner
step and a sampler call run that way, with the model and the data on CPU, must then give
exactly the numbers they give without it; the same code on CUDA keeps everything there.
"""

from contextlib import contextmanager, nullcontext

import pytest
import torch
from test_learner import PAD, _learner, _model, _rollout
from test_merge_rows import _duplicate_batch
from torch.overrides import TorchFunctionMode

from tempering.build import build_run
from tempering.config import ConfigError, TrainConfig, load_config
from tempering.learner.step import collate
from tempering.models import device as device_module
from tempering.models.device import resolve_device, slow_bf16
from tempering.models.loading import ModelLoadError
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.types import Problem


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


class _NoMetaResults(TorchFunctionMode):
    """Fails at the torch call that returns a meta tensor (the data here is all on CPU)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(t.is_meta for t in _tensors(out)):
            raise AssertionError(f"{getattr(func, '__qualname__', func)} made a tensor without device=")
        return out


@contextmanager
def default_device_meta():
    """Tensors made without ``device=`` are meta tensors inside, and an error where they are
    made; the default device is restored after."""
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        with _NoMetaResults():
            yield
    finally:
        torch.set_default_device(previous)


def test_the_meta_default_catches_a_tensor_made_without_a_device():
    on_cpu = torch.ones(2, 1, 3)
    with default_device_meta():
        with pytest.raises(AssertionError, match="zeros made a tensor without device="):
            torch.bmm(torch.zeros(2, 1, 1), on_cpu)  # bmm alone would take the meta input
        assert (on_cpu + torch.zeros(3, device=on_cpu.device)).device.type == "cpu"
    assert torch.zeros(1).device.type == "cpu", "the default device is restored"


def test_collate_makes_the_batch_on_the_device_asked_for():
    rollouts = [_rollout([5, 6], [7, 8], [-0.1, -0.2]), _rollout([5], [9, 10, 11], [-1.0, -2.0, -3.0])]
    with default_device_meta():
        batch = collate(rollouts, PAD, device=torch.device("cpu"))
    expected = collate(rollouts, PAD)
    for name, tensor in vars(batch).items():
        if tensor is not None:
            assert tensor.device.type == "cpu", name
            assert torch.equal(tensor, getattr(expected, name)), name
    moved = batch.to(torch.device("meta"))
    assert {t.device.type for t in vars(moved).values() if t is not None} == {"meta"}
    assert batch.to(torch.device("cpu")) is batch, "a batch already there is not copied"


LEARNER_PATHS = {
    "defaults": dict(),
    "packed_chunked": dict(packing=True, share_prompts=False, logprob_chunk=4),
    "shared_budget_chunked": dict(packing=True, token_budget=40, logprob_chunk=3),
    "kl_entropy_micro": dict(kl_coef=0.5, entropy_coef=0.01, micro_batch_size=3),
    "kl_in_reward": dict(kl_coef=0.5, kl_in_reward=True),
    "critic_head": dict(critic="head"),
    "critic_model": dict(critic="model", packing=True, logprob_chunk=4),
    "stale_epochs_mini_batches": dict(off_policy="tis", ppo_epochs=2, mini_batches=2),
    "stale_one_update": dict(off_policy="decoupled"),
    "bf16": dict(bf16=True, packing=True),
}


def _learner_step(settings: dict, meta: bool):
    """Parameter change and metrics of one SGD(lr=1) step on a batch with shared prompts and
    identical rows, from a fresh model on CPU; with ``meta``, everything after building the
    model and the batch runs with the meta default device."""
    batch = _duplicate_batch(_model(), stale="off_policy" in settings)
    model = _model()
    with default_device_meta() if meta else nullcontext():
        return _step_from(model, batch, settings)


def _step_from(model, batch, settings: dict):
    learner = _learner(model, **settings)
    learner.version = 1
    if learner.reference is not None:
        with torch.no_grad():  # away from the reference, so that the KL term counts
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2), device=p.device))
    if learner.critic is not None:
        with torch.no_grad():
            learner.critic.head.weight.fill_(0.1)
        batch.values_BT = learner.values(batch)
        batch.returns_BT = (batch.advantages_BT + 1.0) * batch.loss_mask_BT
    penalty_BT = learner.reward_penalty(batch)
    if penalty_BT is not None:
        batch.advantages_BT = batch.advantages_BT - penalty_BT
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    metrics = learner.step(batch)
    return before - torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


@pytest.mark.parametrize("path", LEARNER_PATHS)
def test_a_learner_step_makes_every_tensor_on_the_models_device(path):
    expected, expected_metrics = _learner_step(LEARNER_PATHS[path], meta=False)
    change, metrics = _learner_step(LEARNER_PATHS[path], meta=True)
    assert change.device.type == "cpu"
    assert expected.abs().max() > 1e-4, "the step moves the weights"
    torch.testing.assert_close(change, expected, atol=0, rtol=0)
    assert metrics == expected_metrics


SAMPLER_PATHS = {
    "decoder_shared": dict(fast=True, share=True),
    "decoder_top_p_bf16": dict(fast=True, share=True, bf16=True),
    "preallocated_cache": dict(fast=False, share=True),
    "separate_rows": dict(fast=False, share=False),
}


@pytest.mark.parametrize("path", SAMPLER_PATHS)
def test_a_sampler_call_makes_every_tensor_on_the_models_device(tiny_policy, path):
    model, tokenizer = tiny_policy
    problems = [Problem(task="add", id=str(i), prompt=p, answer="0") for i, p in enumerate(["7+8\n", "123+45\n"])]
    top_p = 0.8 if "top_p" in path else 1.0
    params = SamplingParams(temperature=1.1, top_p=top_p, max_new_tokens=12, stop=("\n",))

    def sample():
        generator = HFGenerator(model, tokenizer, **SAMPLER_PATHS[path])
        assert generator.fast == SAMPLER_PATHS[path]["fast"]
        groups = generator.generate(problems, 4, params, generator=torch.Generator().manual_seed(3))
        return [(r.completion_ids, r.logprobs, r.finish_reason) for g in groups for r in g.rollouts]

    expected = sample()
    with default_device_meta():
        rollouts = sample()
    assert rollouts == expected
    assert all(type(value) is float for _, logprobs, _ in rollouts for value in logprobs)


X86_WITHOUT_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
X86_WITH_BF16 = X86_WITHOUT_BF16.replace("avx512bw", "avx512bw avx512_bf16")
X86_WITH_AMX = X86_WITHOUT_BF16.replace("avx512bw", "avx512bw amx_bf16 amx_tile")
ARM_WITHOUT_BF16 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 atomics\n"
ARM_WITH_BF16 = ARM_WITHOUT_BF16.replace("atomics", "atomics i8mm bf16")


def test_slow_bf16_names_the_settings_on_a_cpu_without_bf16_instructions():
    cpu, keys = torch.device("cpu"), ["rollout.bf16", "learner.bf16"]
    reason = slow_bf16(cpu, keys, X86_WITHOUT_BF16, "x86_64", "AVX512")
    assert "rollout.bf16 and learner.bf16 set" in reason
    assert "avx512_bf16 or amx_bf16" in reason and "AVX512" in reason
    assert reason.endswith("set rollout.bf16=false learner.bf16=false")
    assert "bf16 in /proc/cpuinfo" in slow_bf16(cpu, ["learner.bf16"], ARM_WITHOUT_BF16, "aarch64", "DEFAULT")


@pytest.mark.parametrize("device, keys, cpuinfo, machine", [
    ("cpu", ["learner.bf16"], X86_WITH_BF16, "x86_64"),
    ("cpu", ["learner.bf16"], X86_WITH_AMX, "x86_64"),
    ("cpu", ["rollout.bf16"], ARM_WITH_BF16, "aarch64"),
    ("cpu", [], X86_WITHOUT_BF16, "x86_64"),  # bf16 not asked for
    ("cuda", ["learner.bf16"], X86_WITHOUT_BF16, "x86_64"),  # the GPU computes it
    ("cpu", ["learner.bf16"], "", "riscv64"),  # cannot tell: no claim
])
def test_slow_bf16_says_nothing_where_bf16_is_native_or_unknown(device, keys, cpuinfo, machine):
    assert slow_bf16(torch.device(device), keys, cpuinfo, machine, "AVX512") is None


def test_the_run_warns_about_emulated_bf16_before_loading_the_model(monkeypatch, tmp_path):
    monkeypatch.setattr(device_module, "_read_cpuinfo", lambda: X86_WITHOUT_BF16)
    monkeypatch.setattr(device_module.platform, "machine", lambda: "x86_64")
    config = TrainConfig.model_validate({"model": {"path": str(tmp_path / "missing"), "device": "cpu"},
                                         "learner": {"bf16": True}, "run_dir": str(tmp_path / "run")})
    with pytest.warns(UserWarning, match="learner.bf16 set, but this CPU"), pytest.raises(ModelLoadError):
        build_run(config, progress=False, resume=False)


def test_model_device_auto_is_cuda_only_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="model.device=cuda: torch sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="model.device=cuda:2: torch sees 2 CUDA device"):
        resolve_device("cuda:2")
    with pytest.raises(ConfigError, match="model.device='tpu'"):
        load_config(None, ["model.device=tpu"])
