"""``temper sft``'s records: which tokens are answers, the errors a bad file gets, the split."""

import json

import pytest

from tempering.models.tiny import build_tokenizer
from tempering.tasks.dataset import DatasetError
from tempering.tasks.sft_records import encode_all, encode_record, load_split, plan_steps

TEMPLATE = ("{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
"""A chat template for the character tokenizer: one line per message, ``a:`` opening the answer."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _answer_text(tokenizer, example) -> str:
    return tokenizer.decode([t for t, m in zip(example.ids, example.answer_mask) if m], skip_special_tokens=False)


def test_a_prompt_completion_record_trains_on_the_completion_and_its_end(tokenizer):
    example = encode_record("f:1", {"prompt": "12+34\n", "completion": "answer: 46"}, tokenizer, False)
    prompt = tokenizer("12+34\n")["input_ids"]  # as the sampler encodes a raw prompt
    assert example.ids[: len(prompt)] == prompt
    assert example.answer_mask == [0] * len(prompt) + [1] * (len(example.ids) - len(prompt))
    assert _answer_text(tokenizer, example) == "answer: 46<eos>"


def test_chat_records_train_on_assistant_turns_only_with_the_template(tokenizer):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                           {"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}]}
    example = encode_record("f:1", record, tokenizer, True)
    assert tokenizer.decode(example.ids, skip_special_tokens=False).endswith("u:hi\na:yo\nu:q\na:ok\n")
    assert _answer_text(tokenizer, example) == "yo\nok\n", "each answer with its end-of-turn, nothing else"


@pytest.mark.parametrize("messages, message", [
    ([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "yo"}], r"f:1: the chat template cannot render messages\[:3\] \(no system turns\)"),
    ([{"role": "assistant", "content": "yo"}], r"f:1: the chat template cannot render messages\[:0\]"),
])
def test_a_conversation_the_template_refuses_is_named_with_its_line(messages, message):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{% if m.role == 'system' %}"
                               "{{ raise_exception('no system turns') }}{% endif %}{% endfor %}" + TEMPLATE)
    with pytest.raises(DatasetError, match=message):
        encode_record("f:1", {"messages": messages}, tokenizer, True)


def test_chat_records_without_a_template_are_lines_with_each_answer_ended(tokenizer):
    record = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"},
                           {"role": "assistant", "content": "4"}]}
    example = encode_record("f:1", record, tokenizer, False)
    assert tokenizer.decode(example.ids, skip_special_tokens=False) == "<bos>be brief\n2+2\n4<eos>"
    assert _answer_text(tokenizer, example) == "4<eos>"


@pytest.mark.parametrize("record, message", [
    ({"prompt": "1+1\n"}, "data.jsonl:3: field 'completion' is missing"),
    ({"completion": "2"}, "data.jsonl:3: field 'prompt' is missing"),
    ({"prompt": "1+1\n", "completion": "  "}, "data.jsonl:3: field 'completion' is an empty answer"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "data.jsonl:3: no assistant message"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
     r"data.jsonl:3: messages\[1\] is an empty assistant answer"),
    ({"messages": [{"role": "user"}]}, r"data.jsonl:3: messages\[0\] needs a 'role' and a text 'content'"),
    ([1, 2], "data.jsonl:3: a record must be a JSON object"),
])
def test_a_bad_record_is_named_with_its_line_and_what_is_wrong(tokenizer, record, message):
    with pytest.raises(DatasetError, match=message):
        encode_record("data.jsonl:3", record, tokenizer, False)


def test_over_long_records_are_refused_or_skipped(tokenizer):
    records = [("f:1", {"prompt": "1+1\n", "completion": "2"}), ("f:2", {"prompt": "9" * 50, "completion": "9"})]
    with pytest.raises(DatasetError, match=r"f:2: the record is 53 tokens, over sft.max_length=20"):
        encode_all(records, tokenizer, False, 20, "error")
    examples, skipped = encode_all(records, tokenizer, False, 20, "skip")
    assert [e.where for e in examples] == ["f:1"] and skipped == 1


def test_the_split_is_stable_by_prompt_and_an_eval_file_replaces_it(tmp_path):
    data = tmp_path / "data.jsonl"
    lines = [{"prompt": f"{i}+{i}\n", "completion": str(2 * i)} for i in range(200)]
    data.write_text("".join(json.dumps(r) + "\n" for r in lines + lines[:50]))
    train, held_out = load_split(str(data), None, 0.1)
    held_prompts = {r["prompt"] for _, r in held_out}
    assert 5 < len(held_prompts) < 40
    assert not held_prompts & {r["prompt"] for _, r in train}, "a repeated prompt stays on one side"
    assert load_split(str(data), None, 0.1) == (train, held_out)

    extra = tmp_path / "eval.jsonl"
    extra.write_text(json.dumps({"prompt": "x", "completion": "y"}) + "\n")
    train, held_out = load_split(str(data), str(extra), 0.1)
    assert len(train) == 250 and [w for w, _ in held_out] == [f"{extra}:1"]


def test_a_bad_line_is_named(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": \n')
    with pytest.raises(DatasetError, match=r"data.jsonl:2: not valid JSON"):
        load_split(str(data), None, 0.5)


def test_steps_hold_at_most_the_token_budget_and_cover_every_example_each_epoch():
    lengths = [3, 5, 2, 4, 9, 1]
    steps = plan_steps(lengths, 7, 2, seed=1)
    assert sorted(i for step in steps for i in step) == sorted(list(range(6)) * 2)
    assert all(sum(lengths[i] for i in step) <= 7 or len(step) == 1 for step in steps)
    assert plan_steps(lengths, 7, 2, seed=1) == steps
