"""Datasets as users have them: chat prompts, column mappings, verl's and TRL's layouts,
GSM8K answers, JSON arrays and folders; bad records still named by file, record and field."""

import json

import pytest

from tempering.tasks import build_task
from tempering.tasks.dataset import DatasetError

CHAT = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2 + 3?"}]


def _jsonl(tmp_path, records, name="data.jsonl"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _task(path, **options):
    return build_task("dataset", seed=0, path=str(path), eval_fraction=0, **options)


def test_chat_message_prompts_stay_messages_and_drop_extra_keys(tmp_path):
    messages = [{**CHAT[0], "name": "rules"}, CHAT[1]]
    problem = _task(_jsonl(tmp_path, [{"messages": messages, "answer": 5}]), kind="math").train_problem(0)
    assert problem.prompt == CHAT and problem.answer == "5"
    assert "messages" not in problem.meta and problem.meta["answer"] == 5


def test_a_field_mapping_reads_any_column_names_nested_ones_too(tmp_path):
    records = [{"problem": "What is 6 * 7?", "meta": {"final": "42"}, "difficulty": 2}]
    problem = _task(_jsonl(tmp_path, records), kind="math",
                    fields={"prompt": "problem", "answer": "meta.final"}).train_problem(0)
    assert problem.prompt == [{"role": "user", "content": "What is 6 * 7?"}] and problem.answer == "42"
    assert problem.meta["difficulty"] == 2 and problem.meta["record"].endswith("data.jsonl:1")


def test_gsm8k_worked_answers_are_graded_on_the_number_after_the_marks(tmp_path):
    records = [{"question": "Natalia sold clips...", "answer": "She sold 48/2 = 24.\n48+24 = 72\n#### 1,072"}]
    problem = _task(_jsonl(tmp_path, records), kind="math").train_problem(0)
    assert problem.answer == "1072"
    assert problem.meta["answer"].endswith("#### 1,072"), "the worked solution stays for a reward that wants it"


def test_a_verl_parquet_file_is_read_as_it_is(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    row = {"data_source": "openai/gsm8k", "prompt": [CHAT[1]], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"split": "train", "index": 0}}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "train.parquet")
    problem = _task(tmp_path / "train.parquet", kind="math").train_problem(0)
    assert problem.prompt == [CHAT[1]] and problem.answer == "5"
    assert problem.meta["data_source"] == "openai/gsm8k" and problem.meta["extra_info"] == {"split": "train", "index": 0}
    assert problem.id == "train.parquet: row 0"


def test_a_saved_datasets_folder_and_its_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": f"Say {i}.", "solution": str(i)} for i in range(6)]
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:4]),
                                   "test": datasets.Dataset.from_list(rows[4:])})
    splits.save_to_disk(str(tmp_path / "saved"))
    task = build_task("dataset", seed=0, path=str(tmp_path / "saved"), kind="text", reward="m:f", eval_split="test")
    assert task.size == 4 and [p.meta["solution"] for p in task.eval_problems(9)] == ["4", "5"]
    assert task.train_problem(0).id.startswith("saved (train): row ")
    assert task.train_problem(0).answer == "", "a reward of one's own needs no answer column"
    with pytest.raises(DatasetError, match=r"saved: no split 'validation'; its splits: train, test \(options.split\)"):
        _task(tmp_path / "saved", kind="text", reward="m:f", split="validation")


def test_a_damaged_saved_folder_names_the_folder_or_the_arrow_file(tmp_path):
    """datasets' own errors name neither: a folder holding only state.json was a
    FileNotFoundError, a damaged .arrow file an ArrowInvalid about metadata bytes."""
    datasets = pytest.importorskip("datasets")
    (tmp_path / "lone").mkdir()
    (tmp_path / "lone" / "state.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"lone: not a folder datasets' save_to_disk wrote \(.*\); save it again"):
        _task(tmp_path / "lone", kind="math")
    datasets.Dataset.from_list([{"question": "1+1?", "answer": "2"}]).save_to_disk(str(tmp_path / "saved"))
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[:40])
    with pytest.raises(DatasetError, match=rf"{arrow}: not a readable Arrow file \(.*\); save the dataset again"):
        _task(tmp_path / "saved", kind="math")


def test_a_folder_of_data_files_reads_the_split_and_a_json_array(tmp_path):
    _jsonl(tmp_path / "hub", [{"question": "1+1?", "answer": 2}], "data/train-00000-of-00002.jsonl")
    (tmp_path / "hub" / "data" / "train-00001-of-00002.json").write_text(json.dumps([{"question": "2+2?", "answer": 4}]))
    _jsonl(tmp_path / "hub", [{"question": "3+3?", "answer": 6}], "data/test-00000-of-00001.jsonl")
    task = _task(tmp_path / "hub", kind="math")
    assert sorted(p.answer for p in task._train) == ["2", "4"]
    assert any(p.id == "train-00001-of-00002.json: record 0" for p in task._train)
    with pytest.raises(DatasetError, match=r"no .jsonl/.json/.parquet file whose name begins with the split 'dev'"):
        _task(tmp_path / "hub", kind="math", split="dev")


@pytest.mark.parametrize("record, options, message", [
    ({"messages": [CHAT[1], {"role": "assistant", "content": "5"}], "answer": 5}, {},
     r"data.jsonl:1: field 'messages' ends with an assistant message"),
    ({"prompt": [{"role": "user"}], "answer": 5}, {}, r"data.jsonl:1: field 'prompt': message 0 needs a 'role' and a text"),
    ({"prompt": [], "answer": 5}, {}, r"data.jsonl:1: field 'prompt' must be text or a non-empty list"),
    ({"problem": "x?", "answer": 1}, {"fields": {"prompt": "problem", "answer": "final"}},
     r"data.jsonl:1: field 'final' is missing; a math record needs prompt and answer \(options.fields.answer\)"),
    ({"text": "x?", "answer": 1}, {}, r"data.jsonl:1: field 'prompt' is missing; .* \(looked for prompt, question, messages"),
    ({"prompt": "x?", "answer": 1}, {"fields": {"solution": "answer"}}, r"fields.solution: not a field a dataset record has"),
])
def test_bad_records_and_mappings_name_the_file_line_and_field(tmp_path, record, options, message):
    with pytest.raises(ValueError, match=message):
        _task(_jsonl(tmp_path, [record]), kind="math", **options)
