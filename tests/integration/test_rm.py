"""``temper rm``: pairs-file errors, Bradley–Terry training on the miniature built-in model,
and the trained model as the ``model`` reward in a short ``temper train`` run.

The miniature model is too small to tell correct from buggy arithmetic, so its reward model
learns a preference it can represent: a worked solution ending in its answer over the same
solution ending in "i do not know" (held-out accuracy about 0.2 before training, 1.0 after).
The arithmetic claim is the slow test at the end, on the real tiny model.
"""

import json

import pytest

from tempering.cli import build_parser
from tempering.config import TrainConfig
from tempering.rewards.model import ModelReward
from tempering.rewards.rm import (Pair, PairsError, RMSettings, arithmetic_pairs, read_pairs, split_pairs,
                                  train_reward_model)
from tempering.types import Problem, Rollout
from tempering.train import train


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not valid JSON"),
    ('["a", "b"]', "line 2: expected an object with 'chosen' and 'rejected'"),
    ('{"chosen": "a"}', "line 2: field 'rejected' must be a string"),
    ('{"chosen": 1, "rejected": "b"}', "line 2: field 'chosen' must be a string"),
    ('{"prompt": 5, "chosen": "a", "rejected": "b"}', "line 2: field 'prompt' must be text or a list of chat messages"),
])
def test_a_bad_pairs_line_is_named_by_file_line_and_field(tmp_path, line, message):
    path = _write(tmp_path / "pairs.jsonl", ['{"prompt": "1+1\\n", "chosen": "answer: 2", "rejected": "answer: 3"}', line])
    with pytest.raises(PairsError, match=f"pairs.jsonl, {message}"):
        read_pairs(path)


def test_the_command_exits_2_with_the_message(tmp_path, capsys):
    args = build_parser().parse_args(["rm", "train", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "rm")])
    assert args.func(args) == 2
    assert "temper rm train: pairs file" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


@pytest.mark.parametrize("argv, message", [
    (["/proc/nope/x.jsonl"], "cannot write /proc/nope/x.jsonl: No such file or directory"),
    (["{tmp}"], "cannot write {tmp}: Is a directory"),
    (["{tmp}/p.jsonl", "--count", "-1"], "--count -1: write at least 1 pair"),
    (["{tmp}/p.jsonl", "--count", "0"], "--count 0: write at least 1 pair"),
    (["{tmp}/p.jsonl", "--digits", "0"], "--digits 0: digits must be a non-empty list of sizes 1..6, got [0]"),
])
def test_pairs_refuses_a_bad_file_or_count_with_exit_2(tmp_path, capsys, argv, message):
    args = build_parser().parse_args(["rm", "pairs", *(a.format(tmp=tmp_path) for a in argv)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err == f"temper rm pairs: {message.format(tmp=tmp_path)}\n"
    assert not (tmp_path / "p.jsonl").exists()


def test_procedural_pairs_prefer_the_correct_worked_solution():
    rows = arithmetic_pairs(30, seed=1)
    assert len(rows) == 30
    for row in rows:
        assert row["chosen"] != row["rejected"]
        assert row["chosen"].splitlines()[-1].startswith("answer: ")


def unanswered(pair: Pair) -> Pair:
    """The pair with its rejected side replaced by the chosen solution without its answer."""
    return Pair(pair.prompt, pair.chosen, "\n".join(pair.chosen.splitlines()[:-1] + ["i do not know"]))


SETTINGS = {"epochs": 2, "batch_size": 16, "lr": 3e-3, "heldout": 0.3}


@pytest.fixture(scope="module")
def reward_model(tiny_model_dir, tmp_path_factory):
    pairs = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    args = build_parser().parse_args(["rm", "pairs", str(pairs), "--count", "96"])
    assert args.func(args) == 0
    out = tmp_path_factory.mktemp("rm") / "model"
    rows = [unanswered(pair) for pair in read_pairs(pairs)]
    return out, rows, train_reward_model(rows, out, RMSettings(base=str(tiny_model_dir), **SETTINGS))


def test_training_learns_the_preference_and_reports_its_heldout_accuracy(reward_model):
    out, rows, report = reward_model
    assert report["steps"] == SETTINGS["epochs"] * -(-report["train_pairs"] // 16)
    assert report["train_pairs"] + report["heldout_pairs"] == 96
    assert report["heldout_pairs"] >= 20
    assert report["heldout_accuracy"] >= 0.9
    assert report["heldout_accuracy"] >= report["heldout_accuracy_before"] + 0.5
    # the saved model, as the `model` reward scores them, ranks the held-out pairs as reported
    _, heldout = split_pairs(rows, SETTINGS["heldout"])
    reward = ModelReward(path=str(out), batch_size=5, transform="raw")
    problems = [Problem(task="add", id=str(i), prompt=p.prompt, answer="") for i, p in enumerate(heldout)]
    scores = {side: [r.score for r in reward.score_batch(problems, [Rollout(q, [1], [2], [0.0], getattr(p, side),
                                                                            "stop", 0)
                                                                    for q, p in zip(problems, heldout)])]
              for side in ("chosen", "rejected")}
    wins = sum(c > r for c, r in zip(scores["chosen"], scores["rejected"]))
    assert wins / len(heldout) == report["heldout_accuracy"]


def test_the_saved_model_loads_as_the_model_reward(reward_model):
    out, _, report = reward_model
    assert json.loads((out / "reward_model.json").read_text())["heldout_accuracy"] == report["heldout_accuracy"]
    reward = ModelReward(path=str(out), batch_size=4)
    problem = Problem(task="add", id="1+1", prompt="1+1\n", answer="2")
    rollouts = [Rollout(problem, [1], [2], [0.0], text, "stop", 0) for text in ("1+1=2\nanswer: 2", "answer: 3")] * 3
    scores = [r.score for r in reward.score_batch([problem] * 6, rollouts)]
    assert all(0.0 < s < 1.0 for s in scores)
    assert scores[0] == pytest.approx(scores[2]) and scores[1] == pytest.approx(scores[3])  # batching is neutral


def test_the_trained_model_works_as_the_model_reward_in_a_short_train_run(reward_model, tiny_model_dir, tmp_path):
    out, _, _ = reward_model
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = TrainConfig.model_validate({
        "steps": 2, "threads": 1, "run_dir": str(tmp_path / "run"), "pretrain": pretrain,
        "tasks": [{"name": "add", "rewards": {"model": 1.0}}],
        "rewards": {"options": {"model": {"path": str(out)}}},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 32},
        "eval": {"problems_per_task": 4, "max_new_tokens": 32},
    })
    train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        assert 0.0 < record["reward/model"] < 1.0
        assert "reward/exact_match" in record and "accuracy" in record   # the metric, at weight 0


@pytest.mark.slow
def test_the_real_tiny_model_learns_the_preference_well_above_chance(tmp_path):
    """What `temper rm pairs` and `temper rm train` do by default: 0.88 held-out accuracy
    (0.44 before) in about 7 CPU-minutes, plus pre-training the tiny model if not cached."""
    rows = arithmetic_pairs(3000)
    pairs = _write(tmp_path / "pairs.jsonl", [json.dumps(r) for r in rows])
    report = train_reward_model(read_pairs(pairs), tmp_path / "rm", RMSettings())
    assert report["heldout_accuracy"] >= 0.8
    assert report["heldout_accuracy"] > report["heldout_accuracy_before"] + 0.2


def test_a_missing_reward_model_is_a_config_error_before_any_run(tmp_path):
    from tempering.config import ConfigError
    from tempering.build import build_rewarder, build_tasks

    config = TrainConfig.model_validate({"tasks": [{"name": "add", "rewards": {"model": 1.0}}],
                                         "rewards": {"options": {"model": {"path": str(tmp_path / "none")}}}})
    with pytest.raises(ConfigError, match="rewards.options.model: reward model path .* does not exist"):
        build_rewarder(config, build_tasks(config))
