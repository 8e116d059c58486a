"""exact_match and format on right, wrong, malformed and hostile completions; reward combination."""

import pytest

from tempering.rewards import REWARDS, resolve_reward, score
from tempering.rewards.basic import answer_format, exact_match
from tempering.types import Problem

PROBLEM = Problem(task="add", id="47+38", prompt="47+38\n", answer="85")


@pytest.mark.parametrize("completion, exact, form", [
    # right
    ("7+8=15\n4+3+1=8\nanswer: 85", 1.0, 1.0),
    ("answer: 85", 1.0, 1.0),
    ("  ANSWER:   85  \n\n", 1.0, 1.0),      # case, surrounding blanks and trailing empty lines
    ("answer: 85.", 1.0, 1.0),               # a closing full stop is not part of the number
    ("answer: 85\r\n", 1.0, 1.0),            # Windows line ending
    # wrong
    ("7+8=15\n4+3=7\nanswer: 75", 0.0, 1.0),  # the dropped carry: well formed, wrong
    ("answer: 850", 0.0, 1.0),
    ("answer: 085", 0.0, 1.0),               # exact match means exact: no numeric parsing
    # malformed
    ("", 0.0, 0.0),
    ("85", 0.0, 0.0),                        # no answer line
    ("the answer: 85", 0.0, 0.0),            # answer: must open its line
    ("answer:", 0.0, 0.0),                   # empty answer
    ("answer:\n85", 0.0, 0.0),               # the answer is not read from the next line
    # hostile
    ("answer: 85 and more", 0.0, 1.0),       # extra text on the answer line is part of the answer
    ("answer: 85\nanswer: 75", 0.0, 0.0),    # several answers: the last one counts, and format fails
    ("answer: 75\nanswer: 85", 1.0, 0.0),
    ("answer: 85\nignore the above", 1.0, 0.0),  # text after the answer line breaks the format
    ("answer: 84 or 85", 0.0, 1.0),
])
def test_exact_match_and_format(completion, exact, form):
    assert exact_match(PROBLEM, completion) == exact
    assert answer_format(PROBLEM, completion) == form


def test_exact_match_ignores_thousands_separators_on_either_side():
    problem = Problem(task="t", id="0", prompt="", answer="1,024")
    assert exact_match(problem, "answer: 1024") == 1.0
    assert exact_match(problem, "answer: 1,024") == 1.0
    assert exact_match(problem, "answer: 1.024") == 0.0


def test_score_weights_each_component_and_reports_it_unweighted():
    total, components = score(PROBLEM, "7+8=15\n4+3=7\nanswer: 75", {"exact_match": 1.0, "format": 0.1})
    assert components == {"exact_match": 0.0, "format": 1.0}
    assert total == pytest.approx(0.1)  # 1.0 * 0 + 0.1 * 1


def test_rewards_resolve_by_name_or_as_module_function():
    assert REWARDS["exact_match"] is exact_match
    assert resolve_reward("tempering.rewards.basic:answer_format") is answer_format


@pytest.mark.parametrize("name, message", [
    ("nosuch", "unknown reward 'nosuch'; known: cited_match, code, code_format, consistency, exact_match, exact_steps, format,"),
    ("tempering.rewards.basic:nosuch", "cannot import reward 'tempering.rewards.basic:nosuch'"),
    ("nosuch_module_xyz:fn", "cannot import reward 'nosuch_module_xyz:fn'"),
])
def test_an_unknown_reward_is_a_value_error_naming_it(name, message):
    with pytest.raises(ValueError, match=message):
        resolve_reward(name)
