"""The start-up check of dataset prompts (``tempering.rollout.prompts.screen_datasets``): a
huge record is judged long from a bounded prefix, never tokenized whole, and a file whose
every record is long is one user error naming the first."""

import json

import pytest

from tempering.config import ConfigError
from tempering.models.tiny import build_tokenizer
from tempering.rollout.prompts import encode_prompt, longest_token, screen_datasets
from tempering.tasks import build_task

LIMIT = 248
HUGE = 30_000_000
"""Characters of the one huge record: tokenized whole it takes about 13 GB with this tokenizer."""


def _dataset(tmp_path, questions):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": 1}) + "\n" for q in questions))
    return build_task("dataset", seed=0, path=str(path), kind="math", style="raw", eval_path=str(path)), path


class BoundedEncoder:
    """The real tokenizer behind a guard that refuses (before tokenizing) any prompt longer
    than ``most`` characters, and remembers the longest it was given."""

    def __init__(self, tokenizer, most: int):
        self.tokenizer, self.most, self.longest = tokenizer, most, 0

    def __call__(self, prompt):
        assert isinstance(prompt, str), "style raw: prompts are text"
        self.longest = max(self.longest, len(prompt))
        assert len(prompt) <= self.most, f"the tokenizer was given a {len(prompt)}-character prompt"
        return encode_prompt(self.tokenizer, prompt, chat_template=False)


@pytest.mark.parametrize("mode", ["skip", "error"])
def test_a_huge_record_is_judged_long_from_a_bounded_prefix(tmp_path, mode):
    tokenizer = build_tokenizer()
    questions = [f"{i}+1=" for i in range(20)]
    questions[3] = "9" * HUGE
    task, path = _dataset(tmp_path, questions)
    chars = longest_token(tokenizer) * (LIMIT + 1)
    encode = BoundedEncoder(tokenizer, most=chars + 1)  # the raw style's newline after the question

    if mode == "error":
        with pytest.raises(ConfigError, match=rf"record {path}:4: the prompt is over the limit of {LIMIT} tokens"):
            screen_datasets([task], encode, LIMIT, mode, longest_token(tokenizer))
    else:
        screen_datasets([task], encode, LIMIT, mode, longest_token(tokenizer))
        assert task.size == 19 and all(len(problem.prompt) < 10 for problem in task.eval_problems(100))
    assert encode.longest == chars


def test_a_record_under_the_character_bound_is_counted_exactly(tmp_path):
    tokenizer = build_tokenizer()
    task, path = _dataset(tmp_path, ["1+1=", "9" * 300])
    with pytest.raises(ConfigError, match=rf"record {path}:2: the prompt is 302 tokens, over the limit of {LIMIT}"):
        screen_datasets([task], lambda p: encode_prompt(tokenizer, p, False), LIMIT, "error", longest_token(tokenizer))


@pytest.mark.parametrize("mode, expected", [
    ("error", "task dataset, record {path}:1: the prompt is 402 tokens, over the limit of 248 "),
    ("skip", "task dataset: rollout.long_prompts=skip: every training record would be left out (2, from {path}:1): "
             "their prompts are all over the limit of 248 tokens"),
])
def test_a_file_whose_every_record_is_long_names_the_first_and_the_limit(tmp_path, mode, expected):
    tokenizer = build_tokenizer()
    task, path = _dataset(tmp_path, ["8" * 400, "9" * 500])
    with pytest.raises(ConfigError) as refused:
        screen_datasets([task], lambda p: encode_prompt(tokenizer, p, False), LIMIT, mode, longest_token(tokenizer))
    assert str(refused.value).startswith(expected.format(path=path))


def test_the_longest_token_bounds_the_characters_of_any_token():
    tokenizer = build_tokenizer()
    assert longest_token(tokenizer) == len("<bos>")  # one character per token, and the special tokens
