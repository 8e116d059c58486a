"""The ``repo`` task's pre-training transcripts are the episodes ``env: repo`` makes.

A transcript replayed through the real episode runner and environment (their test runs in the
real sandbox) gives the very token ids pre-training trains on: a sampler that writes the
transcript's next characters up to the turn's stop string stands in for a model that has
learned it, and the runner lays out prompt, turns and observations as in training. The
transcripts' edits rebuild each instance's reference (or naive) patch exactly, and the
mistakes come at their shares.
"""

from __future__ import annotations

import random

import pytest
import torch

from tempering.config import EnvSpec
from tempering.envs.runner import EpisodeGenerator
from tempering.models.tiny import CHARACTERS, build_tokenizer
from tempering.pretrain import document_ids
from tempering.rewards.repo_patch import apply_patch
from tempering.rewards.repo_workspace import STOP, parse_call, replay
from tempering.rollout.base import SamplingParams
from tempering.tasks import build_task
from tempering.tasks.repo_corpus import Mistakes, episode_calls

ENV = {"guide": False, "max_output_chars": 160, "max_test_runs": 2, "sandbox": {"workers": 1}}
OPTIONS = {"families": ["inventory", "ledger", "scheduler"], "levels": [1, 2], "style": "raw", "corpus_env": ENV,
           "corpus_naive_share": 0.5, "corpus_untested_share": 0.3, "corpus_wrong_span_share": 0.2}


class TranscriptSampler:
    """Writes the transcript's next characters after each history (which must be a prefix of
    it) up to and with the first stop string: a model that has learned the transcript."""

    chat_template, context_length, batch_size = False, 0, 8

    def __init__(self, tokenizer, ids: list[int]):
        self.tokenizer, self.ids = tokenizer, ids

    def sample(self, prompts, params, generator=None):
        outputs = []
        for history in prompts:
            assert self.ids[: len(history)] == history, "the episode left the transcript"
            rest = self.tokenizer.decode(self.ids[len(history):], skip_special_tokens=True)
            end = min(rest.find(s) + len(s) for s in params.stop if s in rest)
            turn = self.ids[len(history): len(history) + end]
            outputs.append((turn, [0.0] * len(turn), "stop"))
        return outputs


@pytest.fixture(scope="module")
def task():
    return build_task("repo", seed=0, **OPTIONS)


def test_a_transcript_replayed_through_env_repo_is_the_same_token_ids(task):
    tokenizer = build_tokenizer()
    vocab = tokenizer.get_vocab()
    kinds = set()
    for index in range(8):
        document = task.corpus_document(index)
        assert set(document) <= set(CHARACTERS)
        ids = document_ids(document, vocab, tokenizer)[:-1]  # the end of document: no turn draws it
        runner = EpisodeGenerator(TranscriptSampler(tokenizer, ids),
                                  {"repo": EnvSpec(name="repo", options=ENV, max_turns=5)})
        problem = task.train_problem(index)
        [group] = runner.generate([problem], 1, SamplingParams(max_new_tokens=400), generator=torch.Generator())
        rollout = group.rollouts[0]
        assert rollout.prompt_ids + rollout.completion_ids == ids
        assert rollout.turns[-1].text == "<submit></submit>" and all(t.text.endswith(STOP) for t in rollout.turns)
        kinds.add(tuple(parse_call(t.text).tool for t in rollout.turns))
    assert ("read", "replace", "test", "submit") in kinds and ("read", "replace", "submit") in kinds


def test_the_transcripts_edits_make_the_reference_or_the_naive_patch_and_mistakes_come_at_their_shares(task):
    counts = {"level2": 0, "naive": 0, "untested": 0, "wrong_span": 0}
    n = 200
    for index in range(n):
        problem = task.train_problem(index)
        record = problem.meta["repo"]
        calls = episode_calls(problem, random.Random(f"corpus:0:repo:{index}"), task.mistakes)
        workspace = replay(record["files"], calls)
        naive = apply_patch(record["files"], record["meta"]["naive_patch"]) if "naive_patch" in record["meta"] else None
        counts["level2"] += problem.meta["level"] == 2
        if workspace.failed:
            counts["wrong_span"] += 1
            assert workspace.files == record["files"]
        elif workspace.files == naive:
            counts["naive"] += 1
        else:
            assert workspace.files == apply_patch(record["files"], record["patch"]), problem.id
        counts["untested"] += "<test></test>" not in calls
    assert 0.3 * n <= counts["level2"] <= 0.7 * n
    assert 0.3 <= counts["naive"] / (counts["level2"] * 0.8) <= 0.7, counts
    assert 0.2 <= counts["untested"] / n <= 0.4 and 0.1 <= counts["wrong_span"] / n <= 0.3, counts


@pytest.mark.parametrize("family", ["inventory", "ledger", "scheduler", "converter", "tokenizer", "config"])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_edit_calls_rebuild_every_defects_reference_patch(family, level):
    task = build_task("repo", seed=1, families=[family], levels=[level], style="raw")
    for index in range(4):
        problem = task.train_problem(index)
        record = problem.meta["repo"]
        calls = episode_calls(problem, random.Random(index), Mistakes(0.0, 0.0, 0.0))
        assert replay(record["files"], calls).files == apply_patch(record["files"], record["patch"]), problem.id
