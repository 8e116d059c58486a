"""Strict and lenient answer grading, prompt templates, and the format reward that teaches
the strict format when accuracy is graded leniently."""

import pytest

from tempering.rewards.basic import answer_format, exact_match, lenient_answer
from tempering.tasks import build_task
from tempering.types import Problem


def _problem(answer: str, **meta) -> Problem:
    return Problem(task="t", id="0", prompt="", answer=answer, meta=meta)


@pytest.mark.parametrize(("completion", "strict", "lenient"), [
    ("answer: 85", 1.0, 1.0),
    ("47 + 38 = 85.", 0.0, 1.0),
    ("The sum is 85.00", 0.0, 1.0),
    (r"so \boxed{85}", 0.0, 1.0),
    ("<answer>85</answer>", 0.0, 1.0),
    ("85\nanswer: 84", 0.0, 0.0),  # the asked-for format wins over a number elsewhere
    ("47 + 38 = 85, or 86", 0.0, 0.0),  # the last number is the answer
    ("I do not know", 0.0, 0.0),
])
def test_lenient_grading_reads_what_a_reader_would_take(completion, strict, lenient):
    assert exact_match(_problem("85"), completion) == strict
    assert exact_match(_problem("85", grading="lenient"), completion) == lenient


def test_a_text_answer_is_read_from_the_last_line():
    assert lenient_answer("Mary is the mother of Tom.\nmother", numeric=False) == "mother"
    assert exact_match(_problem("Mother", grading="lenient"), "Let me think.\nmother.") == 1.0


def test_the_format_reward_stays_strict_under_lenient_grading():
    lenient = _problem("85", grading="lenient")
    assert answer_format(lenient, "47 + 38 = 85") == 0.0
    assert answer_format(lenient, "7+8=15\nanswer: 85") == 1.0


def test_the_format_reward_checks_answer_tags_where_the_prompt_asked_for_them():
    tagged = _problem("3", answer_format="tag")
    assert answer_format(tagged, "1 and 2 make 3. <answer>3</answer>") == 1.0
    assert answer_format(tagged, "answer: 3") == 0.0
    assert answer_format(tagged, "<answer>3</answer> <answer>4</answer>") == 0.0
    assert answer_format(tagged, "<answer> </answer>") == 0.0


def test_an_arithmetic_template_renders_the_chat_prompt_and_the_problem_says_how_it_is_graded():
    task = build_task("add", seed=0, style="chat", grading="lenient",
                      template="What is {a} {op} {b}? ({expression})")
    problem = task.eval_problems(1)[0]
    a, b = problem.meta["a"], problem.meta["b"]
    assert problem.prompt == [{"role": "user", "content": f"What is {a} + {b}? ({a}+{b})"}]
    assert problem.meta["grading"] == "lenient"
    assert exact_match(problem, f"{a} + {b} = {a + b}") == 1.0
    assert build_task("add", seed=0, style="chat").eval_problems(1)[0].meta["grading"] == "strict"


@pytest.mark.parametrize(("options", "message"), [
    ({"style": "chat", "template": "What is {x}?"}, "placeholders are {a}, {b}, {op} and {expression}"),
    ({"template": "What is {a}?"}, "set style: chat"),
    ({"grading": "loose"}, "grading must be 'strict' or 'lenient'"),
])
def test_bad_arithmetic_prompt_options_are_refused_naming_the_fix(options, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}").replace("(", r"\(")):
        build_task("add", seed=0, **options)


def test_a_reasoning_gym_task_graded_leniently_scores_an_untagged_answer():
    pytest.importorskip("reasoning_gym")
    from tempering.tasks.reasoning_gym import reasoning_gym_score

    strict = build_task("rg:chain_sum", seed=0)
    lenient = build_task("rg:chain_sum", seed=0, grading="lenient", template="Compute: {question}")
    problem, loose = strict.eval_problems(1)[0], lenient.eval_problems(1)[0]
    assert loose.prompt[0]["content"].startswith("Compute: ")
    untagged = f"Adding them up gives {problem.answer}."
    assert reasoning_gym_score(problem, untagged) == 0.0
    assert reasoning_gym_score(loose, untagged) == 1.0
    assert reasoning_gym_score(loose, f"<answer>{problem.answer}</answer>") == 1.0
    assert answer_format(loose, untagged) == 0.0
    with pytest.raises(ValueError, match="the one placeholder is"):
        build_task("rg:chain_sum", seed=0, template="{q}")


def test_a_reasoning_gym_scorer_that_cannot_parse_the_answer_scores_it_wrong_not_as_a_grader_fault():
    """reasoning-gym's prime_factorization scorer calls int() on each factor the answer lists;
    a sentence read leniently as the answer made it raise, which counted as a grader fault: the
    rollout was dropped, and a task whose every answer was a sentence was paused. A malformed
    answer is a wrong answer."""
    pytest.importorskip("reasoning_gym")
    from tempering.tasks.reasoning_gym import reasoning_gym_score

    task = build_task("rg:prime_factorization", seed=0, grading="lenient", config={"min_value": 2, "max_value": 50})
    problem = task.eval_problems(1)[0]
    assert reasoning_gym_score(problem, "The prime factors of 10 are: 2") == 0.0
    assert reasoning_gym_score(problem, f"<answer>{problem.answer}</answer>") == 1.0
