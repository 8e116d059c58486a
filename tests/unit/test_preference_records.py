"""``temper dpo``'s records: every layout read into prompt, chosen and rejected (or an unpaired
completion and its label), and a bad record named by file, line and field."""

import json

import pytest

from tempering.tasks import build_task
from tempering.tasks.preference_records import (
    PreferenceRecord,
    arithmetic_mistake_pairs,
    parse_record,
    read_preferences,
    sft_record,
    split,
    unpair,
)
from tempering.tasks.records import DatasetError

USER = {"role": "user", "content": "What is 2+2?"}
GOOD, BAD = {"role": "assistant", "content": "4"}, {"role": "assistant", "content": "5"}


@pytest.mark.parametrize("record, prompt, chosen, rejected", [
    ({"prompt": "2+2\n", "chosen": "answer: 4", "rejected": "answer: 5"}, "2+2\n", "answer: 4", "answer: 5"),
    ({"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]}, [USER], [GOOD], [BAD]),  # TRL conversational
    ({"prompt": [USER], "chosen": "4", "rejected": "5"}, [USER], "4", "5"),
    ({"chosen": "Q: 2+2? A: 4", "rejected": "Q: 2+2? A: 5"}, "Q: 2+2? A:", " 4", " 5"),  # TRL implicit text
    ({"chosen": [USER, GOOD], "rejected": [USER, BAD]}, [USER], [GOOD], [BAD]),  # implicit chat, OpenRLHF's keys
])
def test_every_paired_layout_gives_prompt_chosen_and_rejected(record, prompt, chosen, rejected):
    parsed = parse_record("f.jsonl:1", record)
    assert (parsed.prompt, parsed.chosen, parsed.rejected) == (prompt, chosen, rejected) and parsed.paired


@pytest.mark.parametrize("record", [{"prompt": "2+2\n", "completion": "answer: 4", "label": True},
                                    {"input": "2+2\n", "output": "answer: 4", "label": True}])
def test_unpaired_records_in_trls_and_openrlhfs_keys(record):
    parsed = parse_record("f.jsonl:1", record)
    assert (parsed.prompt, parsed.chosen, parsed.desirable, parsed.paired) == ("2+2\n", "answer: 4", True, False)


def test_a_pair_unpairs_into_a_desirable_and_an_undesirable_example():
    pair = PreferenceRecord("f:1", "p", "c", "r")
    assert [(r.chosen, r.desirable) for r in unpair([pair])] == [("c", True), ("r", False)]


@pytest.mark.parametrize("line, message", [
    ("not json", ":2: not valid JSON"),
    ('["a"]', ":2: a record must be a JSON object"),
    ('{"chosen": "a"}', ":2: field 'rejected' is missing"),
    ('{"prompt": "p", "chosen": 3, "rejected": "b"}', ":2: field 'chosen' must be text or a non-empty list"),
    ('{"prompt": "p", "chosen": "  ", "rejected": "b"}', ":2: field 'chosen' is empty"),
    ('{"prompt": "p", "chosen": [{"role": "assistant"}], "rejected": "b"}', ":2: chosen[0] needs a text 'role' and 'content'"),
    ('{"prompt": "p", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}', ":2: 'chosen' and 'rejected' must both be text"),
    ('{"chosen": "same", "rejected": "same"}', ":2: with no 'prompt' field, 'chosen' and 'rejected' must differ"),
    ('{"prompt": "p", "completion": "a", "label": "yes"}', ":2: field 'label' must be true (desirable) or false"),
    ('{"prompt": "p", "label": true}', ":2: field 'completion' is missing"),
])
def test_a_bad_record_is_named_by_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "1+1\n", "chosen": "answer: 2", "rejected": "answer: 3"}) + "\n" + line + "\n")
    with pytest.raises(DatasetError) as error:
        read_preferences(str(path))
    assert str(error.value).startswith(f"{path}{message}"), str(error.value)


def test_the_split_keeps_prompts_apart_and_needs_both_sides():
    records = [PreferenceRecord(f"f:{i}", f"{i}+1\n", "a", "b") for i in range(200)]
    train, heldout = split(records, None, 0.2)
    assert 20 < len(heldout) < 60 and not {r.prompt for r in train} & {r.prompt for r in heldout}
    with pytest.raises(DatasetError, match="no held-out records"):
        split(records[:1], None, 0.01)


def test_records_become_sft_records():
    assert sft_record("2+2\n", "answer: 4") == {"prompt": "2+2\n", "completion": "answer: 4"}
    assert sft_record([USER], [GOOD]) == {"messages": [USER, GOOD]}
    assert sft_record("What?", "4") == {"prompt": "What?", "completion": "4"}
    assert sft_record("What?", [GOOD]) == {"messages": [{"role": "user", "content": "What?"}, GOOD]}


def test_builtin_pairs_put_the_right_solution_over_the_classic_mistake():
    tasks = [build_task(op, seed=0, digits=[2]) for op in ("add", "sub", "mul")]
    pairs = arithmetic_mistake_pairs(tasks, 30)
    assert len(pairs) == 30 and {p.where.split(":")[2] for p in pairs} == {"add", "sub", "mul"}
    for pair in pairs:
        task = next(t for t in tasks if t.name == pair.where.split(":")[2])
        a, b = map(int, pair.prompt.strip().replace("+", " ").replace("-", " ").replace("*", " ").split())
        right = {"add": a + b, "sub": a - b, "mul": a * b}[task.name]
        assert pair.chosen.endswith(f"answer: {right}") and not pair.rejected.endswith(f"answer: {right}")
        assert not task._is_eval(a, b)  # a training problem, never a held-out one
