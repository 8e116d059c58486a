"""Process rewards on hand-written completions: steps (and its arithmetic parser), repetition,
length, and the generalized format reward."""

import time
from fractions import Fraction

import pytest

from tempering.rewards.arith import NotArithmetic, evaluate, try_evaluate
from tempering.rewards.basic import answer_format
from tempering.rewards.process import length, repetition, steps
from tempering.tasks import build_task
from tempering.types import Problem, Rollout

ADD = Problem(task="add", id="47+38", prompt="47+38\n", answer="85")


def test_one_wrong_intermediate_step_lowers_steps_though_the_final_answer_is_right():
    all_right = "7+8=15\n4+3+1=8\nanswer: 85"
    one_wrong = "7+8=14\n4+3+1=8\nanswer: 85"  # 7+8 is not 14; the answer is still 85
    right, wrong = steps(ADD, all_right), steps(ADD, one_wrong)
    assert right.score == 1.0
    assert right.components == {"correct": 1.0, "leads": 1.0}
    assert wrong.components["correct"] == 0.5
    assert wrong.score < right.score


@pytest.mark.parametrize("completion, score, why", [
    ("7+8=15\n4+3+1=8\nanswer: 85", 1.0, "right steps, right assembly"),
    ("7+8=15\n4+3=7\nanswer: 75", 1.0, "the dropped carry: each line is true arithmetic and leads to 75"),
    ("7+8=15\n4+3+1=8\nanswer: 95", 0.5, "true steps, but the answer does not follow (a jump)"),
    ("answer: 85", 0.0, "no steps at all"),
    ("", 0.0, "empty"),
    ("7+8=fifteen\nanswer: 85", 0.0, "an uncheckable step counts as wrong"),
    ("15 = 15\n85 = 85\nanswer: 85", 0.0, "restating numbers is not a step"),
    ("2*3 = 6 = 3+3\nanswer: 6", 1.0, "a chain whose sides all agree, leading to the answer"),
    ("__import__('os').system('x')=0\nanswer: 0", 0.0, "code is not arithmetic: never evaluated"),
    ("9**9**9**9=1\nanswer: 1", 0.0, "an exponent bomb is refused, not computed"),
    ("(((((((((((((((((((((((1)))))))))))))))))))))))=1\nanswer: 1", 0.0, "nesting past the limit"),
])
def test_steps_golden_values(completion, score, why):
    assert steps(ADD, completion).score == score, why


def test_steps_leads_by_last_value_or_column_assembly_as_asked():
    chain = "12*3=36\n36+4=40\nanswer: 40"
    assert steps(ADD, chain, combine="last").score == 1.0
    assert steps(ADD, chain, combine="columns").components["leads"] == 0.0
    columns = "7+8=15\n4+3+1=8\nanswer: 85"
    assert steps(ADD, columns, combine="last").components["leads"] == 0.0


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_every_worked_solution_of_the_builtin_tasks_scores_full_marks(op):
    task = build_task(op, seed=0, digits=[1, 2, 3])
    for i in range(50):
        problem = task.train_problem(i)
        assert steps(problem, task.solution(problem)).score == 1.0, task.solution(problem)


def test_the_parser_computes_exactly_and_refuses_what_is_not_bounded_arithmetic():
    assert evaluate("1/3 + 1/6") == Fraction(1, 2)
    assert evaluate("2^-2") == Fraction(1, 4)
    assert evaluate("3 × 4 ÷ 6") == 2
    for text in ("1/0", "0^-1", "x+1", "1+", "(1", "1)", "1 2", "open('f')", "2^0.5", "9" * 100, "1+" * 200 + "1"):
        assert try_evaluate(text) is None, text
    with pytest.raises(NotArithmetic):
        evaluate("a")


def test_hostile_arithmetic_is_cheap():
    start = time.perf_counter()
    for text in ("9**9**9**9", "2^64^64", "(" * 5000 + "1" + ")" * 5000, "99999999999^64*" * 10 + "1"):
        try_evaluate(text)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("completion, score", [
    ("7+8=15\n4+3+1=8\nanswer: 85", 1.0),
    ("1+1=2\n1+1=2\nanswer: 22", 1.0),                        # short steps may repeat (11+11)
    ("the answer is 85\nthe answer is 85\nthe answer is 85\nthe answer is 85", 0.25),
    ("", 1.0),
    ("we add the units. we add the units. we add the units.", 1 - 6 / 9),
])
def test_repetition_golden_values(completion, score):
    assert repetition(ADD, completion).score == pytest.approx(score)


def _rollout(tokens: int, reason: str = "stop") -> Rollout:
    return Rollout(ADD, [1], [5] * tokens, [0.0] * tokens, "x" * tokens, reason, 0)


@pytest.mark.parametrize("tokens, expected", [(0, 0.0), (32, 0.0), (40, -0.5), (47, -0.9375), (48, -1.0)])
def test_length_soft_overlong_penalty_matches_dapo(tokens, expected):
    assert length(ADD, _rollout(tokens), max_tokens=48, buffer_tokens=16).score == pytest.approx(expected)


def test_length_target_shaping_peaks_at_the_target():
    values = [length(ADD, _rollout(n), max_tokens=100, target_tokens=20).score for n in (0, 10, 20, 30, 60)]
    assert values == pytest.approx([-1.0, -0.5, 0.0, -0.5, -1.0])


@pytest.mark.parametrize("completion, expected", [
    ("<think>7+8=15</think>\n<answer>85</answer>", 1.0),
    ("<think>\n7+8=15\n</think><answer>85</answer>\n", 1.0),
    ("<answer>85</answer>", 0.0),                                   # the reasoning tag is missing
    ("<think></think><answer>85</answer>", 0.0),                    # empty reasoning
    ("so <think>x</think><answer>85</answer>", 0.0),                # text outside the tags
    ("<think>a</think><answer>85</answer><answer>86</answer>", 0.0),  # a second answer
    ("<think>a<answer>8</answer></think><answer>85</answer>", 0.0),   # nested tag smuggled in
])
def test_format_with_tags(completion, expected):
    assert answer_format(ADD, completion, tags=["think", "answer"]) == expected


def test_format_with_reasoning_wants_a_line_before_the_answer():
    assert answer_format(ADD, "7+8=15\nanswer: 85", reasoning=True) == 1.0
    assert answer_format(ADD, "answer: 85", reasoning=True) == 0.0


def test_exact_steps_as_a_metric_names_steps_right_for_held_out_evaluation():
    from tempering.eval.greedy import component_means
    from tempering.rewards.base import build_reward
    from tempering.types import Problem, Rollout

    reward = build_reward("exact_steps")
    assert reward.summary == ("steps_right",)
    p = Problem(task="add", id="47+38", prompt="47+38\n", answer="85")
    texts = ["7+8=15\n4+3+1=8\nanswer: 85", "7+8=15\n4+3=8\nanswer: 85", "7+8=15\n4+3=7\nanswer: 75"]
    results = reward.score_batch([p] * 3, [Rollout(p, [1], [2], [0.0], t, "stop", 0) for t in texts])
    assert [r.score for r in results] == [1.0, 1.0, 0.0]
    assert component_means(reward.summary, results) == {"steps_right": 1 / 3}
