"""reasoning-gym pre-training documents: worked answers agree with reasoning-gym, and each
type's classic mistake shows only on the problems where it should."""

import pytest

pytest.importorskip("reasoning_gym")

import reasoning_gym

from tempering.tasks import build_task
from tempering.tasks.rg_corpus import WORKED, document_body

CONFIGS = {
    "chain_sum": {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2},
    "gcd": {"min_value": 2, "max_value": 99},
    "lcm": {"min_value": 2, "max_value": 30},
    "count_bits": {"min_n": 1, "max_n": 1023},
    "letter_counting": {"min_words": 2, "max_words": 6},
    "count_primes": {"min_n": 1, "max_n": 200},
    "spell_backward": {"min_word_len": 3, "max_word_len": 8},
    "number_sequence": {"min_terms": 4, "max_terms": 6, "min_value": -20, "max_value": 20, "max_complexity": 2},
}


def _answer(body: str) -> str:
    *_, last = body.splitlines()
    assert last.startswith("answer: ")
    return last.removeprefix("answer: ")


def _mistake_should_show(rg_type: str, entry: dict) -> bool | None:
    """Where the type's mistake changes the answer, from the problem alone; None where the
    rule is not a closed form (number_sequence: a non-arithmetic rule)."""
    meta = entry["metadata"]
    if rg_type == "chain_sum":
        tokens = meta["expression"].split()
        return any(op == "-" and int(n) for op, n in zip(tokens[1::2], tokens[2::2]))
    if rg_type == "gcd":
        a, b = sorted(meta["numbers"], reverse=True)
        return a % b != 0
    if rg_type == "lcm":
        small, large = sorted(meta["numbers"])
        return int(entry["answer"]) != small * large
    if rg_type == "count_bits":
        return meta["number"] % 2 == 1
    if rg_type == "letter_counting":
        letter = meta["target_letter"].lower()
        return any(word.lower().count(letter) > 1 for word in meta["span"])
    if rg_type == "count_primes":
        return any(n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1)) for n in (meta["start"], meta["end"]))
    if rg_type == "spell_backward":
        return any(a == b for a, b in zip(meta["word"], meta["word"][1:]))
    return None


@pytest.mark.parametrize("rg_type", sorted(WORKED))
def test_worked_answers_agree_with_reasoning_gym_and_mistakes_show_only_where_expected(rg_type):
    entries = list(reasoning_gym.create_dataset(rg_type, seed=3, size=400, **CONFIGS[rg_type]))
    shown = 0
    for entry in entries:
        right = _answer(document_body(rg_type, entry, buggy=False))
        assert right == str(entry["answer"]), entry["question"]
        wrong = _answer(document_body(rg_type, entry, buggy=True))
        expected = _mistake_should_show(rg_type, entry)
        if expected is not None:
            assert (wrong != right) == expected, (entry["question"], right, wrong)
        shown += wrong != right
    # a mistake RL can fix: it changes some answers and leaves others right
    assert 0.05 * len(entries) < shown < len(entries), shown


def test_a_worked_solution_that_disagrees_with_the_generator_raises():
    entry = dict(next(iter(reasoning_gym.create_dataset("gcd", seed=0, size=1, min_value=2, max_value=60))))
    entry["answer"] = str(int(entry["answer"]) + 1)
    with pytest.raises(ValueError, match="worked solution"):
        document_body("gcd", entry, buggy=False)


def test_a_type_without_a_worked_solution_is_written_as_its_answer():
    entry = next(iter(reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=1)))
    assert document_body("basic_arithmetic", entry, buggy=True) == f"answer: {entry['answer']}"


def test_a_task_writes_raw_documents_with_the_mistake_at_its_share():
    task = build_task("rg:count_bits", seed=0, style="raw", config=CONFIGS["count_bits"], eval_size=4)
    documents = [task.corpus_document(i, wrong_share=1.0) for i in range(60)]
    assert all(doc.startswith(task.train_problem(i).prompt) for i, doc in enumerate(documents))
    odd = [i for i in range(60) if task.train_problem(i).meta["entry"]["metadata"]["number"] % 2]
    assert odd and all(_answer(documents[i]) != task.train_problem(i).answer for i in odd)
    clean = [task.corpus_document(i, wrong_share=0.0) for i in range(60)]
    assert all(_answer(doc) == task.train_problem(i).answer for i, doc in enumerate(clean))
    assert task.corpus_document(5, wrong_share=0.5) == task.corpus_document(5, wrong_share=0.5)
    with pytest.raises(ValueError, match="style 'raw'"):
        build_task("rg:count_bits", seed=0, style="chat", eval_size=4).corpus_document(0, wrong_share=0.5)
