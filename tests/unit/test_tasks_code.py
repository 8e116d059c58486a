"""The procedural code task: families, hidden tests, the held-out split and the corpus."""

from __future__ import annotations

import collections
import itertools
import json

import pytest

from tempering.build import build_tasks
from tempering.config import builtin_config, load_config
from tempering.models.tiny import build_tokenizer
from tempering.pretrain import corpus, document_ids
from tempering.tasks import build_task
from tempering.tasks.code import TURN_END, CodeTask
from tempering.tasks.code_families import FAMILIES, FAMILY_BY_NAME, KINDS, reference, run_reference


@pytest.fixture(scope="module")
def task() -> CodeTask:
    return build_task("code", seed=0, levels=[1, 2, 3])


def test_there_are_at_least_30_families_over_every_kind():
    kinds = collections.Counter(f.kind for f in FAMILIES)
    assert len(FAMILIES) >= 30
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 3


def test_every_problem_has_at_least_8_distinct_hidden_cases_with_edge_cases_first(task):
    for index in range(600):
        problem = task.train_problem(index)
        family = next(f for f in FAMILIES if f.name == problem.meta["family"])
        cases = problem.meta["tests"]["cases"]
        assert len(cases) >= 8, (family.name, problem.meta["params"], len(cases))
        assert len({json.dumps(c["args"]) for c in cases}) == len(cases)
        edges = [json.dumps(a) for a in family.edges(problem.meta["params"])]
        assert [json.dumps(c["args"]) for c in cases[: len(set(edges))]] == list(dict.fromkeys(edges))


def test_each_bug_fails_a_hidden_case_of_some_problem_and_the_reference_passes_all(task):
    """The classic bugs are real bugs, told apart by the hidden tests (not on every problem:
    ``xs[-k:]`` is right unless k is 0, as a dropped carry is harmless without a carry)."""
    caught = collections.defaultdict(set)
    for index in range(3000):
        problem = task.train_problem(index)
        family = next(f for f in FAMILIES if f.name == problem.meta["family"])
        params, cases = problem.meta["params"], problem.meta["tests"]["cases"]
        right = reference(family, params)
        assert all(run_reference(right, c["args"]) == (True, c["expected"]) for c in cases)
        for bug in range(len(family.bugs)):
            wrong = reference(family, params, bug)
            if any(run_reference(wrong, c["args"]) != (True, c["expected"]) for c in cases):
                caught[family.name].add(bug)
    for family in FAMILIES:
        assert caught[family.name] == set(range(len(family.bugs))), family.name
    assert sum(bool(f.bugs) for f in FAMILIES) >= 30


def test_held_out_problems_are_disjoint_from_training_problems_and_cover_every_family(task):
    train = {(p.meta["family"], json.dumps(p.meta["params"], sort_keys=True))
             for p in (task.train_problem(i) for i in range(5000))}
    held_out = task.eval_problems(600)
    pairs = {(p.meta["family"], json.dumps(p.meta["params"], sort_keys=True)) for p in held_out}
    assert not pairs & train
    assert {f for f, _ in pairs} == {f.name for f in FAMILIES}
    corpus = [task.corpus_document(i, 0.6) for i in range(2000)]
    prompts = {p.prompt for p in held_out}
    assert not any(doc.startswith(prompt) for doc in corpus for prompt in prompts if doc[:20] == prompt[:20])


def test_the_stream_is_a_pure_function_of_seed_and_index():
    a, b = build_task("code", seed=3), build_task("code", seed=3)
    assert [a.train_problem(i).prompt for i in range(50)] == [b.train_problem(i).prompt for i in range(50)]
    assert [p.id for p in a.eval_problems(40)] == [p.id for p in b.eval_problems(40)]
    assert build_task("code", seed=4).train_problem(0).id != a.train_problem(0).id


def test_kind_tasks_and_options():
    strings = build_task("code:string", seed=0)
    assert {f.kind for f in strings.families} == {"string"}
    assert all(p.meta["kind"] == "string" for p in strings.eval_problems(20))
    chat = build_task("code", seed=0, families=["at_least"], style="chat", partial=True)
    problem = chat.train_problem(0)
    assert problem.prompt[0]["content"].startswith("Write a Python function `at_least(xs)`")
    assert problem.meta["credit"] == "fraction" and "code_fenced" not in problem.meta
    for bad, match in [({"kinds": ["nope"]}, "unknown code kinds"), ({"families": ["nope"]}, "unknown code families"),
                       ({"levels": [4]}, "levels"), ({"tests": 3}, "tests"), ({"style": "x"}, "style")]:
        with pytest.raises(ValueError, match=match):
            build_task("code", seed=0, **bad)
    with pytest.raises(ValueError, match="unknown code kind 'nope'"):
        build_task("code:nope", seed=0)


def test_corpus_documents_are_the_raw_prompt_and_a_right_or_buggy_body(task):
    wrong = right = 0
    for index in range(400):
        problem = task.train_problem(index)
        document = task.corpus_document(index, 0.6)
        assert document.startswith(problem.prompt)
        body = document[len(problem.prompt):]
        if body == task.solution(problem):
            right += 1
        else:
            wrong += 1
    assert 0.45 < wrong / (wrong + right) < 0.7  # 0.6 of the families with bugs, which are most


def test_corpus_mistakes_odd_puts_bugs_only_where_k_is_odd():
    task = build_task("code:filter", seed=0, families=["at_least"], corpus_mistakes="odd")
    wrong_at = []
    for index in range(300):
        problem = task.train_problem(index)
        if task.corpus_document(index, 1.0)[len(problem.prompt):] != task.solution(problem):
            wrong_at.append(problem.meta["params"]["k"] % 2)
    odd = sum(task.train_problem(i).meta["params"]["k"] % 2 for i in range(300))
    assert wrong_at and set(wrong_at) == {1} and len(wrong_at) == odd
    with pytest.raises(ValueError, match="corpus_mistakes must be 'any' or 'odd'"):
        build_task("code:filter", seed=0, corpus_mistakes="even")


def test_corpus_wrong_share_replaces_the_corpus_share_for_this_task_alone():
    """The task's own share decides, whatever the corpus passes (the generalist writes its code
    families' bugs on 0.9 of the odd-k documents while the corpus's share is 0.6)."""
    def wrong_shares(task, corpus_share):
        wrong = {0: 0, 1: 0}
        for index in range(600):
            problem = task.train_problem(index)
            if task.corpus_document(index, corpus_share)[len(problem.prompt):] != task.solution(problem):
                wrong[problem.meta["params"]["k"] % 2] += 1
        odd = sum(task.train_problem(i).meta["params"]["k"] % 2 for i in range(600))
        return wrong[0], wrong[1] / odd

    own = build_task("code:filter", seed=0, families=["at_least"], corpus_mistakes="odd", corpus_wrong_share=0.9)
    assert wrong_shares(own, 0.6)[0] == 0 and 0.84 < wrong_shares(own, 0.6)[1] < 0.96
    assert wrong_shares(own, 0.0) == wrong_shares(own, 0.6)
    plain = build_task("code:filter", seed=0, families=["at_least"], corpus_mistakes="odd")
    assert 0.52 < wrong_shares(plain, 0.6)[1] < 0.68
    with pytest.raises(ValueError, match="corpus_wrong_share must be between 0 and 1"):
        build_task("code:filter", seed=0, corpus_wrong_share=1.5)


def test_a_training_mixture_of_code_tasks_updates_without_a_curriculum():
    """The code task's drawn levels are not a curriculum's level count: a mixture's update
    (every step of a run) neither fails on them nor reports a level."""
    from tempering.build import scheduler_settings
    from tempering.config import SchedulerConfig
    from tempering.scheduler import StaticMixture

    tasks = [build_task("code:filter", seed=0, levels=[1, 2]), build_task("code:string", seed=0)]
    mixture = StaticMixture(tasks, [1.0, 1.0], seed=0, settings=scheduler_settings(SchedulerConfig()))
    record = mixture.update()
    assert record["domain/code:filter/weight"] == 0.5
    assert not any(key.endswith("/level") for key in record)


@pytest.mark.parametrize("name", ["code", "smollm2-code"])
def test_a_shipped_config_holds_out_dozens_of_distinct_functions_per_kind_never_trained_on(name):
    """The held-out set of each shipped code config asks for at least 20 distinct functions
    (family and constants) per kind, none of them asked for by its training problems or
    written in its pre-training corpus: an accuracy per kind is not a handful of programs."""
    config = load_config(builtin_config(name))
    held_out: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for task in build_tasks(config):
        for problem in task.eval_problems(config.eval.problems_per_task):
            held_out[problem.meta["kind"]].add(function_of(problem))
        trained = {function_of(task.train_problem(i)) for i in range(2000)}
        assert not trained & set().union(*held_out.values()), task.name
    assert {kind: len(functions) for kind, functions in held_out.items() if len(functions) < 20} == {}
    if config.pretrain is not None:
        specs = {"# " + FAMILY_BY_NAME[family].spec.format(**json.loads(params)) + "\n"
                 for functions in held_out.values() for family, params in functions}
        documents = itertools.islice(corpus(config.pretrain), 3000)
        assert not [d for d in documents if d[: d.index("\n") + 1] in specs]


def function_of(problem) -> tuple[str, str]:
    return problem.meta["family"], json.dumps(problem.meta["params"], sort_keys=True)


def test_a_reflection_transcript_is_encoded_as_the_runner_builds_the_episode():
    """Prompt, first turn ending in the end-of-sequence id the sampler draws, the feedback as
    the runner encodes an observation without a chat template, the second turn."""

    tokenizer = build_tokenizer()
    task = build_task("code", seed=0, families=["at_least"], corpus_reflections=1.0)
    index, document = next((i, d) for i, d in ((i, task.corpus_document(i, 0.6)) for i in range(20)) if TURN_END in d)
    prompt = task.train_problem(index).prompt
    first, rest = document[len(prompt):].split(TURN_END)
    message, def_line, second = rest.split("\n", 2)  # the feedback ends with the def line again
    feedback = f"{message}\n{def_line}"

    def chars(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    episode = tokenizer(prompt)["input_ids"] + chars(first) + [tokenizer.eos_token_id] + chars(feedback + "\n") + chars(second)
    assert document_ids(document, tokenizer.get_vocab(), tokenizer) == episode + [tokenizer.eos_token_id]
    assert tokenizer.unk_token_id not in episode


def test_corpus_reflections_changes_no_document_when_zero_and_is_refused_out_of_range():
    plain = build_task("code", seed=0, families=["at_least", "pad_left"])
    none = build_task("code", seed=0, families=["at_least", "pad_left"], corpus_reflections=0.0)
    half = build_task("code", seed=0, families=["at_least", "pad_left"], corpus_reflections=0.5)

    assert [plain.corpus_document(i, 0.6) for i in range(40)] == [none.corpus_document(i, 0.6) for i in range(40)]
    assert 10 <= sum(TURN_END in half.corpus_document(i, 0.6) for i in range(40)) <= 30
    with pytest.raises(ValueError, match="corpus_reflections"):
        build_task("code", seed=0, corpus_reflections=1.5)


def test_a_feedback_family_leaves_its_detail_to_the_tests_and_holds_out_what_it_asks():
    """``upper`` keeps k or not, drawn per problem: the prompt's example holds for both choices,
    the other choice's first failing hidden case is ``upper([k])`` (so the feedback tells which),
    and the split goes by k alone: no held-out k is asked for in training, with either choice.
    Only a task that names it draws it."""
    task = build_task("code", seed=0, families=["upper"], corpus_reflections=1.0)
    family = FAMILY_BY_NAME["upper"]
    problems = [task.train_problem(i) for i in range(300)]
    assert {p.meta["params"]["op"] for p in problems} == {">=", ">"}
    for index, problem in enumerate(problems):
        params, cases = problem.meta["params"], problem.meta["tests"]["cases"]
        example = cases[len(family.edges(params))]
        assert f"# upper({example['args'][0]!r}) == {example['expected']!r}\n" in problem.prompt
        assert run_reference(reference(family, params, 0), example["args"]) == (True, example["expected"])
        k = params["k"]
        document = task.corpus_document(index, 0.6)
        assert f"failed this test: assert upper([{k}]) == {[k] if params['op'] == '>=' else []!r}" in document
    held_out = task.eval_problems(40)
    assert {p.meta["params"]["op"] for p in held_out} == {">=", ">"}
    trained = {task.train_problem(i).meta["params"]["k"] for i in range(3000)}
    assert not {p.meta["params"]["k"] for p in held_out} & trained
    assert "upper" not in {f.name for f in build_task("code", seed=0).families}
    assert "upper" not in {f.name for f in build_task("code:filter", seed=0).families}


def test_head_or_leaves_a_number_to_the_tests_which_only_the_failing_test_gives():
    """``head_or``'s value for an empty list is drawn per problem and never in the prompt (whose
    example is never empty); its bug (another number) fails only the empty case, so the
    feedback is always that case with the value expected; the split goes by k alone. The same k
    asks for many values, so no value can be learned from the spec."""
    task = build_task("code", seed=0, families=["head_or"], corpus_reflections=1.0)
    family = FAMILY_BY_NAME["head_or"]
    problems = [task.train_problem(i) for i in range(300)]
    for index, problem in enumerate(problems):
        params, cases = problem.meta["params"], problem.meta["tests"]["cases"]
        assert params["w"] != params["d"]
        assert cases[0]["args"] == [[]] and cases[0]["expected"] == params["d"]
        assert all(case["args"] != [[]] for case in cases[1:])
        assert f"else {params['d']}" not in problem.prompt
        buggy = reference(family, params, 0)
        assert [run_reference(buggy, case["args"]) == (True, case["expected"]) for case in cases] == \
            [False] + [True] * (len(cases) - 1)
        document = task.corpus_document(index, 0.6)
        assert f"failed this test: assert head_or([]) == {params['d']} (returned {params['w']})" in document
    by_k: dict[int, set[int]] = {}
    for problem in problems:
        by_k.setdefault(problem.meta["params"]["k"], set()).add(problem.meta["params"]["d"])
    assert max(len(values) for values in by_k.values()) >= 3
    held_out = task.eval_problems(40)
    trained = {task.train_problem(i).meta["params"]["k"] for i in range(3000)}
    assert not {p.meta["params"]["k"] for p in held_out} & trained
    assert "head_or" not in {f.name for f in build_task("code", seed=0).families}
