"""bench/process_rewards.py's lucky fine-tuning records: right answers throughout, reached through
the classic mistake's steps at the share asked for."""

import json
from pathlib import Path

import pytest

from tempering.rewards.process import exact_steps
from tempering.tasks.arithmetic import ArithmeticTask


def graded(bench_module, tmp_path, share: float) -> list[tuple[float, float, bool]]:
    """Each record's (score, steps_right, whether the classic mistake shows on its problem)."""
    bench = bench_module("process_rewards")
    path = tmp_path / f"lucky-{share}.jsonl"
    bench.lucky_records(share, 200, path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 200 * len(bench.TASKS)
    tasks = {name: ArithmeticTask(name=name, seed=0, operation=name) for name in bench.TASKS}
    problems = {task.train_problem(i).prompt: task.train_problem(i) for task in tasks.values() for i in range(200)}
    found = []
    for record in records:
        problem = problems[record["prompt"]]
        task = tasks[problem.task]
        result = exact_steps(problem, record["completion"])
        shows = task.solution(problem, buggy=True) != task.solution(problem)
        found.append((result.score, result.components["steps_right"], shows))
    return found


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.mark.parametrize("share", [0.0, 0.9])
def test_every_record_has_the_right_answer_and_wrong_steps_at_the_share(bench_module, tmp_path, share):
    found = graded(bench_module, tmp_path, share)
    assert all(score == 1.0 for score, _, _ in found)
    assert all(right == 1.0 for _, right, shows in found if not shows)   # no mistake to make
    where = [right for _, right, shows in found if shows]
    wrong_share = 1 - sum(where) / len(where)
    assert len(where) > 150 and abs(wrong_share - share) < 0.06


def test_a_weight_sweep_reads_back_the_outcome_runs_and_keeps_each_weights_own(bench_module):
    name = bench_module("process_rewards").run_name
    assert name("outcome", 0.2, 1) == name("outcome", 0.5, 1) == "outcome-s1"
    assert name("prm", 0.5, 1) == "prm-s1"   # the folders of runs made before weights had their own
    assert len({name("prm", 0.2, 1), name("prm", 0.1, 1), name("prm", 0.5, 1), name("prm", 0.2, 2)}) == 4


def test_a_finished_fine_tuning_of_other_records_is_refused_not_reused(bench_module, tmp_path):
    bench = bench_module("process_rewards")
    (tmp_path / "lucky-sft").mkdir()
    (tmp_path / "lucky-sft" / "summary.json").write_text("{}")
    bench.lucky_records(0.5, 20, tmp_path / "lucky-sft.jsonl")
    same = bench.lucky_policy("base", 0.5, 20, tmp_path, "threads=1")  # the same records: read back, nothing run
    assert same == str(tmp_path / "lucky-sft" / "checkpoint-final")
    with pytest.raises(SystemExit, match="fine-tuned on other records"):
        bench.lucky_policy("base", 0.5, 20, tmp_path, "threads=1", tasks=("add", "sub"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lucky-sft", "lucky-sft.jsonl"]


def test_a_process_arm_on_some_tasks_pays_the_process_reward_there_alone_in_its_own_folders(bench_module):
    import yaml

    bench = bench_module("process_rewards")
    tasks = yaml.safe_load(bench.arm_overrides("prm", 0.5, "p", True, ("add", "sub", "mul"), ("add", "sub"))[0][6:])
    assert [("process_model" in t["rewards"], t["name"]) for t in tasks] == [(True, "add"), (True, "sub"), (False, "mul")]
    everywhere = yaml.safe_load(bench.arm_overrides("prm", 0.5, "p", True, ("add", "mul"))[0][6:])
    assert all("process_model" in t["rewards"] for t in everywhere)
    assert bench.run_name("prm", 0.5, 0, ("add", "sub")) not in (bench.run_name("prm", 0.5, 0), "outcome-s0")
    with pytest.raises(SystemExit, match="--process-tasks: 'mul' is not one of --tasks"):
        bench.main(["--tasks", "add,sub", "--process-tasks", "add,mul"])
