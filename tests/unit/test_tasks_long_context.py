"""Long-context tasks: the length in tokens, the facts that answer the question, the decoys, and the split."""

import json
import random
import re

import pytest

from tempering.build import build_tasks, scheduler_settings
from tempering.config import ConfigError, SchedulerConfig, load_config
from tempering.rewards import score
from tempering.scheduler import StaticMixture
from tempering.tasks import build_task
from tempering.tasks.long_context_facts import only_latest_totals
from tempering.types import Group, Rollout

KINDS = [("retrieval", {}), ("multihop", {"hops": 3}), ("consistency", {"parts": 4}),
         ("retrieval", {"value": "span", "updates": 2, "near_misses": 2}),
         ("multihop", {"order": "reversed", "updates": 1, "near_misses": 3}),
         ("consistency", {"updates": 3, "near_misses": 2})]


@pytest.mark.parametrize("length", [256, 4096])
def test_retrieval_documents_have_the_asked_length_and_hold_the_answer(length):
    task = build_task("long_context", seed=0, kind="retrieval", length_tokens=length, chars_per_token=1.0)
    problem = task.train_problem(0)
    assert 0.9 * length <= len(problem.prompt) <= length + 20
    assert f"The code of {problem.id.split(':')[0]} is {problem.answer}." in problem.prompt


def _follow_chain(prompt: str, hops: int) -> str:
    holder = re.search(r"whoever keeps the key of (\S+)\?", prompt).group(1)
    for _ in range(hops):
        holder = re.search(rf"(\S+) keeps the key of {re.escape(holder)}\.", prompt).group(1)
    return holder


def test_a_multihop_chain_leads_from_the_asked_name_to_the_answer():
    problem = build_task("long_context", seed=0, kind="multihop", hops=3, length_tokens=512).train_problem(5)
    assert f"The code of {_follow_chain(problem.prompt, 3)} is {problem.answer}." in problem.prompt


@pytest.mark.parametrize("length, options, slack", [(200, {}, 70),
                                                   (1000, {"kind": "consistency", "cite": "line", "updates": 1}, 90)])
def test_a_tokenizer_measures_the_length(tiny_policy, length, options, slack):
    _, tokenizer = tiny_policy
    path = tokenizer.name_or_path
    problem = build_task("long_context", seed=0, length_tokens=length, tokenizer=path, **options).train_problem(0)
    assert length - slack <= len(tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]) <= length  # a line


@pytest.mark.parametrize("kind, options", KINDS)
def test_training_and_held_out_questions_never_meet_and_repeat_exactly(kind, options):
    task = build_task("long_context", seed=0, kind=kind, length_tokens=1024, **options)
    held_out = {p.id for p in task.eval_problems(50)}
    trained = [task.train_problem(i) for i in range(200)]
    assert len(held_out) == 50 and not held_out & {p.id for p in trained}
    again = build_task("long_context", seed=0, kind=kind, length_tokens=1024, **options).train_problem(7)
    assert again == trained[7] and again.meta == trained[7].meta


@pytest.mark.parametrize("kind, options", KINDS)
def test_the_answer_is_stated_only_by_its_evidence_and_the_decoys_are_in_the_document(kind, options):
    for index in range(20):
        problem = build_task("long_context", seed=2, kind=kind, length_tokens=1024, **options).train_problem(index)
        sentences, evidence, decoys = (problem.meta[k] for k in ("sentences", "evidence", "decoys"))
        assert problem.prompt.startswith(" ".join(sentences))
        assert len(decoys) == options.get("near_misses", 0) + options.get("updates", 0)
        assert not set(evidence) & set(decoys)
        without = " ".join(s for i, s in enumerate(sentences) if i not in evidence)
        if kind != "consistency":  # one value answers: no other sentence states it
            assert f" {problem.answer}." not in f" {without}"
            assert len([i for i in evidence if sentences[i].endswith(f" {problem.answer}.")]) == 1


def test_a_stale_value_comes_first_and_the_latest_change_is_the_answer():
    task = build_task("long_context", seed=0, kind="retrieval", updates=2, near_misses=2, length_tokens=1024)
    for index in range(10):
        problem = task.train_problem(index)
        name = problem.id.split(":")[0]
        values = re.findall(rf"The code of {name} (?:is|was changed to) (\d+)\.", problem.prompt)
        assert len(values) == 3 and len(set(values)) == 3 and values[-1] == problem.answer
        assert "the latest statement holds" in problem.prompt
        # the near misses: the same name with another field, a name one digit away with the code
        assert re.search(rf"The room of {name} is \d+\.", problem.prompt)
        others = set(re.findall(r"The code of ([A-Z]{2}-\d{3}) is", problem.prompt)) - {name}
        assert len(others) == 1 and sum(a != b for a, b in zip(others.pop(), name)) == 1



def test_lenient_grading_reads_the_code_a_chat_model_states_in_a_sentence():
    """SmolLM2's habit: the code in a sentence, no ``answer:`` line. Strict grading scores it 0
    whatever it read; lenient grading scores the latest value 1 and the stale value 0."""
    strict, lenient = (build_task("long_context", seed=0, kind="retrieval", updates=1, length_tokens=512,
                                  style="chat", grading=grading) for grading in ("strict", "lenient"))
    for index in range(5):
        problem = lenient.train_problem(index)
        assert strict.train_problem(index).prompt == problem.prompt
        name = problem.id.split(":")[0]
        stale = re.search(rf"The code of {name} is (\d+)\.", problem.prompt[-1]["content"]).group(1)
        said = f"The code of {name} is {problem.answer}."
        assert score(problem, said, {"exact_match": 1.0})[0] == 1.0
        assert score(problem, f"The code of {name} is {stale}.", {"exact_match": 1.0})[0] == 0.0
        assert score(problem, f"{said}\nanswer: {stale}", {"exact_match": 1.0})[0] == 0.0
        assert score(strict.train_problem(index), said, {"exact_match": 1.0})[0] == 0.0


@pytest.mark.parametrize("order, rising", [("chain", True), ("reversed", False)])
def test_a_chain_is_stated_in_the_order_asked(order, rising):
    task = build_task("long_context", seed=0, kind="multihop", hops=4, order=order, near_misses=3, length_tokens=1024)
    for index in range(10):
        problem = task.train_problem(index)
        holder = re.search(r"whoever keeps the key of (\S+)\?", problem.prompt).group(1)
        positions = []
        for _ in range(4):
            found = re.search(rf"(\S+) keeps the key of {re.escape(holder)}\.", problem.prompt)
            positions.append(found.start())
            holder = found.group(1)
        assert positions == sorted(positions, reverse=not rising)
        assert f"The code of {holder} is {problem.answer}." in problem.prompt


def test_random_order_often_states_a_chain_out_of_its_order():
    task = build_task("long_context", seed=0, kind="multihop", hops=3, length_tokens=512)
    out_of_order = 0
    for index in range(20):
        problem = task.train_problem(index)
        sentences = problem.meta["sentences"]
        chain = [sentences[i] for i in problem.meta["evidence"] if "keeps the key" in sentences[i]]
        first = re.search(r"whoever keeps the key of (\S+)\?", problem.prompt).group(1)
        out_of_order += not chain[0].endswith(f"of {first}.")
    assert 5 <= out_of_order <= 19


def test_a_span_answer_is_three_words_graded_after_normalisation():
    task = build_task("long_context", seed=0, kind="retrieval", value="span", near_misses=2, length_tokens=512)
    problem = task.train_problem(0)
    assert task.metric == "match" and task.rewards == {"match": 1.0}
    assert len(problem.answer.split()) == 3 and f"The password of {problem.id.split(':')[0]}" in problem.prompt
    messy = "answer: " + "  ".join(problem.answer.upper().split()) + "."
    assert score(problem, messy, task.rewards)[0] == 1.0
    assert score(problem, "answer: " + " ".join(problem.answer.split()[:2]), task.rewards)[0] == 0.0


def _histories(prompt: str, name: str, loose: bool) -> dict[str, list[int]]:
    """Each delivery's counts in document order, the name read exactly or loosely (any digits)."""
    who = re.escape(name[:3]) + r"\d{3}" if loose else re.escape(name)
    found = [(m.start(), m.group(2), int(m.group(1)))
             for m in re.finditer(rf"{who} received a delivery of (\d+) boxes labelled (#\d+)\.", prompt)]
    found += [(m.start(), m.group(1), int(m.group(2)))
              for m in re.finditer(rf"The delivery to {who} labelled (#\d+) was recounted at (\d+) boxes\.", prompt)]
    histories: dict[str, list[int]] = {}
    for _, label, count in sorted(found):
        histories.setdefault(label, []).append(count)
    return histories


@pytest.mark.parametrize("parts, updates", [(3, 3), (8, 8)])
def test_a_consistent_total_needs_every_latest_count_and_the_exact_name(parts, updates):
    task = build_task("long_context", seed=0, kind="consistency", parts=parts, updates=updates, near_misses=2,
                      length_tokens=1024)
    for index in range(10):
        problem = task.train_problem(index)
        name = problem.id.split(":")[0]
        histories = list(_histories(problem.prompt, name, loose=False).values())
        assert sum(h[-1] for h in histories) == int(problem.answer)
        assert sum(h[0] for h in histories) != int(problem.answer)
        assert only_latest_totals(histories)  # no mix of stale and latest counts reaches the answer either
        assert sum(h[-1] for h in _histories(problem.prompt, name, loose=True).values()) != int(problem.answer)
        assert re.search(rf"{re.escape(name)} sent out \d+ boxes", problem.prompt)


def test_cite_by_line_numbers_the_document_one_sentence_a_line():
    task = build_task("long_context", seed=0, kind="multihop", cite="line", style="chat", length_tokens=512)
    problem = task.train_problem(0)
    text = problem.prompt[0]["content"]
    lines = text.splitlines()
    for i, sentence in enumerate(problem.meta["sentences"], 1):
        assert lines[i - 1] == f"[{i}] {sentence}"
    assert "cite: N" in text and text.endswith("End with a line 'answer: X'.")
    assert len(text) / 4 <= 512


def test_a_length_curriculum_draws_at_its_level_and_resumes_there():
    task = build_task("long_context", seed=0, lengths=[256, 1024], chars_per_token=1.0)
    assert task.levels == 2 and task.length_tokens == 256 and len(task.train_problem(0).prompt) <= 256 + 20
    short_eval = task.eval_problems(2)
    task.level = 1
    assert len(task.train_problem(1).prompt) > 900 and len(task.eval_problems(1)[0].prompt) > 900
    assert short_eval != task.eval_problems(2)
    resumed = build_task("long_context", seed=0, lengths=[256, 1024], chars_per_token=1.0)
    resumed.load_state_dict(json.loads(json.dumps(task.state_dict())))
    assert resumed.length_tokens == 1024 and resumed.train_problem(2) == task.train_problem(2)
    other = build_task("long_context", seed=0, lengths=[256, 2048], chars_per_token=1.0)
    with pytest.raises(ValueError, match=r"drew at lengths \[256, 1024\], this task at \[256, 2048\]"):
        other.load_state_dict(task.state_dict())
    assert build_task("long_context", seed=0, length_tokens=256).levels == 0


def test_a_corpus_document_answers_its_problem_or_with_its_wrong_share_a_decoys_value():
    task = build_task("long_context", seed=0, updates=1, near_misses=2, length_tokens=512, chars_per_token=1.0)
    for index in range(20):
        right, wrong = task.corpus_document(index, 0.0), task.corpus_document(index, 1.0)
        assert right.rsplit("answer: ", 1)[0] == wrong.rsplit("answer: ", 1)[0] and len(right) <= 512 + 14
        problem = task._draw(random.Random(f"0:long_context:{index}"), want_eval=False, length=512)
        decoys = [problem.meta["sentences"][i] for i in problem.meta["decoys"]]
        assert right.endswith(f"answer: {problem.answer}")
        assert any(d.endswith(f" {wrong.rsplit('answer: ', 1)[1]}.") for d in decoys)
    total = build_task("long_context", seed=0, kind="consistency", updates=2, length_tokens=512, chars_per_token=1.0)
    assert total.corpus_document(0, 1.0) == total.corpus_document(0, 0.0)


def test_corpus_docs_make_pre_training_a_length_curriculum():
    task = build_task("long_context", seed=0, lengths=[256, 1024], corpus_docs=[3, 2], chars_per_token=1.0)
    assert [task.corpus_length(i) for i in range(7)] == [256, 256, 256, 1024, 1024, 1024, 1024]
    assert len(task.corpus_document(0, 0.0)) < 300 and len(task.corpus_document(4, 0.0)) > 900
    assert build_task("long_context", seed=0, length_tokens=512).corpus_length(99) == 512


@pytest.mark.parametrize("options, message", [
    ({"kind": "summary"}, "kind must be one of 'retrieval', 'multihop', 'consistency', got 'summary'"),
    ({"order": "reversed"}, "order 'reversed' orders a chain: it needs kind 'multihop'"),
    ({"kind": "multihop", "order": "sideways"}, "order must be one of 'random', 'chain', 'reversed'"),
    ({"value": "word"}, "value must be 'number' or 'span', got 'word'"),
    ({"kind": "consistency", "value": "span"}, "kind 'consistency' answers a total: value must be 'number'"),
    ({"near_misses": -1}, "near_misses and updates must be 0 or more"),
    ({"kind": "consistency", "parts": 0}, "parts must be at least 1"),
    ({"kind": "consistency", "parts": 10, "updates": 7}, r"parts \+ updates must be at most 16 .* got 10 \+ 7"),
    ({"cite": "footnote"}, "cite must be one of 'none', 'quote', 'line'"),
    ({"lengths": [512, 256]}, r"lengths must rise from one level to the next, got \[512, 256\]"),
    ({"lengths": [16, 256]}, "lengths must be at least 32 tokens each"),
    ({"length_tokens": 256, "lengths": [256, 512]}, "give length_tokens .* or lengths .*, not both"),
    ({"kind": "multihop", "hops": 6, "near_misses": 6, "length_tokens": 64},
     "length_tokens=64 is too short: the question and its statements alone take about"),
    ({"near_misses": "many"}, r"options.near_misses='many': expected int"),
    ({"lengths": [256, 512], "corpus_docs": [10]}, r"one count of at least 1 per length, got \[10\]"),
    ({"grading": "loose"}, "grading must be 'strict' or 'lenient', got 'loose'"),
    ({"lengths": [256, 512], "read_at": [512]}, r"none of the trained \[256, 512\], got \[512\]"),
    ({"read_at": [2048, 2048]}, "read_at lists lengths .* none twice"),
    ({"read_at": [16]}, "each at least 32 tokens"),
    ({"grading": "lenient", "value": "span"}, "grading 'lenient' .* needs value 'number' and cite 'none'"),
    ({"grading": "lenient", "cite": "quote"}, "grading 'lenient' .* needs value 'number' and cite 'none'"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        build_task("long_context", seed=0, **options)


def test_a_bad_option_in_a_config_names_the_task_entry():
    config = load_config(None, ["tasks=[{name: add}, {name: long_context, options: {kind: consistency, value: span}}]"])
    with pytest.raises(ConfigError, match=r"tasks.1 \(long_context\): kind 'consistency' answers a total"):
        build_tasks(config)
    good = load_config(None, ["tasks=[{name: long_context, options: {kind: consistency, updates: 2, near_misses: 2, "
                              "cite: quote, length_tokens: 256}, rewards: {consistency: 1.0}}]"])
    task = build_tasks(good)[0]
    assert task.kind == "consistency" and task.rewards == {"consistency": 1.0}


def _step(mixture, window: int) -> dict:
    """One step of a reader that answers right when the prompt fits its ``window`` characters."""
    groups = []
    for problem in mixture.next_problems(4):
        text = f"answer: {problem.answer}" if len(problem.prompt) <= window else "answer: 0"
        x = score(problem, text, {"exact_match": 1.0})[0]
        groups.append(Group(problem, [Rollout(problem, [], [], [], text, "stop", 0, reward=x,
                                              reward_components={"exact_match": x}) for _ in range(4)]))
    mixture.observe(groups)
    return mixture.update()


def test_the_scheduler_raises_the_length_while_success_passes_the_threshold_and_resumes_there():
    settings = scheduler_settings(SchedulerConfig(promote_at=0.8, min_samples=16))
    build = lambda: build_task("long_context", seed=0, lengths=[128, 256, 512, 1024], chars_per_token=1.0)  # noqa: E731
    task = build()
    mixture = StaticMixture([task], [1.0], seed=0, settings=settings)
    records = [_step(mixture, window=300) for _ in range(6)]
    assert [r["domain/long_context/level"] for r in records] == [1, 2, 2, 2, 2, 2]  # 512 exceeds the window
    assert [r["domain/long_context/length_tokens"] for r in records] == [256, 512, 512, 512, 512, 512]
    assert task.length_tokens == 512 and all(400 < len(p.prompt) <= 512 for p in task.eval_problems(4))
    state = json.loads(json.dumps(mixture.state_dict()))
    resumed_task = build()
    resumed = StaticMixture([resumed_task], [1.0], seed=0, settings=settings)
    resumed.load_state_dict(state)
    assert resumed_task.length_tokens == 512 and resumed.next_problems(3) == mixture.next_problems(3)


def test_held_out_problems_at_each_length_are_the_same_at_any_level_and_leave_the_level_alone():
    task = build_task("long_context", seed=0, kind="multihop", lengths=[256, 512, 1024], chars_per_token=1.0)
    assert task.eval_lengths == [256, 512, 1024]
    at_start = {n: task.eval_problems_at(3, n) for n in task.eval_lengths}
    task.level = 2
    assert {n: task.eval_problems_at(3, n) for n in task.eval_lengths} == at_start and task.length_tokens == 1024
    for n, problems in at_start.items():
        assert all(n - 100 < len(p.prompt) <= n and p.meta["length_tokens"] == n for p in problems)
    assert task.eval_problems(3) == at_start[1024]  # the level's own held-out problems are the length's
    assert build_task("long_context", seed=0, length_tokens=256).eval_lengths == []


def test_read_at_lengths_are_evaluated_and_never_drawn_in_training():
    task = build_task("long_context", seed=0, lengths=[256, 512], read_at=[1024], chars_per_token=1.0)
    assert task.eval_lengths == [256, 512, 1024]
    assert all(len(p.prompt) <= 1024 and p.meta["length_tokens"] == 1024 for p in task.eval_problems_at(2, 1024))
    assert task.levels == 2, "read_at adds no curriculum level"
    task.level = 1
    assert {task.train_problem(i).meta["length_tokens"] for i in range(20)} == {512}
    one = build_task("long_context", seed=0, length_tokens=256, read_at=[512, 384], chars_per_token=1.0)
    assert one.eval_lengths == [256, 384, 512] and one.levels == 0
    assert one.eval_problems_at(3, 512) == task.eval_problems_at(3, 512), "held-out problems at a length are the task's"
