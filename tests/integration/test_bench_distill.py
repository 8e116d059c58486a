"""``bench/distill.py`` on miniature models: RL alone and distillation, each with its accuracy
curve at the evaluation steps, and the teacher's own accuracy."""

import json


def test_distill_bench_reports_both_curves_and_the_teacher(bench_module, tiny_model_dir):
    pretrain = json.loads((tiny_model_dir / "pretrain.json").read_text())["config"]
    sizes = {key: pretrain[key] for key in ("hidden_size", "layers", "heads", "steps", "batch_docs", "lr",
                                            "warmup_steps")}
    overrides = [f"pretrain.{key}={value}" for key, value in sizes.items()]
    overrides += [f"algorithm.teacher.pretrain.{key}={value}" for key, value in {**sizes, "seed": 1}.items()]
    overrides += ["threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                  "eval.problems_per_task=2", "eval.max_new_tokens=8", "checkpoint.every=0"]

    result = bench_module("distill").main(["--steps", "3", "--every", "2", *overrides])

    assert 0.0 <= result["teacher"]["accuracy"] <= 1.0
    assert set(result["runs"]) == {"rl", "distill"}
    for name, run in result["runs"].items():
        assert [point["step"] for point in run["curve"]] == [0, 2, 3]
        assert all(0.0 <= point["accuracy"] <= 1.0 for point in run["curve"])
        assert all(set(point["per_task"]) == {"add", "sub", "mul"} for point in run["curve"])
        assert run["curve"][0]["train_s"] == 0.0 < run["curve"][1]["train_s"] < run["curve"][2]["train_s"]
        assert len(run["teacher_kl"]) == (3 if name == "distill" else 0)
