"""``temper prm``: label -> train -> score on the miniature built-in model, and the commands'
errors.

The miniature model cannot do arithmetic (its answers are all wrong), but about three in four
of its solutions end with a well-formed ``answer: N`` line and the rest with a garbled one
(``anwer: 631``). So the task here is graded by the ``format`` reward: a step is good when
the solution can still end in a well-formed answer from it. Labels are estimated by the real
sampler, the PRM is the miniature model with a new head, trained for seconds; its held-out
step AUC is about 0.68 (0.58 with the untrained head), and a margin of 0.6 is asserted.
With the labels shuffled among the steps (the mutation tried) the AUC falls to about 0.5 and
the test fails. The claims on real arithmetic (AUC of at least 0.85, best-of-8 by the PRM
over majority vote) are measured on the real tiny model, as the handbook reports.
"""

import json

import pytest

from tempering.build import build_tasks
from tempering.cli import main
from tempering.config import TrainConfig
from tempering.eval.greedy import build_metrics
from tempering.eval.stats import roc_auc
from tempering.policy import load_model
from tempering.prm import PRMSettings, examples, read_labels, split, train_prm
from tempering.prm_label import LabelSettings, label
from tempering.rewards.process_model import ProcessModelReward
from tempering.rollout.engines import builtin_sampler
from tempering.types import Problem, Rollout

TRAIN = {"epochs": 20, "batch_size": 8, "lr": 1e-3, "heldout": 0.3, "target": "soft"}


@pytest.fixture(scope="module")
def labelled(tiny_model_dir, tmp_path_factory):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = TrainConfig.model_validate({"threads": 1, "pretrain": pretrain,
                                         "tasks": [{"name": "add", "options": {"metric": "format"}}]})
    model, tokenizer, _ = load_model(config, config.model.path, progress=False)
    tasks = build_tasks(config)
    out = tmp_path_factory.mktemp("prm") / "labels.jsonl"
    counts = label(builtin_sampler(config, model, tokenizer, 64), tasks, build_metrics(tasks), out,
                   LabelSettings(problems=40, solutions=4, continuations=1, max_new_tokens=48, model="mini"))
    return out, counts


@pytest.fixture(scope="module")
def trained(labelled, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("prm") / "model"
    return out, train_prm(read_labels(labelled[0]), out, PRMSettings(base=str(tiny_model_dir), **TRAIN))


def test_the_labels_hold_both_kinds_of_step(labelled):
    _, counts = labelled
    assert counts["problems"] == 40 and counts["solutions"] == 160 and counts["grader_errors"] == 0
    assert 0.6 <= counts["positive_share"] <= 0.95  # enough steps of each label to measure an AUC on


def test_the_trained_prm_separates_good_from_bad_steps(trained):
    _, report = trained
    held = report["heldout"]
    assert held["steps"] >= 80 and 0 < held["positive_share"] < 1
    assert held["step_auc"] >= 0.6, report
    assert held["step_accuracy"] >= held["positive_share"] - 0.05  # not worse than always saying "good"


def test_the_saved_prm_scores_as_the_report_says(trained, labelled):
    """The saved folder, loaded as the ``process_model`` reward, gives the held-out steps the
    values training measured its AUC on, and each aggregation reads them."""
    out, report = trained
    assert json.loads((out / "prm.json").read_text())["heldout"] == report["heldout"]
    reward = ProcessModelReward(path=str(out), aggregation="min", batch_size=7)
    _, heldout = split(examples(read_labels(labelled[0]), reward.tokenizer, 512), TRAIN["heldout"])
    held = {e.problem for e in heldout}
    rows = [r for r in read_labels(labelled[0]) if f"{r['task']}:{r['index']}" in held]
    problems = [Problem(task="add", id=str(r["index"]), prompt=r["prompt"], answer=r["answer"]) for r in rows]
    texts = ["\n".join(r["steps"]) for r in rows]
    values = reward.step_probs(problems, texts)
    assert roc_auc([v for vs in values for v in vs], [h for r in rows for h in r["hard"]]) == \
        pytest.approx(report["heldout"]["step_auc"], abs=1e-6)
    rollouts = [Rollout(p, [], [], [], t, "stop", 0) for p, t in zip(problems, texts)]
    assert [r.score for r in reward.score_batch(problems, rollouts)] == pytest.approx([min(v) for v in values])


def test_best_of_k_by_the_prm_in_evaluation(trained, tiny_model_dir):
    """``best_of@k[prm]`` beside pass@k: of one sample it is that sample (pass@1), of k it is
    one of the k, so never above pass@k."""
    from tempering.eval_model import run_evaluation, sampled_settings

    out, _ = trained
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    config = TrainConfig.model_validate({"threads": 1, "pretrain": pretrain, "tasks": [{"name": "add"}],
                                         "rewards": {"options": {"process_model": {"aggregation": "last"}}},
                                         "eval": {"problems_per_task": 4, "max_new_tokens": 32}})
    metrics = run_evaluation(config, None, sampled_settings(config, 3, [1, 3]), (False, {"prm": str(out)}))["metrics"]["add"]
    assert metrics["best_of@1[prm]"]["value"] == pytest.approx(metrics["pass@1"]["value"], abs=1e-9)
    assert metrics["best_of@3[prm]"]["value"] <= metrics["pass@3"]["value"] + 1e-9
    assert metrics["best_of@3[prm]"]["problems"] == 4


def test_the_commands_refuse_a_bad_file_or_option_with_exit_2(tmp_path, capsys):
    bad = tmp_path / "labels.jsonl"
    bad.write_text('{"steps": ["1+1=2"], "hard": [1]}\n')
    for argv, message in (
        (["prm", "train", str(tmp_path / "missing.jsonl")], "labels file"),
        (["prm", "train", str(bad)], "line 1: expected a record with lists steps, hard and soft of one length"),
        (["prm", "train", str(bad), "--heldout", "1.5"], "--heldout 1.5: the held-out share must be between 0 and 1"),
        (["prm", "label", "--problems", "0", "--out", str(tmp_path / "x.jsonl")], "--problems 0: must be at least 1"),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
        assert message in capsys.readouterr().err
