"""Partial rollouts over requests (``tempering.rollout.requests``): a completion drawn in two
chunks, the second a request of its own, is joined as one; a stop string that begins in the
first chunk and ends in the second ends it there, as one request would have stopped. The engine
is scripted (``_complete_all`` answers canned completions), the tokenizer one id per character."""

from __future__ import annotations

from tempering.rollout.base import SamplingParams
from tempering.rollout.requests import RequestSampler
from tempering.types import Problem


class Characters:
    """One token per character: id = code point."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


class Scripted(RequestSampler):
    """Answers the round's first requests with ``first`` and the continuations with ``rest``
    (text, finish reason), each token's log-prob -0.1 in the first chunk and -0.2 after; the
    weights change between the two (version 1)."""

    chat_template, context_length, partial_chunk = False, 0, 3

    def __init__(self, first: tuple[str, str], rest: tuple[str, str]):
        self.tokenizer, self.answers, self.calls = Characters(), [first, rest], []
        self.updates = lambda steps: 1

    def _complete_all(self, prompts, n, params, seeds):
        self.calls.append(params.max_new_tokens)
        text, reason = self.answers[len(self.calls) - 1]
        logprob = -0.1 if len(self.calls) == 1 else -0.2
        return [[([ord(c) for c in text], [logprob] * len(text), reason)] * n for _ in prompts]


def rollout(first: tuple[str, str], rest: tuple[str, str], stop: tuple[str, ...]):
    sampler = Scripted(first, rest)
    params = SamplingParams(max_new_tokens=7, stop=stop)
    (group,) = sampler.generate([Problem(task="t", id="0", prompt="p", answer="")], 1, params, policy_version=0)
    assert sampler.calls == [3, 4], "a chunk of 3 tokens, then the 4 left"
    return group.rollouts[0]


def test_a_stop_string_across_the_two_chunks_ends_the_completion_where_it_ends():
    done = rollout(("ab\n", "length"), ("\ncde", "length"), stop=("\n\n",))
    assert done.text == "ab\n\n" and done.finish_reason == "stop"
    assert done.logprobs == [-0.1] * 3 + [-0.2] and done.token_versions == [0, 0, 0, 1]


def test_a_longer_stop_string_split_after_its_second_character():
    done = rollout(("xEN", "length"), ("Dyz", "length"), stop=("STOP", "END"))
    assert (done.text, done.finish_reason, len(done.logprobs)) == ("xEND", "stop", 4)


def test_without_a_stop_string_across_the_chunks_the_completion_is_both_chunks():
    assert rollout(("ab\n", "length"), ("c\n\n", "stop"), stop=("\n\n",)).text == "ab\nc\n\n"
    done = rollout(("abc", "length"), ("defg", "length"), stop=("\n\n",))
    assert (done.text, done.finish_reason, done.token_versions) == ("abcdefg", "length", [0, 0, 0, 1, 1, 1, 1])


def test_min_tokens_keeps_a_stop_string_that_ends_too_early():
    sampler = Scripted(("ab\n", "length"), ("\ncde", "length"))
    params = SamplingParams(max_new_tokens=7, stop=("\n\n",), min_tokens=5)
    (group,) = sampler.generate([Problem(task="t", id="0", prompt="p", answer="")], 1, params, policy_version=0)
    assert group.rollouts[0].text == "ab\n\ncde"


def test_a_stop_string_the_first_chunk_holds_whole_under_min_tokens_does_not_end_it_at_the_join():
    sampler = Scripted(("a\n\n", "length"), ("bcde", "length"))
    params = SamplingParams(max_new_tokens=7, stop=("\n\n",), min_tokens=5)
    (group,) = sampler.generate([Problem(task="t", id="0", prompt="p", answer="")], 1, params, policy_version=0)
    assert group.rollouts[0].text == "a\n\nbcde"
