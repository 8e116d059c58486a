"""``env: repo`` end to end: a real tiny model plays repository episodes through the episode
runner, its test runs in the real sandbox, and the ``repo`` reward grades the episodes in a
clean box; the learner's log-probs equal the sampler's on every model token.

The model is a tiny Llama over a byte-level BPE vocabulary, trained here for a few seconds to
play one episode of the ``stock`` instance: run the tests, fix ``remove``, run them again,
submit. It learns the episode as the runner builds it (each turn's tokens, then each
observation encoded alone), so that a sampled episode is played call by call by the
environment, not replayed from text.
"""

from __future__ import annotations

import pytest
import torch
from test_envs_tokens import check_bookkeeping, logprob_gap
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import repo_instances as R
from tempering.config import EnvSpec
from tempering.envs.repo import RepoEnv
from tempering.envs.runner import EpisodeGenerator
from tempering.rewards import Rewarder, TaskRewards
from tempering.rewards.repo_workspace import format_call
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator

TURNS = [format_call("test"), R.FIX_CALL, format_call("test"), format_call("submit")]
OPTIONS = {"guide": False}


def scripted(problem):
    """The scripted episode's observations, as the environment answers each turn."""
    env = RepoEnv(**OPTIONS)
    env.reset(problem)
    return [env.step(text).observation for text in TURNS]


def trained_policy(problem):
    """A tiny Llama that has learned the scripted episode token for token, as the runner lays it out."""
    observations = scripted(problem)
    texts = [problem.prompt, *TURNS, *[o for o in observations if o]]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id))
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = HFGenerator(model, tokenizer).encode_prompt(problem.prompt)
    for turn, observation in zip(TURNS, observations):
        ids += encode(turn) + (encode(observation) if observation else [tokenizer.eos_token_id])
    sequence = torch.tensor([ids])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=sequence, labels=sequence).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 2e-3:
            break
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def policy():
    return trained_policy(R.problem(R.stock_instance()))


def test_a_tiny_model_fixes_the_repository_through_the_runner_and_is_graded_in_a_clean_box(policy):
    model, tokenizer = policy
    problem = R.problem(R.stock_instance())
    runner = EpisodeGenerator(HFGenerator(model, tokenizer),
                              {"repo": EnvSpec(name="repo", options=OPTIONS, max_turns=6)})
    groups = runner.generate([problem], 2, SamplingParams(max_new_tokens=48),
                             generator=torch.Generator().manual_seed(0))
    rollouts = groups[0].rollouts
    check_bookkeeping(rollouts, tokenizer)
    assert logprob_gap(model, rollouts, tokenizer.pad_token_id) < 1e-4
    for rollout in rollouts:
        assert [turn.text for turn in rollout.turns] == TURNS, [turn.text for turn in rollout.turns]
        assert "2 passed" in rollout.turns[0].observation and "replaced in pkg/stock.py" in rollout.turns[1].observation
        assert rollout.turns[-1].observation_ids == []  # the submit ends the episode
    rewarder = Rewarder([TaskRewards("repo", {"repo": 1.0}, "repo")], options={"repo": {"workers": 1}})
    try:
        record = rewarder.score(groups)
    finally:
        rewarder.close()
    assert [r.reward for r in rollouts] == [1.0, 1.0]
    assert rollouts[0].reward_components["repo/fixed"] == 1.0 and rollouts[0].reward_components["repo/test_runs"] == 2.0
    assert record["env/test_runs"] == 2.0 and record["env/tool_calls"] == 4.0
