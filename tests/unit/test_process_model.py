"""The ``process_model`` reward: its token layout, its options, and scores that follow the
head's output at each step's last token (a fresh, untrained model: the numbers are the head's,
whatever they are; what is checked is where they are read and how they are combined)."""

import math

import pytest
import torch

from tempering.eval.stats import roc_auc
from tempering.models.tiny import build_model, build_tokenizer
from tempering.rewards import build_reward
from tempering.rewards.model import load_reward_model
from tempering.rewards.process_model import AGGREGATIONS, split_steps, step_logits, step_tokens
from tempering.types import Problem, Rollout


@pytest.fixture(scope="module")
def fresh_model_dir(tmp_path_factory):
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), 32, 1, 2, 128, 0, tokenizer.pad_token_id, tokenizer.bos_token_id,
                        tokenizer.eos_token_id)
    base, folder = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("fresh")
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    torch.manual_seed(0)
    model, tokenizer = load_reward_model(str(base), head="token")  # a new head, saved once: every load the same
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_each_step_ends_on_its_own_newline():
    tokenizer = build_tokenizer()
    ids, ends = step_tokens(tokenizer, "47+38\n", ["7+8=15", "4+3+1=8", "answer: 85"], 256)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert text == "47+38\n7+8=15\n4+3+1=8\nanswer: 85\n"
    assert [tokenizer.decode(ids[:end + 1], skip_special_tokens=True)[-8:] for end in ends] == \
        ["\n7+8=15\n", "4+3+1=8\n", "wer: 85\n"]
    cut_ids, cut_ends = step_tokens(tokenizer, "47+38\n", ["7+8=15", "4+3+1=8", "answer: 85"], 12)
    assert cut_ids == ids[-12:] and cut_ends == [end - (len(ids) - 12) for end in ends[1:]]


def test_the_reward_aggregates_the_head_at_the_step_ends(fresh_model_dir):
    problem = Problem(task="add", id="47+38", prompt="47+38\n", answer="85")
    texts = ["7+8=15\n4+3+1=8\nanswer: 85", "7+8=15\n\n4+3=7\nanswer: 75", ""]
    rollouts = [Rollout(problem, [], [], [], t, "stop", 0) for t in texts]
    model, tokenizer = load_reward_model(str(fresh_model_dir), head="token")
    model.eval()
    with torch.inference_mode():
        expected = [torch.sigmoid(logits).tolist() for logits in
                    step_logits(model, tokenizer, [step_tokens(tokenizer, "47+38\n", split_steps(t), 1024)
                                                   for t in texts[:2]])]
    for name, aggregate in AGGREGATIONS.items():
        reward = build_reward("process_model", {"path": str(fresh_model_dir), "aggregation": name, "batch_size": 1})
        scores = [r.score for r in reward.score_batch([problem] * 3, rollouts)]
        assert scores[:2] == pytest.approx([aggregate(p) for p in expected], abs=1e-5)
        assert scores[2] == 0.0  # no step
        assert all(0.0 <= s <= 1.0 for s in scores)
    assert not math.isclose(AGGREGATIONS["min"](expected[0]), AGGREGATIONS["mean"](expected[0]))


def test_a_gated_reward_pays_the_process_score_only_to_a_right_answer(fresh_model_dir):
    problem = Problem(task="add", id="47+38", prompt="47+38\n", answer="85")
    texts = ["7+8=15\n4+3+1=8\nanswer: 85", "7+8=15\n4+3=7\nanswer: 75"]
    rollouts = [Rollout(problem, [], [], [], t, "stop", 0) for t in texts]
    plain = build_reward("process_model", {"path": str(fresh_model_dir)}).score_batch([problem] * 2, rollouts)
    gated = build_reward("process_model", {"path": str(fresh_model_dir), "gate": "exact_match"}
                         ).score_batch([problem] * 2, rollouts)
    assert all(r.score > 0 for r in plain)
    assert gated[0].score == pytest.approx(plain[0].score) and gated[1].score == 0.0
    assert [r.diagnostics["gate"] for r in gated] == [1.0, 0.0]
    with pytest.raises(ValueError, match="no_such_reward"):
        build_reward("process_model", {"path": str(fresh_model_dir), "gate": "no_such_reward"})


def test_a_bad_option_names_itself(fresh_model_dir):
    with pytest.raises(ValueError, match="aggregation must be one of min, product, last, mean"):
        build_reward("process_model", {"path": str(fresh_model_dir), "aggregation": "max"})
    with pytest.raises(ValueError, match="needs the option 'path'"):
        build_reward("process_model", {})


def test_auc_counts_pairs_ordered_right():
    assert roc_auc([0.2, 0.9, 0.4, 0.1], [0, 1, 1, 0]) == 1.0
    assert roc_auc([0.9, 0.2, 0.4, 0.1], [0, 1, 1, 0]) == 0.5
    assert roc_auc([1, 2, 3], [1, 1, 1]) is None
