"""Token bookkeeping of multi-turn episodes: the learner trains on exactly what was sampled.

Over episodes on real models, the learner's recomputed log-probs (fp32) equal the sampler's
on every model-generated token, the environment's tokens carry loss weight 0 and are the
observation's own encoding, and a runner that re-tokenizes the history through text (what a
runner that keeps the conversation as text does) is caught by the same check.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tempering.config import EnvSpec
from tempering.envs import Step
from tempering.envs.runner import Episode, EpisodeGenerator
from tempering.learner.forward import token_logprobs
from tempering.learner.step import collate
from tempering.rollout.base import SamplingParams
from tempering.rollout.hf import HFGenerator
from tempering.types import Problem


class LineEnv:
    """Answers every line: alternately inline text and a user message; never done by itself."""

    def __init__(self, stop=("\n",), inline=True):
        self.stop, self.inline = tuple(stop), inline
        self.turn = 0

    def reset(self, problem):
        return problem.prompt

    def step(self, completion):
        self.turn += 1
        observation = f"<ok {self.turn}>" if self.inline and self.turn % 2 else [{"role": "user", "content": f"go on {self.turn}"}]
        return Step(observation=observation, rewards={"turn": 0.1}, info={"calls": 1})


ENV = f"{__name__}:LineEnv"


def problems(prompts):
    return [Problem(task="lines", id=str(i), prompt=p, answer="") for i, p in enumerate(prompts)]


def play(sampler, prompts, group_size=3, max_turns=4, max_new_tokens=12, options=None, seed=0):
    runner = EpisodeGenerator(sampler, {"lines": EnvSpec(name=ENV, options=options or {}, max_turns=max_turns)})
    groups = runner.generate(problems(prompts), group_size, SamplingParams(max_new_tokens=max_new_tokens),
                             generator=torch.Generator().manual_seed(seed))
    return [r for g in groups for r in g.rollouts]


def logprob_gap(model, rollouts, pad_id) -> float:
    """Largest |learner log-prob - sampler log-prob| over the trained tokens, fp32."""
    batch = collate(rollouts, pad_id)
    with torch.no_grad():
        recomputed_BT, _ = token_logprobs(model, batch.input_ids_BT, batch.attention_mask_BT)
    return float(((recomputed_BT - batch.old_logprobs_BT) * batch.loss_mask_BT).abs().max())


def check_bookkeeping(rollouts, tokenizer):
    """Turns tile the completion: model tokens trained, observation tokens not, in order."""
    for rollout in rollouts:
        position = 0
        for turn in rollout.turns:
            assert turn.start == position
            assert rollout.loss_mask[turn.start:turn.end] == [1] * (turn.end - turn.start)
            assert tokenizer.decode(rollout.completion_ids[turn.start:turn.end], skip_special_tokens=True) == turn.text
            observed = rollout.completion_ids[turn.end:turn.end + len(turn.observation_ids)]
            assert observed == turn.observation_ids
            assert rollout.loss_mask[turn.end:turn.end + len(observed)] == [0] * len(observed)
            assert rollout.logprobs[turn.end:turn.end + len(observed)] == [0.0] * len(observed)
            position = turn.end + len(observed)
        assert position == len(rollout.completion_ids)
        assert rollout.text == rollout.turns[-1].text


def test_multi_turn_log_probs_are_the_learners_raw_text(tiny_policy):
    model, tokenizer = tiny_policy
    rollouts = play(HFGenerator(model, tokenizer), ["47+38\n", "52-17\n", "47*6\n"], max_new_tokens=24)
    assert sum(len(r.turns) for r in rollouts) > 2 * len(rollouts)  # most episodes ran several turns
    check_bookkeeping(rollouts, tokenizer)
    inline = [t for r in rollouts for t in r.turns if isinstance(t.observation, str)]
    assert inline and all(t.observation_ids == tokenizer(t.observation, add_special_tokens=False)["input_ids"]
                          for t in inline)
    messages = [t for r in rollouts for t in r.turns if isinstance(t.observation, list)]
    assert messages and all(  # a message starts on a line of its own (a turn ends at "\n" or end-of-sequence)
        tokenizer.decode(t.observation_ids) == ("" if t.text.endswith("\n") else "\n") + t.observation[0]["content"] + "\n"
        for t in messages)
    assert logprob_gap(model, rollouts, tokenizer.pad_token_id) < 1e-4


CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def test_chat_turns_are_the_template_rendering_of_the_conversation(tiny_policy):
    """With a chat template, a model turn is closed and the next opened exactly as the template
    renders the whole conversation (the character tokenizer encodes text one way only, so the
    rendering can be compared token for token)."""
    model, tokenizer = tiny_policy
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    sampler = HFGenerator(model, chat, chat_template=True)
    prompts = [[{"role": "user", "content": "47+38"}], [{"role": "user", "content": "52-17"}]]
    rollouts = play(sampler, prompts, max_new_tokens=16, options={"stop": ["\n", "="], "inline": False})
    check_bookkeeping(rollouts, chat)
    assert logprob_gap(model, rollouts, chat.pad_token_id) < 1e-4
    compared = 0
    for rollout in rollouts:
        turns = rollout.turns
        conversation = list(rollout.problem.prompt)
        for turn in turns[:-1]:
            conversation += [{"role": "assistant", "content": turn.text}, *turn.observation]
        rendered = chat.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        sequence = chat.decode(rollout.prompt_ids + rollout.completion_ids[:turns[-1].start])
        assert sequence == rendered
        compared += len(turns) > 1
    assert compared  # some episodes had a message observation after a turn the model ended by itself


def bpe_policy():
    """A random tiny Llama over a byte-level BPE vocabulary, where a text round trip merges
    tokens the model drew apart."""
    texts = [f"{a}+{b}={a + b}\n{a}*{b}={a * b}\n" for a in range(10, 99, 3) for b in range(2, 40, 7)]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def bpe():
    return bpe_policy()


DIGITS = {"stop": list("0123456789")}


def test_multi_turn_log_probs_are_the_learners_bpe(bpe):
    model, tokenizer = bpe
    rollouts = play(HFGenerator(model, tokenizer), ["47+38=", "12*3="], group_size=4, max_turns=5,
                    max_new_tokens=10, options=DIGITS)
    assert sum(len(r.turns) for r in rollouts) > 2 * len(rollouts)
    check_bookkeeping(rollouts, tokenizer)
    assert logprob_gap(model, rollouts, tokenizer.pad_token_id) < 1e-4


def test_a_runner_that_retokenizes_earlier_turns_is_caught(bpe, monkeypatch):
    """The mutation: after every addition the history goes through text and back, as in a runner
    that keeps the conversation as text and renders it again for each turn."""
    model, tokenizer = bpe
    add = Episode.add

    def retokenizing_add(self, ids, logprobs, trained):
        add(self, ids, logprobs, trained)
        self.ids = tokenizer(tokenizer.decode(self.ids), add_special_tokens=False)["input_ids"]
        n = len(self.ids)
        self.logprobs, self.mask = (self.logprobs + [0.0] * n)[:n], (self.mask + [1] * n)[:n]

    monkeypatch.setattr(Episode, "add", retokenizing_add)
    rollouts = play(HFGenerator(model, tokenizer), ["47+38=", "12*3="], group_size=4, max_turns=5,
                    max_new_tokens=10, options=DIGITS)
    assert logprob_gap(model, rollouts, tokenizer.pad_token_id) > 1e-2
