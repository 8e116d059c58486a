"""The ``code`` reward in the real sandbox: stdio and call tests, both credit modes, and
hostile programs that try to pass without computing anything; and verl's SandboxFusion
reward functions (``verl_sandbox_fusion``, vendored unchanged) scoring through
``temper sandbox serve`` as they would through SandboxFusion."""

import http.client
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from verl_sandbox_fusion import compute_score
from verl_sandbox_fusion.utils import check_correctness

from tempering.rewards.code import CodeReward
from tempering.sandbox.server import SandboxHTTPServer
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


# verl's SandboxFusion reward functions (vendored unchanged, see verl_sandbox_fusion/README.md)
# against `temper sandbox serve`, at verl's defaults (memory_limit_mb 1024, timeout 10).
ADD_STDIO = {"inputs": ["1 2\n", "5 5\n", "20 22\n"], "outputs": ["3\n", "10\n", "42\n"]}
ADD_CALL = {"fn_name": "add", "inputs": ["1\n2", "-1\n1", "20\n22"], "outputs": ["3", "0", "42"]}
ADD_ASSERTS = {"assert_case": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
RIGHT_STDIO = _fenced("a, b = map(int, input().split())\nprint(a + b)")
RIGHT_ADD = _fenced("def add(a, b):\n    return a + b")
WRONG_ADD = _fenced("def add(a, b):\n    return a - b")


@pytest.fixture(scope="module")
def verl_url(bench_module):
    bench = bench_module("sandbox_load")
    process, url = bench.start_server(workers=2)
    yield f"{url}/run_code"
    assert bench.stop_server(process) == 0


@pytest.mark.parametrize("completion, test_cases, memory_limit_mb, expected", [
    (RIGHT_STDIO, ADD_STDIO, 1024, 1.0),
    (_fenced("print(0)"), ADD_STDIO, 1024, 0.0),
    (_fenced("raise SystemExit(input())"), ADD_STDIO, 1024, 0.0),
    (_fenced("import ctypes\nctypes.string_at(0)"), ADD_STDIO, 1024, 0.0),
    (RIGHT_ADD, ADD_CALL, 1024, 1.0),
    (WRONG_ADD, ADD_CALL, 1024, 0.0),
    (RIGHT_ADD, ADD_ASSERTS, 1024, 1.0),
    (WRONG_ADD, ADD_ASSERTS, 1024, 0.0),
    (RIGHT_STDIO, ADD_STDIO, -1, 1.0),  # SandboxFusion's own default (unlimited): the service's cap
])
def test_verl_scores_as_against_sandboxfusion(verl_url, completion, test_cases, memory_limit_mb, expected):
    score, metadata = compute_score(verl_url, None, memory_limit_mb, completion, json.dumps(test_cases))
    assert score == expected, metadata
    assert not any(case.get("api_request_error") for case in metadata), metadata


def test_verl_checks_cpp_and_tells_runtime_errors_from_wrong_answers(verl_url):
    cpp = "#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"
    results, _ = check_correctness(verl_url, ADD_STDIO, cpp, language="cpp")
    assert results == [True, True, True]
    results, metadata = check_correctness(verl_url, ADD_STDIO, "int main() { return }", language="cpp")
    assert results == [-4, -4, -4] and metadata[0]["status"] == "compile_error"
    python = "import sys\na, b = map(int, input().split())\nsys.exit(a) if a == 5 else print(a + b)"
    results, metadata = check_correctness(verl_url, ADD_STDIO, python)
    assert results == [True, -2, True] and metadata[1]["exit_code"] == 5


def test_verl_scores_right_under_a_full_queue(verl_url):
    """120 requests at once on a 2-worker service: each waits its turn, none is lost."""
    cases = {"inputs": [f"{i} {i}\n" for i in range(20)], "outputs": [f"{2 * i}\n" for i in range(20)]}
    completions = [RIGHT_STDIO, _fenced("print(-1)")] * 3
    with ThreadPoolExecutor(len(completions)) as pool:
        scored = list(pool.map(lambda c: compute_score(verl_url, None, 1024, c, cases), completions))
    assert [score for score, _ in scored] == [1.0, 0.0] * 3
    assert not any(case.get("api_request_error") for _, metadata in scored for case in metadata)


def _flood(url: str, requests: int) -> list:
    """Another client's traffic: ``requests`` short programs posted one after another on new
    connections; the statuses it got."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"code": "import time\ntime.sleep(0.2)", "run_timeout": 1})
    statuses = []
    for _ in range(requests):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/run_code", body=body)
        response = connection.getresponse()
        response.read()
        statuses.append(response.status)
        connection.close()
    return statuses


def test_verl_scores_right_under_another_clients_flood(sandbox_executor):
    """24 flooding clients on a 2-slot service that serves 8 connections at once: verl's
    requests wait their turn and its right answers score 1.0 (they got 503, which verl does
    not retry, and 504 past their run_timeout: scores of 0 to 0.6)."""
    server = SandboxHTTPServer(sandbox_executor, "127.0.0.1", 0, max_connections=8)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with ThreadPoolExecutor(24) as flood, ThreadPoolExecutor(4) as verl:
            flooded = [flood.submit(_flood, server.url, 6) for _ in range(24)]
            scored = list(verl.map(lambda c: compute_score(f"{server.url}/run_code", None, 1024, c, ADD_STDIO),
                                   [RIGHT_STDIO] * 4))
            statuses = [status for future in flooded for status in future.result()]
    finally:
        server.shutdown()
        server.server_close()
    assert [score for score, _ in scored] == [1.0] * 4, scored
    assert statuses == [200] * 24 * 6, sorted(set(statuses))
