"""``temper train`` on a verl-format parquet dataset and a TRL-format dataset folder, read as
they are, with reward functions written for those trainers: each function records what it
was given, and the test checks that the datasets' reward columns reached it.

Real components throughout: the miniature model, the HF sampler, the learner, the CLI in a
subprocess; the reward files are plain user modules beside the config.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

SMALL = {"steps": 2, "threads": 1, "checkpoint": {"every": 0},
         "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 12},
         "eval": {"problems_per_task": 2, "max_new_tokens": 12}, "learner": {"lr": 1e-3, "warmup_steps": 0}}

REWARDS = '''
import json

def compute_score(data_source, solution_str, ground_truth, extra_info=None, log=None):
    with open(log, "a") as f:
        f.write(json.dumps({"data_source": data_source, "ground_truth": ground_truth, "extra_info": extra_info,
                            "solution_str": solution_str}) + "\\n")
    return {"score": float(ground_truth in solution_str), "length": len(solution_str)}

def accuracy(prompts, completions, completion_ids, solution, level, log=None, **kwargs):
    with open(log, "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "solution": solution,
                            "level": level, "other": sorted(kwargs)}) + "\\n")
    return [float(s in c) for c, s in zip(completions, solution)]
'''


def _questions(start, count):
    return [(f"{a}+{a + 1}=", str(2 * a + 1)) for a in range(start, start + count)]


def _train(tmp_path, model_dir, cache, task, reward):
    log = tmp_path / "seen.jsonl"
    (tmp_path / "layout_rewards.py").write_text(textwrap.dedent(REWARDS))
    config = {**SMALL, "model": {"path": str(model_dir)},
              "tasks": [{"name": "dataset", "options": {**task, "kind": "text", "reward": reward}}],
              "rewards": {"options": {reward: {"log": str(log)}}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "TEMPERING_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "run.yaml", "--run-dir", "run", "--quiet"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["completion_tokens"] > 0 for s in steps)
    return steps, [json.loads(line) for line in log.read_text().splitlines()]


def test_temper_train_reads_a_verl_parquet_and_its_columns_reach_compute_score(tmp_path, tiny_model_dir,
                                                                               tempering_cache):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for split, start in (("train", 0), ("test", 50)):
        rows = [{"data_source": "arith/add", "ability": "math",
                 "prompt": [{"role": "user", "content": question}],
                 "reward_model": {"style": "rule", "ground_truth": answer},
                 "extra_info": {"split": split, "index": i}}
                for i, (question, answer) in enumerate(_questions(start, 8))]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{split}.parquet")

    reward = "verl:layout_rewards:compute_score"
    steps, seen = _train(tmp_path, tiny_model_dir, tempering_cache,
                         {"path": "train.parquet", "eval_path": "test.parquet"}, reward)

    answers = {answer for _, answer in _questions(0, 8) + _questions(50, 8)}
    assert {call["data_source"] for call in seen} == {"arith/add"}
    assert all(call["ground_truth"] in answers for call in seen)
    assert {call["extra_info"]["split"] for call in seen} == {"train", "test"}, "trained and evaluated"
    trained = [call for call in seen if call["extra_info"]["split"] == "train"]
    assert len(trained) == 2 * 2 * 2, "two steps of two prompts, two samples each"
    assert all(f"reward/{reward}/length" in step for step in steps), "the returned dict's numbers are logged"


def test_temper_train_reads_a_trl_dataset_folder_and_its_columns_reach_the_reward(tmp_path, tiny_model_dir,
                                                                                 tempering_cache):
    datasets = pytest.importorskip("datasets")
    splits = {split: datasets.Dataset.from_list([{"prompt": question, "solution": answer, "level": i % 3}
                                                 for i, (question, answer) in enumerate(_questions(start, 8))])
              for split, start in (("train", 0), ("test", 50))}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "trl_data"))

    steps, seen = _train(tmp_path, tiny_model_dir, tempering_cache,
                         {"path": "trl_data", "eval_split": "test", "style": "raw"}, "trl:layout_rewards:accuracy")

    by_prompt = {question: answer for question, answer in _questions(0, 8) + _questions(50, 8)}
    for call in seen:
        assert len(call["prompts"]) == len(call["completions"]) == len(call["solution"]) == len(call["level"])
        assert all(by_prompt[prompt.strip()] == answer for prompt, answer in zip(call["prompts"], call["solution"]))
        assert set(call["level"]) <= {0, 1, 2} and all(isinstance(c, str) for c in call["completions"])
        assert call["other"] == [], "no column beyond the dataset's own"
    assert sum(len(call["prompts"]) for call in seen) >= 2 * 2 * 2 + 2 * 2  # training, and the evaluations
    assert all(0 <= step["accuracy"] <= 1 for step in steps)
