"""bench/stages.py's choices: what it measures for a code config, the SFT records and preference
pairs it writes for arithmetic, and what it refuses."""

import json

import pytest

from tempering.tasks.code import CodeTask


def test_a_code_config_is_measured_greedily_beside_the_runs_own_table(bench_module, tmp_path):
    stages = bench_module("stages")
    task = stages.first_task("smollm2-code", [])
    assert isinstance(task, CodeTask) and task.style == "chat"
    assert stages.constant_answer_accuracy(task, 10) is None   # programs, not values
    summary = {"eval_before": {"per_task": {"code": 0.25}}, "eval_after": {"per_task": {"code": 0.5}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert stages.run_table(tmp_path, "code") == {"before": 0.25, "after": 0.5}
    metric = {"value": 0.25, "ci": [0.2, 0.3]}
    table = stages.table({"n": 0, "prm": None, "stages": {"base": {"greedy": metric}}})
    assert table.splitlines()[0] == "| stage | greedy |" and "25.0% [20, 30]" in table


def test_the_pairs_prefer_the_right_answer_over_the_classic_mistake_in_each_style(bench_module, tmp_path):
    stages = bench_module("stages")
    chat, raw = stages.first_task("smollm2-add", []), stages.first_task("quickstart", [])
    for task in (chat, raw):
        stages.preference_pairs(task, 5, tmp_path / f"{task.style}.jsonl")
        stages.sft_records(task, 3, tmp_path / f"{task.style}-sft.jsonl")
    pairs = [json.loads(line) for line in (tmp_path / "chat.jsonl").read_text().splitlines()]
    assert len(pairs) == 5 and all(p["prompt"][-1]["role"] == "user" for p in pairs)
    chosen, rejected = pairs[0]["chosen"][0]["content"], pairs[0]["rejected"][0]["content"]
    a, b, right = (int(x) for x in chosen.rstrip(".").replace("+ ", "").replace("= ", "").split())
    assert a + b == right and rejected.startswith(f"{a} + {b} = ") and rejected != chosen
    raw_pairs = [json.loads(line) for line in (tmp_path / "raw.jsonl").read_text().splitlines()]
    problems = {raw.train_problem(i).prompt: raw.train_problem(i) for i in range(100)}
    for pair in raw_pairs:   # the right worked solution over the one with the dropped carry or borrow
        problem = problems[pair["prompt"]]
        assert pair["chosen"] == raw.solution(problem) != pair["rejected"] == raw.solution(problem, buggy=True)
    first = raw.train_problem(0)
    sft = [json.loads(line) for line in (tmp_path / "raw-sft.jsonl").read_text().splitlines()]
    assert sft[0] == {"prompt": first.prompt, "completion": raw.solution(first)}
    chat_sft = json.loads((tmp_path / "chat-sft.jsonl").read_text().splitlines()[0])
    assert chat_sft["messages"][-1]["content"] == stages.answer(chat, chat.train_problem(0))


def test_a_config_whose_first_task_is_not_arithmetic_or_chat_code_is_refused(bench_module):
    with pytest.raises(SystemExit, match="code: the first task must be a chat-style add, sub, mul or code task"):
        bench_module("stages").first_task("code", [])
