"""Long-context tasks: the length in tokens, the facts that answer the question, and the split."""

import re

import pytest

from tempering.tasks import build_task


@pytest.mark.parametrize("length", [256, 4096])
def test_retrieval_documents_have_the_asked_length_and_hold_the_answer(length):
    task = build_task("long_context", seed=0, kind="retrieval", length_tokens=length, chars_per_token=1.0)
    problem = task.train_problem(0)
    assert 0.9 * length <= len(problem.prompt) <= length + 20
    assert f"The code of {problem.id.split(':')[0]} is {problem.answer}." in problem.prompt


def test_a_multihop_chain_leads_from_the_asked_name_to_the_answer():
    problem = build_task("long_context", seed=0, kind="multihop", hops=3, length_tokens=512).train_problem(5)
    holder = re.search(r"whoever keeps the key of (\S+)\?", problem.prompt).group(1)
    for _ in range(3):
        holder = re.search(rf"(\S+) keeps the key of {re.escape(holder)}\.", problem.prompt).group(1)
    assert f"The code of {holder} is {problem.answer}." in problem.prompt


def test_a_tokenizer_measures_the_length(tiny_policy):
    _, tokenizer = tiny_policy
    path = tokenizer.name_or_path
    problem = build_task("long_context", seed=0, length_tokens=200, tokenizer=path).train_problem(0)
    assert 200 - 70 <= len(tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]) <= 200  # within a sentence


def test_training_and_held_out_questions_never_meet_and_repeat_exactly():
    task = build_task("long_context", seed=0, kind="multihop", length_tokens=128)
    held_out = {p.id for p in task.eval_problems(50)}
    trained = [task.train_problem(i) for i in range(200)]
    assert not held_out & {p.id for p in trained}
    assert build_task("long_context", seed=0, kind="multihop", length_tokens=128).train_problem(7) == trained[7]


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="kind must be 'retrieval' or 'multihop'"):
        build_task("long_context", seed=0, kind="summary")
