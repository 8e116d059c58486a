"""The ``code`` reward in the real sandbox: stdio and call tests, both credit modes, and
hostile programs that try to pass without computing anything."""

import pytest

from tempering.rewards.code import CodeReward
from tempering.types import Problem, Rollout

CALL_TESTS = {"kind": "call", "entry_point": "add",
              "cases": [{"args": [1, 2], "expected": 3}, {"args": [-1, 1], "expected": 0},
                        {"args": [20, 22], "expected": 42}]}
STDIO_TESTS = {"kind": "stdio", "cases": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 5\n", "stdout": "10\n"}]}


@pytest.fixture(scope="module")
def reward(sandbox_executor):
    code = CodeReward(credit="fraction")
    code._sandbox = sandbox_executor
    return code


def _score(reward, tests, completions):
    problem = Problem(task="code", id="0", prompt="", answer="", meta={"tests": tests})
    rollouts = [Rollout(problem, [1], [2], [0.0], c, "stop", 0) for c in completions]
    return reward.score_batch([problem] * len(rollouts), rollouts)


def _fenced(code):
    return f"Here is my solution:\n```python\n{code}\n```\n"


@pytest.mark.parametrize("code, expected", [
    ("def add(a, b):\n    return a + b", 1.0),                                   # right
    ("def add(a, b):\n    return a + b if a != 20 else 0", 2 / 3),                 # wrong on one case
    ("def add(a, b)\n    return a + b", 0.0),                                    # malformed: syntax error
    ("import sys\ndef add(a, b):\n    sys.exit(0)", 0.0),                        # hostile: exit early
    ("class Yes:\n    def __eq__(self, other):\n        return True\n"
     "def add(a, b):\n    return Yes()", 0.0),                                   # hostile: __eq__ always true
    ("def add(a, b):\n    print('All tests passed')\n    return None", 0.0),     # hostile: fake verdict
])
def test_call_tests(reward, code, expected):
    [result] = _score(reward, CALL_TESTS, [_fenced(code)])
    assert result.error is None
    assert result.score == pytest.approx(expected)


def test_stdio_tests_and_a_completion_without_code(reward):
    right = _fenced("a, b = map(int, input().split())\nprint(a + b)")
    wrong = _fenced("print(3)")
    results = _score(reward, STDIO_TESTS, [right, wrong, "I cannot write code"])
    assert [r.score for r in results] == [1.0, 0.5, 0.0]
    assert results[2].diagnostics == {"no_code": 1}
