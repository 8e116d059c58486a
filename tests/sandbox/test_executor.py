"""The executor and harnesses on well-behaved programs: statuses, languages, verdicts."""

import asyncio
import math

import pytest

from tempering.sandbox import (LANGUAGES, CallCase, Executor, Limits, RunRequest,
                               SandboxUnavailable, SpecError, StdioCase, Tests, TestSpec,
                               choose_isolation, humaneval_spec)
from tempering.sandbox import _codec
from tempering.sandbox.harness import normalize_output
from tempering.sandbox.humaneval import call_cases
from tempering.sandbox.spec import values_match


def needs(language):
    return pytest.mark.skipif(not LANGUAGES[language].available(),
                              reason=f"{LANGUAGES[language].tool} is not installed")


def test_run_reports_stdout_stderr_and_exit_code(executor):
    result = executor.run(RunRequest("import sys\nprint(input()[::-1])\nprint('e', file=sys.stderr)\nsys.exit(3)",
                                     stdin="abc"))
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("runtime_error", 3, "cba\n", "e\n")
    assert result.wall_s > 0 and result.cpu_s >= 0 and result.signal is None


def test_large_stdin_and_output_round_trip(executor):
    text = "x" * 300_000
    result = executor.run(RunRequest("import sys\nsys.stdout.write(sys.stdin.read())", stdin=text))
    assert result.status == "ok" and result.stdout == text


def test_each_run_gets_fresh_pipe_streams(executor):
    """The streams a Python run finds were made once in the worker: they must still be the
    run's pipes (not seekable, as ``python solution.py < file`` is not either), UTF-8, stderr
    line-buffered, ``sys.__stdin__`` the same object, and unused by any earlier run (a run
    that reads half its stdin and leaves text unflushed changes nothing for the next)."""
    code = ("import sys\nhead = sys.stdin.read(3)\nprint(head, sys.stdin.read(), sys.stdin.seekable(),"
            " sys.stdout.seekable(), sys.stderr.line_buffering, sys.stdin.encoding,"
            " sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__)\nsys.stdout.write('no newline')")
    first, second = executor.run_many([RunRequest(code, stdin="αβγδ\n"), RunRequest(code, stdin="xyz")])
    assert first.stdout == "αβγ δ\n False False True utf-8 True True\nno newline"
    assert second.stdout == "xyz  False False True utf-8 True True\nno newline"


def test_same_program_same_result(executor):
    """Hash seed, random seed, environment, cwd and locale are fixed."""
    code = ("import os, random, locale\nprint(hash('tempering'), random.random(), os.getcwd(),"
            " sorted(os.environ.items()), locale.getpreferredencoding(), {'b', 'a', 'c'})")
    outputs = {result.stdout for result in executor.run_many([RunRequest(code)] * 6)}
    assert len(outputs) == 1


@needs("cpp")
def test_cpp_compiles_and_runs_per_case(executor):
    code = "#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a*b<<std::endl;}"
    spec = TestSpec("cpp", code, Tests("stdio", (StdioCase("6 7", "42"), StdioCase("2 2", "5"))), 5.0, 256)
    result = executor.test(spec)
    assert [c.status for c in result.cases] == ["passed", "wrong_answer"]


@needs("cpp")
def test_cpp_compile_error_is_reported(executor):
    result = executor.run(RunRequest("int main( {", "cpp"))
    assert result.status == "compile_error" and "error" in result.stderr


@needs("javascript")
def test_javascript_runs(executor):
    result = executor.run(RunRequest("console.log([1,2,3].map(x => x * 2).join(' '))", "javascript"))
    assert result.status == "ok" and result.stdout == "2 4 6\n", result


@needs("bash")
def test_bash_runs(executor):
    result = executor.run(RunRequest("read x; echo $((x + 1))", "bash", stdin="41\n"))
    assert result.stdout == "42\n", result


def test_unknown_language_names_what_is_available(executor):
    with pytest.raises(SpecError, match="available: python"):
        executor.run(RunRequest("x", "cobol"))


def test_stdio_normalizes_trailing_whitespace_only(executor):
    spec = TestSpec("python", "print('a  \\r\\nb')\nprint()\nprint()",
                    Tests("stdio", (StdioCase("", "a\nb"), StdioCase("", "a\n b"))), 2.0, 256)
    assert [c.status for c in executor.test(spec).cases] == ["passed", "wrong_answer"]
    assert normalize_output("x \t\n\ny\n\n\n") == "x\n\ny"


def test_call_case_timeout_does_not_sink_the_others(executor):
    code = "def f(n):\n    while n == 2:\n        pass\n    return n * 10"
    cases = tuple(CallCase([n], n * 10) for n in (1, 2, 3, 4))
    result = executor.test(TestSpec("python", code, Tests("call", cases, "f"), 1.0, 256))
    assert [c.status for c in result.cases] == ["passed", "timeout", "passed", "passed"]
    assert (result.status, result.passed, result.total) == ("failed", 3, 4)


def test_call_statuses_per_case(executor):
    code = ("def f(kind):\n    if kind == 'raise': raise ValueError(kind)\n"
            "    if kind == 'memory': return bytearray(1 << 31)\n    return kind")
    cases = (CallCase(["ok"], "ok"), CallCase(["raise"], None), CallCase(["memory"], None),
             CallCase(["wrong"], "right"))
    result = executor.test(TestSpec("python", code, Tests("call", cases, "f"), 2.0, 256))
    assert [c.status for c in result.cases] == ["passed", "runtime_error", "memory_limit", "wrong_answer"]


def test_missing_entry_point_fails_every_case(executor):
    spec = TestSpec("python", "def g(): pass", Tests("call", (CallCase([], 1),) * 2, "f"), 2.0, 256)
    result = executor.test(spec)
    assert [c.status for c in result.cases] == ["runtime_error"] * 2


def test_call_tests_need_python(executor):
    with pytest.raises(SpecError, match="need language 'python'"):
        executor.test(TestSpec("bash", "echo", Tests("call", (CallCase([], 1),), "f")))


def test_async_batch_keeps_order(executor):
    requests = [RunRequest(f"print({i})") for i in range(8)]
    results = asyncio.run(executor.arun_many(requests))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]


@pytest.mark.parametrize("value", [
    1, -2 ** 80, 1.5, float("inf"), True, None, "ü", [1, (2, 3)], {"a": {1, 2}},
    {(1, 2): frozenset({3})}, b"\x00\xff", 1 + 2j, [], {},
])
def test_codec_round_trip(value):
    assert _codec.loads(_codec.dumps(value)) == value
    assert type(_codec.loads(_codec.dumps(value))) is type(value)


def test_codec_refuses_subclasses_and_untagged_objects():
    class Sneaky(int):
        pass
    with pytest.raises(TypeError):
        _codec.encode(Sneaky(1))
    with pytest.raises(ValueError):
        _codec.decode({"t": [1], "d": []})
    assert math.isnan(_codec.decode({"x": "nan"}))


@pytest.mark.parametrize("case, actual, ok", [
    (CallCase([], [1, 2]), (1, 2), True),
    (CallCase([], 1), True, False),
    (CallCase([], {"a": [1]}), {"a": (1,)}, True),
    (CallCase([], (1, 2), "eq"), [1, 2], False),
    (CallCase([], 1, "eq"), True, True),
    (CallCase([], 0.3, "approx", 1e-6), 0.1 + 0.2, True),
    (CallCase([], None, "truthy"), [0], True),
    (CallCase([], None, "falsy"), "", True),
    (CallCase([], [1, 2], "root", 1e-4), -0.5, True),
    (CallCase([], [1, 2], "root", 1e-4), 0.5, False),
    (CallCase([], [0, 0, 1], "root", 1e-4), 1e200, False),  # overflows: no tolerance takes it
    (CallCase([], [1, 2], "root", 1e-4), "-0.5", False),
])
def test_value_comparison(case, actual, ok):
    assert values_match(case, actual) is ok


def test_humaneval_asserts_become_call_cases():
    test = ("METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2]) == (3, 2 * 5)\n"
            "    assert True\n    assert abs(candidate([0.5]) - 2.0/3.0) < 1e-6\n    assert not candidate([])\n")
    cases = call_cases(test)
    assert [(c.args, c.expected, c.compare) for c in cases] == [
        ([[1, 2]], (3, 10), "eq"), ([[0.5]], 2.0 / 3.0, "approx"), ([[]], None, "falsy")]


def test_humaneval_falls_back_to_a_marked_program_verdict():
    problem = {"prompt": "def f(x):\n", "entry_point": "f",
               "test": "import random\ndef check(candidate):\n    for _ in range(3):\n        assert candidate(1) == 1\n"}
    spec = humaneval_spec(problem, "    return x\n")
    assert spec.tests.kind == "program" and spec.code.rstrip().endswith("check(f)")


def test_spec_errors_name_the_field():
    with pytest.raises(SpecError, match="tests.cases\\[0\\] needs 'expected'"):
        TestSpec.from_dict({"code": "", "tests": {"kind": "call", "entry_point": "f", "cases": [{"args": []}]}})
    with pytest.raises(SpecError, match="timeout_s"):
        TestSpec.from_dict({"code": "", "timeout_s": -1, "tests": {"kind": "stdio", "cases": []}})
    with pytest.raises(SpecError, match="tests.cases\\[0\\].expected must be a list of 1 to 1000 numbers"):
        TestSpec.from_dict({"code": "", "tests": {"kind": "call", "entry_point": "f",
                                                  "cases": [{"args": [], "expected": 3, "compare": "root"}]}})
    with pytest.raises(SpecError, match="memory_mb"):
        Limits(memory_mb=1)


def test_isolation_choice_explains_itself(monkeypatch):
    from tempering.sandbox import executor as executor_module

    monkeypatch.setattr(executor_module.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(executor_module.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="install the 'bubblewrap' package.*isolation='none'"):
        choose_isolation("auto")
    assert choose_isolation("none") == "none"
    monkeypatch.setattr(executor_module.os, "geteuid", lambda: 0)
    with pytest.raises(SandboxUnavailable, match="as root use 'namespaces'"):
        choose_isolation("bwrap")


def test_unisolated_mode_runs_when_asked():
    with Executor(workers=1, isolation="none") as pool:
        assert pool.run(RunRequest("print(6 * 7)")).stdout == "42\n"


def test_closing_twice_returns_at_once_and_a_closed_code_reward_starts_a_new_pool():
    """A second close (a user's, then the exit hook the shared graders register) used to wait
    forever for slots the first close had already taken."""
    import threading

    from tempering.rewards.code import CodeReward

    pool = Executor(workers=1)
    assert pool.run(RunRequest("print(1)")).stdout == "1\n"
    pool.close()
    second = threading.Thread(target=pool.close, daemon=True)
    second.start()
    second.join(10)
    assert not second.is_alive(), "a second Executor.close() hung"

    reward = CodeReward(workers=1)
    first = reward.sandbox()
    reward.close()
    closing = threading.Thread(target=reward.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive(), "a second CodeReward.close() hung"
    assert reward.sandbox() is not first
    reward.close()
