"""Any Hugging Face causal LM folder trains and samples: tiny random models of several
architectures, saved with ``save_pretrained`` as a user's downloaded model would be.

Each architecture brings what the built-in Llama does not: Qwen2's sliding window on some
layers, Qwen3's query/key norms, Gemma's scaled and tied embeddings, Gemma 2's soft-capped
attention and logits (eager attention), Gemma 3's mix of sliding and full layers, GPT-NeoX's
parallel residual and partial rotary. They share the built-in model's character tokenizer,
and one Llama's tokenizer has no pad token at all.
"""

import json

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, GemmaConfig, GPTNeoXConfig,
                          LlamaConfig, Qwen2Config, Qwen3Config)

from tempering.config import PretrainConfig, TrainConfig
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate
from tempering.models.tiny import build_tokenizer
from tempering.policy import load_policy
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.train import train
from tempering.types import Problem

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256)
WINDOW = dict(sliding_window=4)  # shorter than every prompt with its completion, so the window matters
GEMMA = dict(head_dim=8, query_pre_attn_scalar=8, num_key_value_heads=2)
ARCHITECTURES = {
    "llama": lambda: LlamaConfig(num_key_value_heads=2, **SIZES),
    "llama_tied_no_pad": lambda: LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True, **SIZES),
    "qwen2_sliding": lambda: Qwen2Config(num_key_value_heads=2, use_sliding_window=True, max_window_layers=1,
                                         **WINDOW, **SIZES),
    "qwen3": lambda: Qwen3Config(num_key_value_heads=2, head_dim=8, **SIZES),
    "gemma": lambda: GemmaConfig(head_dim=8, num_key_value_heads=2, **SIZES),
    "gemma2": lambda: Gemma2Config(**GEMMA, **WINDOW, **SIZES),
    "gemma3": lambda: Gemma3TextConfig(**GEMMA, **WINDOW, layer_types=["sliding_attention", "full_attention"],
                                       **SIZES),
    "gpt_neox": lambda: GPTNeoXConfig(rotary_pct=0.5, **SIZES),
}
PROMPTS = ["7+8\n", "47+38\n", "123+456\n"]


def _problems():
    return [Problem(task="add", id=str(i), prompt=p, answer="0") for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """``model_dirs(name)``: a folder holding a randomly initialised model of that
    architecture and the built-in tokenizer, made once per module."""
    made = {}

    def make(name):
        if name not in made:
            tokenizer = build_tokenizer()
            if name.endswith("no_pad"):
                tokenizer.pad_token = None
            config = ARCHITECTURES[name]()
            config.vocab_size = len(tokenizer)
            config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
            config.pad_token_id = tokenizer.pad_token_id
            torch.manual_seed(0)
            folder = tmp_path_factory.mktemp(name)
            AutoModelForCausalLM.from_config(config).save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            made[name] = folder
        return made[name]

    return make


def _load(path):
    model, tokenizer, _ = load_policy(str(path), "float32", PretrainConfig(), progress=False)
    return model, tokenizer


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_sampled_log_probs_are_the_learners(model_dirs, name):
    model, tokenizer = _load(model_dirs(name))
    assert tokenizer.pad_token_id is not None
    groups = HFGenerator(model, tokenizer).generate(_problems(), 3, SamplingParams(max_new_tokens=16),
                                                     generator=torch.Generator().manual_seed(0))
    rollouts = [r for g in groups for r in g.rollouts]
    assert sum(len(r.completion_ids) for r in rollouts) > 2 * len(rollouts)
    batch = collate(rollouts, tokenizer.pad_token_id)
    with torch.no_grad():
        recomputed_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT)
    assert float(((recomputed_BT - batch.old_logprobs_BT) * batch.loss_mask_BT).abs().max()) < 1e-4


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_greedy_completion_does_not_depend_on_its_batch(model_dirs, name):
    """Left padding with explicit positions: a row batched with longer prompts decodes as alone,
    sliding windows included."""
    model, tokenizer = _load(model_dirs(name))
    generator = HFGenerator(model, tokenizer)
    generator.eos_ids = set()  # random weights end rows at random; the full length tests more
    params = SamplingParams(greedy=True, max_new_tokens=12)
    together = [g.rollouts[0] for g in generator.generate(_problems(), 1, params)]
    for problem, batched in zip(_problems(), together):
        alone = generator.generate([problem], 1, params)[0].rollouts[0]
        assert alone.completion_ids == batched.completion_ids
        assert alone.logprobs == pytest.approx(batched.logprobs, abs=1e-5)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_run_trains_the_folder_and_its_run_folder_loads_as_a_model(model_dirs, name, tmp_path):
    folder, run_dir = model_dirs(name), tmp_path / "run"
    config = TrainConfig.model_validate({
        "steps": 2, "threads": 1, "model": {"path": str(folder)},
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "learner": {"lr": 1e-2, "warmup_steps": 0},
        "algorithm": {"entropy_coef": 0.01},  # a gradient without rewards, which random weights never earn
        "eval": {"problems_per_task": 2, "max_new_tokens": 8}, "run_dir": str(run_dir)})
    summary = train(config, progress=False)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)

    trained, _ = _load(run_dir)  # a run folder as model.path: its newest checkpoint
    original, _ = _load(folder)
    final, _ = _load(summary["checkpoint"])
    changed = [n for n, p in trained.state_dict().items() if not torch.equal(p, original.state_dict()[n])]
    assert changed, "training moved some weights"
    for key, value in final.state_dict().items():
        assert torch.equal(value, trained.state_dict()[key]), key
