"""The built-in arithmetic tasks: disjoint splits, determinism, and worked solutions right and buggy.

Carries and borrows are decided here from the digits alone, independently of the solvers:
a sum or one-digit product needs a carry when some column below the top one reaches 10
(a chain of carries always starts at such a column); a difference needs a borrow when some
digit of the subtrahend is larger than the digit above it.
"""

import itertools
import random

import pytest

from tempering.rewards.basic import exact_match
from tempering.tasks import TASKS, build_task
from tempering.tasks.arithmetic import solve_add, solve_mul, solve_sub

OPERATIONS = ["add", "sub", "mul"]
DIGITS = [[2], [2, 3]]
EXACT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def _columns(a: int, b: int) -> list[tuple[int, int]]:
    """Digit pairs, least significant first, the shorter number padded with zeros."""
    width = max(len(str(a)), len(str(b)))
    return [(a // 10**i % 10, b // 10**i % 10) for i in range(width)]


def needs_carry_or_borrow(operation: str, a: int, b: int) -> bool:
    if operation == "add":
        return any(da + db >= 10 for da, db in _columns(a, b)[:-1])
    if operation == "mul":
        return any(da * b >= 10 for da, _ in _columns(a, 0)[:-1])
    return any(da < db for da, db in _columns(a, b))


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("digits", DIGITS)
def test_training_stream_and_held_out_split_never_overlap(operation, digits):
    task = build_task(operation, seed=0, digits=digits)
    held_out = {p.id for p in task.eval_problems(200)}
    training = {task.train_problem(i).id for i in range(3000)}
    assert len(held_out) >= 50
    assert len(training) >= 500
    assert not held_out & training


@pytest.mark.parametrize("operation", OPERATIONS)
def test_the_held_out_split_does_not_depend_on_the_training_seed(operation):
    seed0, seed1 = build_task(operation, seed=0), build_task(operation, seed=1)
    assert [p.id for p in seed0.eval_problems(50)] == [p.id for p in seed1.eval_problems(50)]
    assert [seed0.train_problem(i).id for i in range(20)] != [seed1.train_problem(i).id for i in range(20)]
    held_out = {p.id for p in seed0.eval_problems(200)}
    assert not held_out & {seed1.train_problem(i).id for i in range(2000)}


@pytest.mark.parametrize("operation", OPERATIONS)
def test_train_problem_is_a_pure_function_of_seed_and_index(operation):
    first, again = build_task(operation, seed=3), build_task(operation, seed=3)
    indices = [0, 17, 5, 17, 999]
    assert [first.train_problem(i) for i in indices] == [again.train_problem(i) for i in indices]
    assert first.train_problem(17) == first.train_problem(17)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("digits", DIGITS)
def test_problems_have_the_requested_sizes_and_the_true_answer(operation, digits):
    task = build_task(operation, seed=0, digits=digits)
    problems = [task.train_problem(i) for i in range(300)] + task.eval_problems(100)
    for problem in problems:
        a, b = problem.meta["a"], problem.meta["b"]
        assert len(str(a)) in digits
        assert 2 <= b <= 9 if operation == "mul" else len(str(b)) == len(str(a))
        assert problem.answer == str(EXACT[operation](a, b))
        assert problem.prompt == f"{problem.id}\n"
    assert {len(str(p.meta["a"])) for p in problems} == set(digits), "every size is drawn"


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("digits", DIGITS)
def test_correct_solutions_pass_and_buggy_ones_fail_exactly_when_a_carry_or_borrow_is_needed(operation, digits):
    task = build_task(operation, seed=0, digits=digits)
    with_carry = 0
    for problem in [task.train_problem(i) for i in range(400)]:
        a, b = problem.meta["a"], problem.meta["b"]
        correct = task.solution(problem)
        assert correct.splitlines()[-1] == f"answer: {EXACT[operation](a, b)}"
        assert exact_match(problem, correct) == 1.0
        needed = needs_carry_or_borrow(operation, a, b)
        assert exact_match(problem, task.solution(problem, buggy=True)) == (0.0 if needed else 1.0), problem.id
        with_carry += needed
    assert 0 < with_carry < 400, "both kinds of problem occur"


@pytest.mark.parametrize("operation, solve, pairs", [
    ("add", solve_add, itertools.product(range(10, 100), repeat=2)),
    ("sub", solve_sub, ((a, b) for a, b in itertools.product(range(10, 100), repeat=2) if a >= b)),
    ("mul", solve_mul, itertools.product(range(10, 1000), range(2, 10))),
])
def test_solvers_over_every_small_problem(operation, solve, pairs):
    for a, b in pairs:
        lines, answer = solve(a, b, False)
        assert answer == EXACT[operation](a, b), (a, b)
        assert len(lines) == len(str(a)), "one line per column"
        _, buggy_answer = solve(a, b, True)
        assert (buggy_answer != answer) == needs_carry_or_borrow(operation, a, b), (a, b)


def test_solvers_on_random_larger_problems():
    rng = random.Random(0)
    for _ in range(2000):
        a, b = rng.randint(100, 999_999), rng.randint(100, 999_999)
        a, b = max(a, b), min(a, b)
        for operation, solve in (("add", solve_add), ("sub", solve_sub)):
            _, answer = solve(a, b, False)
            _, buggy_answer = solve(a, b, True)
            assert answer == EXACT[operation](a, b)
            assert (buggy_answer != answer) == needs_carry_or_borrow(operation, a, b), (operation, a, b)


def test_corpus_documents_are_training_problems_with_correct_or_buggy_solutions():
    task = build_task("add", seed=0)
    for i in range(100):
        problem = task.train_problem(i)
        assert task.corpus_document(i, wrong_share=0.0) == f"{problem.id}\n{task.solution(problem)}"
        assert task.corpus_document(i, wrong_share=1.0) == f"{problem.id}\n{task.solution(problem, buggy=True)}"


def test_chat_style_prompts_are_messages_that_state_the_expression():
    task = build_task("sub", seed=0, style="chat")
    problem = task.train_problem(0)
    assert isinstance(problem.prompt, list) and problem.prompt[0]["role"] == "user"
    assert problem.id in problem.prompt[0]["content"]
    assert "answer: N" in problem.prompt[0]["content"]


def test_tasks_own_their_rewards_and_metric():
    task = build_task("mul", seed=0)
    assert task.rewards == {"exact_match": 1.0, "format": 0.1}
    assert task.metric == "exact_match"
    assert task.domain == "mul"
    assert {"add", "mul", "sub"} <= set(TASKS)


@pytest.mark.parametrize("name, options, message", [
    ("nosuch", {}, "unknown task 'nosuch'; known: add, code, code:<type>, dataset, humaneval, long_context, long_context:<type>, mul, repo, rg:<type>, sub"),
    ("add", {"digits": [0]}, "digits must be a non-empty list of sizes 1..6"),
    ("add", {"digits": []}, "digits must be a non-empty list"),
    ("add", {"style": "poem"}, "style must be 'raw', 'chat' or 'program'"),
    ("add", {"digits": "abc"}, r"options.digits='abc': expected list\[int\] \(Input should be a valid list\)"),
    ("mul", {"digits": ["x"]}, r"options.digits=\['x'\]: expected list\[int\] \(0: Input should be a valid integer"),
    ("sub", {"digits": 3}, r"options.digits=3: expected list\[int\]"),
    ("dataset", {"path": "d.jsonl", "eval_fraction": "half"}, r"options.eval_fraction='half': expected float"),
    ("long_context", {"hops": [1]}, r"options.hops=\[1\]: expected int"),
])
def test_bad_task_names_and_options_are_value_errors_that_say_what_is_allowed(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_task(name, seed=0, **options)


def test_the_corpus_interleaves_tasks_by_weight_and_evenly_by_default():
    from itertools import islice

    from tempering.config import PretrainConfig, TaskSpec
    from tempering.pretrain import corpus

    add, sub = build_task("add", seed=0), build_task("sub", seed=0)
    even = list(islice(corpus(PretrainConfig(tasks=[TaskSpec(name="add"), TaskSpec(name="sub")], wrong_share=0.0)), 6))
    assert even == [task.corpus_document(i // 2, 0.0) for i, task in zip(range(6), [add, sub] * 3)]
    weighted = PretrainConfig(tasks=[TaskSpec(name="add", weight=3), TaskSpec(name="sub", weight=1),
                                     TaskSpec(name="mul", weight=0)], wrong_share=0.0)
    documents = list(islice(corpus(weighted), 400))
    adds = [d for d in documents if "+" in d.splitlines()[0]]
    assert len(adds) == 300 and not any("*" in d.splitlines()[0] for d in documents)
    assert adds == [add.corpus_document(i, 0.0) for i in range(300)]  # each task's problems in order
    with pytest.raises(ValueError, match="every weight is 0"):
        next(corpus(PretrainConfig(tasks=[TaskSpec(name="add", weight=0)])))


@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_lucky_solution_reaches_the_right_answer_not_following_from_its_steps_where_a_carry_or_borrow_is_needed(
        operation):
    from tempering.rewards.process import check_steps, exact_steps, steps

    task = build_task(operation, seed=0, digits=[2])
    lucky, plain = 0, 0
    for i in range(200):
        problem = task.train_problem(i)
        text = task.lucky_solution(problem)
        verdicts, _ = check_steps(text)
        result = exact_steps(problem, text)
        assert result.score == 1.0   # the answer is always right
        if task.solution(problem) == task.solution(problem, buggy=True):
            plain += 1
            assert text == task.solution(problem) and all(verdicts) and result.components["steps_right"] == 1.0
        else:
            lucky += 1
            assert text.splitlines()[:-1] == task.solution(problem, buggy=True).splitlines()[:-1]
            assert steps(problem, text).components["leads"] == 0.0 and result.components["steps_right"] == 0.0
    assert lucky > 20 and plain > 5


def test_the_lucky_share_writes_lucky_solutions_among_the_buggy_ones_and_zero_leaves_the_corpus_as_it_was():
    plain = build_task("add", seed=0, digits=[2])
    lucky = build_task("add", seed=0, digits=[2], corpus_lucky_share=1.0)
    for i in range(50):
        problem = plain.train_problem(i)
        assert lucky.corpus_document(i, wrong_share=1.0) == f"{problem.id}\n{plain.lucky_solution(problem)}"
        assert lucky.corpus_document(i, wrong_share=0.0) == plain.corpus_document(i, wrong_share=0.0)
    half = build_task("add", seed=0, digits=[2], corpus_lucky_share=0.5)
    written = [half.corpus_document(i, wrong_share=0.6) for i in range(400)]
    assert written != [plain.corpus_document(i, wrong_share=0.6) for i in range(400)]
    assert [build_task("add", seed=0, digits=[2], corpus_lucky_share=0.0).corpus_document(i, 0.6) for i in range(400)] \
        == [plain.corpus_document(i, 0.6) for i in range(400)]
    with pytest.raises(ValueError, match="corpus_lucky_share must be between 0 and 1"):
        build_task("add", seed=0, corpus_lucky_share=1.5)
