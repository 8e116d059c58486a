"""bench/stages.py's choices for a code config: what it measures and what it refuses."""

import json

import pytest

from tempering.tasks.code import CodeTask


def test_a_code_config_is_measured_greedily_beside_the_runs_own_table(bench_module, tmp_path):
    stages = bench_module("stages")
    task = stages.first_task("smollm2-code")
    assert isinstance(task, CodeTask) and task.style == "chat"
    assert stages.constant_answer_accuracy(task, 10) is None   # programs, not values
    summary = {"eval_before": {"per_task": {"code": 0.25}}, "eval_after": {"per_task": {"code": 0.5}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert stages.run_table(tmp_path, "code") == {"before": 0.25, "after": 0.5}
    metric = {"value": 0.25, "ci": [0.2, 0.3]}
    table = stages.table({"n": 0, "stages": {"base": {"greedy": metric}}})
    assert table.splitlines()[0] == "| stage | greedy |" and "25.0% [20, 30]" in table


def test_a_config_whose_first_task_is_not_chat_arithmetic_or_code_is_refused(bench_module):
    with pytest.raises(SystemExit, match="quickstart: the first task must be a chat-style add, sub, mul or code task"):
        bench_module("stages").first_task("quickstart")
