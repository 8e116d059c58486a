"""bench/tiny_long_copy.py's teacher-forced reading tells a model that reads the latest change
by position from one that looks the asked name up: with a decoy's change stated last, the first
answers with the decoy's value, the second stays right."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tempering import tiny_long
from tempering.models.tiny import build_tokenizer
from tempering.pretrain import document_ids
from tempering.tasks import build_task


class Reader:
    """A stand-in model that reads the answer out of the prompt's text: the value of the latest
    change stated (``by_name`` False) or of the latest change to the asked name; its logits put
    all weight on that value's digits where the answer's digits are predicted."""

    def __init__(self, tokenizer, by_name: bool):
        self.tokenizer, self.by_name = tokenizer, by_name

    def eval(self): ...

    def train(self): ...

    def __call__(self, input_ids):
        ids = input_ids[0].tolist()
        prompt = self.tokenizer.decode(ids, skip_special_tokens=True).rsplit("answer: ", 1)[0]
        asked = re.search(r"What is the code of (\S+)\?", prompt).group(1)
        changes = re.findall(r"code of (\S+) (?:is|was changed to) (\d{4})\.", prompt)
        value = [v for n, v in changes if n == asked or not self.by_name][-1]
        logits = torch.zeros(1, len(ids), len(self.tokenizer))
        for position, digit in zip(range(len(ids) - 5, len(ids) - 1), value):
            logits[0, position, self.tokenizer.convert_tokens_to_ids(digit)] = 1.0
        return SimpleNamespace(logits=logits)


@pytest.fixture
def bench(bench_module, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))   # its `report`
    return bench_module("tiny_long_copy")


@pytest.mark.parametrize("length", [256, 1024])
def test_a_decoy_stated_last_catches_the_reader_by_position_and_not_the_reader_by_name(bench, length):
    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    token_ids = lambda text: document_ids(text, vocab, tokenizer)
    spec = tiny_long.domains()[0]
    problems = build_task(spec.name, seed=0, **{**spec.options, "lengths": [length]}).eval_problems_at(6, length)
    by_position = bench.read(Reader(tokenizer, by_name=False), problems, token_ids)
    by_name = bench.read(Reader(tokenizer, by_name=True), problems, token_ids)
    assert by_position == {"digit_accuracy": 1.0, "whole_accuracy": 1.0, "first_digit_either": 1.0,
                           "decoy_last_whole": 0.0, "decoy_last_first_digit": 1.0}
    assert by_name == {**by_position, "decoy_last_whole": 1.0, "decoy_last_first_digit": 0.0}
