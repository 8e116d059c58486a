"""User datasets: the three kinds, the split, and errors that name the file, line and field."""

import json

import pytest

from tempering.rewards import build_reward
from tempering.tasks import build_task
from tempering.tasks.dataset import DatasetError
from tempering.types import Rollout


def _write(tmp_path, records, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return str(path)


STDIO = {"kind": "stdio", "cases": [{"stdin": "", "stdout": "1\n"}]}


def _math_records(n):
    return [{"question": f"What is {i} + {i}?", "answer": 2 * i, "level": i % 3} for i in range(n)]


def test_a_math_dataset_splits_without_overlap_and_walks_every_training_record(tmp_path):
    task = build_task("dataset", seed=0, path=_write(tmp_path, _math_records(200)), kind="math")
    held_out = {p.prompt[0]["content"] for p in task.eval_problems(1000)}
    epoch = [task.train_problem(i) for i in range(task.size)]
    trained = {p.prompt[0]["content"] for p in epoch}
    assert 5 <= len(held_out) <= 40 and len(trained) == task.size == 200 - len(held_out)
    assert not held_out & trained
    assert epoch[0].meta["level"] == int(epoch[0].answer) // 2 % 3, "extra fields reach the reward"
    second = [task.train_problem(task.size + i).id for i in range(task.size)]
    assert sorted(second) == sorted(p.id for p in epoch) and second != [p.id for p in epoch]
    assert task.rewards == {"math": 1.0} and task.metric == "math"


def test_a_text_dataset_uses_the_named_reward(tmp_path):
    path = _write(tmp_path, [{"prompt": "Capital of France?", "answer": "Paris"}] * 3)
    task = build_task("dataset", seed=0, path=path, kind="text", reward="exact_match", eval_fraction=0)
    problem = task.train_problem(0)
    assert task.rewards == {"exact_match": 1.0} and task.metric == "exact_match"
    rollout = Rollout(problem, [], [], [], "answer: Paris", "stop", 0)
    assert build_reward("exact_match").score_batch([problem], [rollout])[0].score == 1.0


def test_a_code_dataset_carries_its_tests_to_the_code_reward(tmp_path):
    tests = {"kind": "call", "entry_point": "double", "cases": [{"args": [2], "expected": 4}]}
    task = build_task("dataset", seed=0, path=_write(tmp_path, [{"prompt": "Write double(x).", "tests": tests}]),
                      kind="code", eval_fraction=0)
    problem = task.train_problem(0)
    assert problem.meta["tests"] == tests and task.rewards == {"code": 1.0}


def test_parquet_files_read_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": None}]), path)
    with pytest.raises(DatasetError, match=r"data.parquet: row 1: field 'answer' is missing"):
        build_task("dataset", seed=0, path=str(path), kind="math")


@pytest.mark.parametrize("kind, records, message", [
    ("math", [_math_records(1)[0], "{not json"], r"data.jsonl:2: not valid JSON"),
    ("math", [_math_records(1)[0], {"question": "x?"}], r"data.jsonl:2: field 'answer' is missing"),
    ("math", [{"question": "", "answer": 1}], r"data.jsonl:1: field 'question' must be non-empty text"),
    ("math", [[1, 2]], r"data.jsonl:1: a record must be a JSON object, got list"),
    ("text", [{"prompt": "p", "answer": {"a": 1}}], r"data.jsonl:1: field 'answer' must be text or a number"),
    ("code", [{"prompt": "p", "tests": {"kind": "stdio", "cases": [{"stdin": "1"}]}}],
     r"data.jsonl:1: field 'tests': tests.cases\[0\] needs a string 'stdout'"),
    ("code", [{"prompt": "p", "tests": {"kind": "call", "cases": []}}],
     r"data.jsonl:1: field 'tests': 'tests.entry_point' must name a function"),
    ("code", [{"prompt": "p", "tests": {"kind": "stdio", "cases": [{"stdin": "\ud800", "stdout": "1"}]}}],
     r"data.jsonl:1: field 'tests': tests.cases\[0\].stdin must be UTF-8 text: it holds a lone surrogate"),
    # a code record's language and prefix are checked here, not dropped at every draw
    ("code", [{"prompt": "p", "tests": STDIO}, {"prompt": "q", "tests": STDIO, "language": "cobol"}],
     r"data.jsonl:2: field 'language' must name a language of the sandbox \(python, cpp, .*\), got 'cobol'"),
    ("code", [{"prompt": "p", "tests": STDIO, "language": 5}], r"data.jsonl:1: field 'language' must name a language"),
    ("code", [{"prompt": "p", "tests": STDIO, "code_prefix": ["def f():"]}],
     r"data.jsonl:1: field 'code_prefix' must be text \(the code the answer continues\), got list"),
    ("math", [_math_records(1)[0], {"question": "q", "answer": "Half of 8 is 4.\n####"}],
     r"data.jsonl:2: field 'answer' ends with '####' and nothing after it"),
    ("math", [_math_records(1)[0], '{"question": "q", "answer": ' + "[" * 200_000 + "]" * 200_000 + "}"],
     r"data.jsonl:2: nested too deeply to read"),
])
def test_malformed_records_name_file_line_and_field(tmp_path, kind, records, message):
    with pytest.raises(DatasetError, match=message):
        build_task("dataset", seed=0, path=_write(tmp_path, records), kind=kind)


def test_a_deep_json_array_file_names_the_file(tmp_path):
    path = tmp_path / "data.json"
    path.write_text('[{"question": "q", "answer": ' + "[" * 200_000 + "]" * 200_000 + "}]")
    with pytest.raises(DatasetError, match=r"data.json: nested too deeply to read"):
        build_task("dataset", seed=0, path=str(path), kind="math")


def test_a_code_record_in_an_installed_or_remote_language_is_read(tmp_path):
    records = [{"prompt": "p", "tests": STDIO, "language": "java", "code_prefix": "class Main {"}]
    problem = build_task("dataset", seed=0, path=_write(tmp_path, records), kind="code", eval_fraction=0).train_problem(0)
    assert problem.meta["language"] == "java" and problem.meta["code_prefix"] == "class Main {"


@pytest.mark.parametrize("options, message", [
    ({"path": "missing.jsonl"}, "missing.jsonl: no such file"),
    ({"path": "data.csv"}, "unknown format '.csv'"),
    ({}, "needs options.path"),
    ({"path": "x.jsonl", "kind": "essay"}, "kind must be one of math, code, text"),
])
def test_bad_options_are_refused(tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=message):
        build_task("dataset", seed=0, **options)
