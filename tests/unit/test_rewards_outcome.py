"""The ``match`` and ``code`` outcome rewards on right, wrong, malformed and hostile completions.

The code reward's own logic (extraction, credit, retries, dropping sandbox faults) runs here
against a scripted sandbox; tests/integration/test_rewards_code.py runs it in the real one.
"""

import pytest

from tempering.rewards import build_reward
from tempering.rewards.basic import match
from tempering.rewards.code import CodeReward, code_format, extract_code, unfenced_code
from tempering.sandbox import CaseResult, TestResult
from tempering.types import Problem, Rollout


@pytest.mark.parametrize("answer, completion, options, expected", [
    ("85", "answer: 85", {}, 1.0),
    ("85", "answer: 85.0", {}, 1.0),                      # numerically equal
    ("0.25", "answer: 1/4", {}, 1.0),
    ("1,024", "answer: 1024", {}, 1.0),
    ("Paris", r"answer: $\text{paris}$.", {}, 1.0),        # text normalised: case, $, \text, full stop
    ("-3", "answer: −3", {}, 1.0),                          # unicode minus
    ("85", "answer: 86", {}, 0.0),
    ("100", "answer: 101", {"tolerance": 0.01}, 1.0),        # 1% relative
    ("100", "answer: 102", {"tolerance": 0.01}, 0.0),
    ("0", "answer: 0.001", {"tolerance": 0.01}, 0.0),        # relative to 0 is exact
    ("0", "answer: 0.001", {"tolerance": 0.01, "relative": False}, 1.0),
    ("85", "85", {}, 0.0),                                  # malformed: no answer line or box
    ("85", "85", {"last_number": True}, 1.0),
    ("85", "answer: ", {}, 0.0),
    ("85", "answer: 85 or 86", {}, 0.0),                    # hedging is not an answer
    ("85", "answer: 9" * 500, {}, 0.0),                     # hostile: huge text
    ("85", "answer: 1/0", {}, 0.0),
    ("85", r"\boxed{85", {}, 0.0),                          # unclosed box
])
def test_match_golden_values(answer, completion, options, expected):
    problem = Problem(task="t", id="0", prompt="", answer=answer)
    assert match(problem, completion, **options) == expected


def test_code_extraction_prefers_the_requested_language_and_tolerates_a_cut_off_fence():
    text = "first\n```python\ndef f(): return 1\n```\nthen\n```bash\necho hi\n```"
    assert extract_code(text) == "def f(): return 1\n"
    assert extract_code(text, "bash") == "echo hi\n"
    assert extract_code("```python3\nx = 1\n") == "x = 1\n"
    assert extract_code("x = 1") is None


def test_code_extraction_takes_the_block_that_defines_the_entry_point_over_a_later_usage_example():
    text = "```python\ndef add(a, b):\n    return a + b\n```\nFor example:\n```python\nprint(add(1, 2))\n```"
    assert extract_code(text, entry_point="add") == "def add(a, b):\n    return a + b\n"
    assert extract_code(text) == "print(add(1, 2))\n"                        # no entry point: the last block
    assert extract_code(text, entry_point="sub") == "print(add(1, 2))\n"     # none defines it: the last block
    reward = CodeReward()
    reward._sandbox = ScriptedSandbox([[["passed", "passed"]]])
    reward.score_batch([_code_problem()], _rollouts([text]))
    assert reward._sandbox.calls[0][0].code == "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize("completion, expected", [
    ("def add(a, b):\n    return a + b", "def add(a, b):\n    return a + b\n"),
    # prose around it, a blank line inside and an import before it
    ("Here it is:\nimport math\n\ndef add(a, b):\n\n    return a + b\nIt adds.",
     "import math\n\ndef add(a, b):\n\n    return a + b\n"),
    # closed by a fence it never opened
    ("def add(a, b):\n    return a + b\n```\nDone.", "def add(a, b):\n    return a + b\n"),
    ("@cache\ndef add(a, b):\n    return a + b", "@cache\ndef add(a, b):\n    return a + b\n"),
    ("You add them: a + b.", None),
    ("define add(a, b) as a + b", None),                   # "define" is not "def "
])
def test_unfenced_code_reads_the_program_from_its_first_statement_to_the_first_prose_line(completion, expected):
    assert unfenced_code(completion) == expected


def test_code_format_wants_a_fenced_block_defining_the_entry_point():
    problem = _code_problem()
    assert code_format(problem, "Sure.\n```python\ndef add(a, b):\n    return a + b\n```\nDone.") == 1.0
    assert code_format(problem, "```\nasync def add(a, b):\n    return a + b\n```") == 1.0
    assert code_format(problem, "def add(a, b):\n    return a + b") == 0.0          # no fence
    assert code_format(problem, "```python\ndef adder(a, b):\n    return a + b\n```") == 0.0
    assert code_format(problem, "```python\n    def add(a, b): pass\n```") == 0.0  # not top level
    stdio = Problem(task="t", id="1", prompt="", answer="", meta={"tests": {"kind": "stdio", "cases": []}})
    assert code_format(stdio, "```python\nprint(input())\n```") == 1.0


class ScriptedSandbox:
    """Answers test_many from a queue of TestResult statuses per call, recording the specs."""

    def __init__(self, rounds):
        self.rounds, self.calls = list(rounds), []

    def test_many(self, specs):
        self.calls.append(specs)
        statuses = self.rounds.pop(0)
        return [TestResult.from_cases([CaseResult(s, 0.0) for s in status]) for status in statuses]


def _code_problem(i=0):
    tests = {"kind": "call", "entry_point": "add",
             "cases": [{"args": [1, 2], "expected": 3}, {"args": [2, 2], "expected": 4}]}
    return Problem(task="code", id=str(i), prompt="write add", answer="", meta={"tests": tests})


def _rollouts(texts):
    return [Rollout(None, [1], [2], [0.0], text, "stop", 0) for text in texts]


ADD = "```python\ndef add(a, b):\n    return a + b\n```"


def _adds(n):
    """``n`` different programs (the same function, each with its own comment)."""
    return [ADD.replace("return", f"# version {i}\n    return") for i in range(n)]


def test_code_credit_all_or_fraction_and_no_code_scores_zero_without_running():
    for credit, expected in (("all", [1.0, 0.0, 0.0]), ("fraction", [1.0, 0.5, 0.0])):
        reward = CodeReward(credit=credit)
        reward._sandbox = ScriptedSandbox([[["passed", "passed"], ["passed", "wrong_answer"]]])
        results = reward.score_batch([_code_problem()] * 3, _rollouts([*_adds(2), "no code, sorry"]))
        assert [r.score for r in results] == expected
        assert len(reward._sandbox.calls[0]) == 2          # the one without code never ran
        assert results[2].diagnostics == {"no_code": 1}


def test_unfenced_answers_run_only_when_the_reward_is_built_unfenced():
    bare, prose = "def add(a, b):\n    return a + b\nThat is all.", "a plus b"
    strict = CodeReward()
    strict._sandbox = ScriptedSandbox([])
    assert [r.diagnostics for r in strict.score_batch([_code_problem()] * 2, _rollouts([bare, prose]))] == \
        [{"no_code": 1}, {"no_code": 1}]
    lenient = build_reward("code", {"unfenced": True})
    lenient._sandbox = ScriptedSandbox([[["passed", "passed"]]])
    results = lenient.score_batch([_code_problem()] * 2, _rollouts([bare, prose]))
    assert [r.score for r in results] == [1.0, 0.0]
    assert [spec.code for spec in lenient._sandbox.calls[0]] == ["def add(a, b):\n    return a + b\n"]


def test_a_sandbox_fault_is_retried_then_reported_as_an_error_never_as_a_wrong_answer():
    reward = CodeReward(retries=1)
    reward._sandbox = ScriptedSandbox([
        [["passed", "passed"], ["sandbox_error", "passed"], ["sandbox_error"]],
        [["passed", "passed"], ["sandbox_error"]],  # retry: the first recovers, the second does not
    ])
    results = reward.score_batch([_code_problem()] * 3, _rollouts(_adds(3)))
    assert [len(specs) for specs in reward._sandbox.calls] == [3, 2]
    assert [r.score for r in results[:2]] == [1.0, 1.0]
    assert results[2].error == "sandbox_error"


def test_a_program_written_twice_for_one_problem_runs_once_and_both_get_its_verdict():
    """A group's samples often repeat a program word for word (more so as the policy sharpens):
    each distinct program of a problem runs once per batch."""
    other = ADD.replace("a + b", "a - b")
    reward = CodeReward(credit="fraction")
    reward._sandbox = ScriptedSandbox([[["passed", "passed"], ["passed", "wrong_answer"], ["passed", "passed"]]])
    problems = [_code_problem(0)] * 4 + [_code_problem(1)]
    results = reward.score_batch(problems, _rollouts([ADD, other, ADD, other, ADD]))
    assert [len(specs) for specs in reward._sandbox.calls] == [3]  # (0, ADD), (0, other), (1, ADD)
    assert [r.score for r in results] == [1.0, 0.5, 1.0, 0.5, 1.0]


def test_a_code_problem_without_tests_is_an_error_naming_it():
    reward = CodeReward()
    reward._sandbox = ScriptedSandbox([])
    problem = Problem(task="code", id="7", prompt="", answer="")
    with pytest.raises(ValueError, match=r"problem code/7 has no meta\['tests'\]"):
        reward.score_batch([problem], _rollouts(["```python\nx=1\n```"]))


def test_code_options_are_checked_when_built():
    with pytest.raises(ValueError, match="options.credit='most': expected .*Input should be 'all' or 'fraction'"):
        build_reward("code", {"credit": "most"})
    with pytest.raises(ValueError, match="reward 'code' has no option 'nosuch'"):
        build_reward("code", {"nosuch": 1})
    for ready in (-1, 65):  # refused before the sandbox starts, not at the first scoring
        with pytest.raises(ValueError, match=f"ready must be between 0 and 64, got {ready}"):
            build_reward("code", {"ready": ready})


@pytest.mark.parametrize("options, expected", [
    ({"timeout_s": -1}, r"timeout_s must be a number of seconds in \(0, 600\], got -1"),
    ({"timeout_s": float("nan")}, r"timeout_s must be a number of seconds in \(0, 600\], got nan"),
    ({"timeout_s": 1e9}, r"timeout_s must be a number of seconds in \(0, 600\], got 1000000000.0"),
    ({"memory_mb": 0}, r"memory_mb must be an integer in \[16, 65536\], got 0"),
    ({"memory_mb": 100000}, r"memory_mb must be an integer in \[16, 65536\], got 100000"),
    ({"memory_mb": 256.5}, r"options.memory_mb=256.5: expected int"),
    ({"workers": -1}, r"workers must be between 0 \(one per core\) and 64, got -1"),
    ({"workers": 1000}, r"workers must be between 0 \(one per core\) and 64, got 1000"),
    ({"isolation": "bogus"}, r"isolation must be one of auto, namespaces, landlock, bwrap, none, got 'bogus'"),
    ({"language": "cobol"}, r"language 'cobol' is not supported"),
    ({"language": "cobol", "url": "http://127.0.0.1:9"}, r"language 'cobol' is not supported; known: python, cpp"),
    ({"retries": -1}, r"retries must be 0 or more"),
    ({"unfenced": "maybe"}, r"options.unfenced='maybe': expected bool"),
])
def test_a_code_option_the_sandbox_would_refuse_is_refused_when_the_reward_is_built(options, expected):
    """Each of these was taken at build time and failed at the first scoring, after the model
    loaded (``retries: -1`` never sent a program, and read as a grader outage; ``unfenced:
    maybe`` read as true); a service's URL is not asked when its options are refused."""
    with pytest.raises(ValueError, match=expected):
        build_reward("code", options)


def test_two_problems_sharing_a_key_but_not_their_tests_each_run_the_program():
    """A problem's key need not tell its hidden tests apart (a procedural task may draw two
    problems with one key and other cases): a verdict is shared only for the same tests."""
    other_tests = {"kind": "call", "entry_point": "add", "cases": [{"args": [5, 5], "expected": 11}]}
    twin = Problem(task="code", id="0", prompt="write add", answer="", meta={"tests": other_tests})
    reward = CodeReward()
    reward._sandbox = ScriptedSandbox([[["passed", "passed"], ["wrong_answer"]]])
    results = reward.score_batch([_code_problem(0), twin], _rollouts([ADD, ADD]))
    assert [len(specs) for specs in reward._sandbox.calls] == [2]
    assert [r.score for r in results] == [1.0, 0.0]


def test_a_problems_tests_are_parsed_once_however_many_completions_are_scored_against_them(monkeypatch):
    """A group's completions are scored against one test dict, and a dataset's problems come
    back step after step: each dict is parsed once, and another dict, equal or not, is parsed
    for itself."""
    import tempering.rewards.code as code

    parsed, real = [], code.TestSpec.from_dict
    monkeypatch.setattr(code.TestSpec, "from_dict", lambda data: parsed.append(data) or real(data))
    problem, twin = _code_problem(0), _code_problem(0)  # equal, not the same dict
    reward = CodeReward()
    reward._sandbox = ScriptedSandbox([[["passed", "passed"]], [["passed", "passed"]]])
    first = reward.score_batch([problem] * 4 + [twin] * 4, _rollouts([ADD] * 8))
    again = reward.score_batch([problem] * 4, _rollouts([ADD] * 4))
    assert len(parsed) == 2, parsed
    assert [len(specs) for specs in reward._sandbox.calls] == [1, 1]  # equal tests, one job
    assert [r.score for r in first + again] == [1.0] * 12
