"""The CLI contract, the HTTP service and its client, and a small load test.

Servers are started by these tests on 127.0.0.1 only: the ``serve`` command as a
subprocess (as users run it) and, where a test needs to look inside, an in-process server.
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox_helpers import sandbox_processes
from tempering.sandbox import CallCase, Limits, RunRequest, SandboxClient, Tests, TestSpec
from tempering.sandbox.client import SandboxHTTPError
from tempering.sandbox.server import SandboxHTTPServer

ROOT = Path(__file__).resolve().parents[2]
RUN_KEYS = {"status", "exit_code", "signal", "stdout", "stderr", "wall_s", "cpu_s"}
TOKEN = "test-token-7c1e"


def cli(*args, check_status=0):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "tempering.sandbox.cli", "sandbox", *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == check_status, done.stderr
    return done


def test_cli_run_prints_the_contract(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("import sys\nprint(sys.stdin.read().upper())\nsys.exit(4)")
    stdin = tmp_path / "in.txt"
    stdin.write_text("hi")
    out = json.loads(cli("run", str(program), "--stdin", str(stdin), "--timeout", "2",
                         "--memory-mb", "128", "--json").stdout)
    assert set(out) == RUN_KEYS
    assert (out["status"], out["exit_code"], out["stdout"]) == ("runtime_error", 4, "HI\n")


def test_cli_run_timeout_still_exits_zero(tmp_path):
    program = tmp_path / "loop.sh"
    program.write_text("while true; do :; done")
    out = json.loads(cli("run", str(program), "--timeout", "0.5", "--json").stdout)
    assert out["status"] == "timeout" and out["exit_code"] is None


def test_cli_test_single_and_batch(tmp_path):
    spec = {"language": "python", "code": "def f(x):\n    return x * 2", "timeout_s": 2,
            "memory_mb": 256, "tests": {"kind": "call", "entry_point": "f",
                                        "cases": [{"args": [2], "expected": 4}, {"args": [[1]], "expected": [1, 1]}]}}
    single = tmp_path / "spec.json"
    single.write_text(json.dumps(spec))
    out = json.loads(cli("test", str(single), "--json").stdout)
    assert set(out) == {"status", "passed", "total", "cases"}
    assert (out["status"], out["passed"], out["total"]) == ("passed", 2, 2)
    assert all(set(case) == {"status", "wall_s"} for case in out["cases"])
    stdio = dict(spec, tests={"kind": "stdio", "cases": [{"stdin": "1", "stdout": "1"}]}, code="print(input())")
    batch = tmp_path / "specs.jsonl"
    batch.write_text("\n".join(json.dumps(s) for s in (spec, stdio, spec)) + "\n")
    lines = cli("test", str(batch), "--json").stdout.splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["passed"] * 3


def test_cli_usage_errors_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"code": "x", "tests": {"kind": "nope"}}')
    assert "tests.kind" in cli("test", str(bad), check_status=2).stderr
    assert "cannot read" in cli("run", str(tmp_path / "missing.py"), check_status=2).stderr
    assert "without a token" in cli("serve", "--host", "0.0.0.0", check_status=2).stderr


@pytest.mark.parametrize("workers", ["-1", "0", "65", "1000"])
def test_cli_run_refuses_a_worker_count_out_of_bounds_naming_them(tmp_path, workers):
    program = tmp_path / "p.py"
    program.write_text("print(1)")
    err = cli("run", str(program), "--workers", workers, "--isolation", "none", check_status=2).stderr
    assert "Traceback" not in err and "--workers" in err and "between 1 and 64" in err


@pytest.fixture(scope="module")
def served(bench_module):
    """``temper sandbox serve`` with a token, as a subprocess on 127.0.0.1."""
    bench = bench_module("sandbox_load")
    process, url = bench.start_server(workers=2, token=TOKEN)
    yield url
    assert bench.stop_server(process) == 0


def _post(url, path, body, headers=None):
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", path, body=body, headers=headers or {})
    response = connection.getresponse()
    status, text = response.status, response.read()
    connection.close()
    return status, text


def test_run_code_is_sandboxfusion_shaped(served):
    body = json.dumps({"code": "print(input())", "language": "python", "stdin": "7",
                       "run_timeout": 2, "memory_limit_MB": 256})
    status, text = _post(served, "/run_code", body, {"Authorization": f"Bearer {TOKEN}"})
    answer = json.loads(text)
    assert status == 200 and answer["status"] == "Success"
    assert {"status", "execution_time", "return_code", "stdout", "stderr"} <= set(answer["run_result"])
    assert (answer["run_result"]["status"], answer["run_result"]["stdout"]) == ("Finished", "7\n")


def _announce_huge_body(url, headers):
    """Claim a 17 MiB body and wait for the verdict without sending it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/run_code")
    for key, value in dict(headers, **{"Content-Length": str(17 << 20)}).items():
        connection.putheader(key, value)
    connection.endheaders()
    status = connection.getresponse().status
    connection.close()
    return status


def test_service_refuses_bad_requests(served):
    assert _post(served, "/run_code", b"{}")[0] == 401
    assert _post(served, "/run_code", b"{}", {"Authorization": "Bearer wrong"})[0] == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert _post(served, "/run_code", b"not json", auth)[0] == 400
    assert _post(served, "/run_code", json.dumps({"code": 1}), auth)[0] == 400
    assert _post(served, "/nowhere", b"{}", auth)[0] == 404
    assert _announce_huge_body(served, auth) == 413


def _summary(results):
    return [(r.status, r.passed, [case.status for case in r.cases]) for r in results]


def test_client_matches_the_local_executor(served, executor):
    programs = [RunRequest("print(1/0)"), RunRequest("while True: pass", limits=Limits(timeout_s=0.5)),
                RunRequest("x = bytearray(1 << 31)", limits=Limits(memory_mb=128))]
    spec = TestSpec("python", "def f(x):\n    return -x", Tests("call", (CallCase([1], -1), CallCase([2], 2)), "f"))
    with SandboxClient(served, token=TOKEN) as client:
        assert client.health()["status"] == "ok"
        remote = [r.status for r in client.run_many(programs)]
        assert remote == [r.status for r in executor.run_many(programs)]
        assert remote == ["runtime_error", "timeout", "memory_limit"]
        remote_tests = _summary(client.test_many([spec, spec]))
        assert remote_tests == _summary(executor.test_many([spec, spec]))
        assert remote_tests == [("failed", 1, ["passed", "wrong_answer"])] * 2
    with pytest.raises(SandboxHTTPError, match="401"):
        SandboxClient(served).run(RunRequest("print(1)"))


def test_full_queue_answers_429(executor):
    server = SandboxHTTPServer(executor, "127.0.0.1", 0, max_queue=1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    statuses = []
    body = json.dumps({"code": "import time\ntime.sleep(0.5)", "run_timeout": 2})

    def send():
        statuses.append(_post(server.url, "/run_code", body)[0])
    senders = [threading.Thread(target=send) for _ in range(4)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    server.shutdown()
    server.server_close()
    assert 200 in statuses and 429 in statuses, statuses


def test_non_loopback_needs_a_token(executor):
    with pytest.raises(ValueError, match="without a token"):
        SandboxHTTPServer(executor, "0.0.0.0", 0)


def test_small_load_has_no_lost_duplicated_or_leaked(bench_module):
    """The 2,000-request version is bench/sandbox_load.py; this one asserts correctness only."""
    report = bench_module("sandbox_load").run_load_test(requests=300, concurrency=32, workers=2)
    assert (report["lost"], report["duplicated"], report["crossed"], report["errors"]) == (0, 0, 0, {}), report
    assert report["leaked_fds"] == 0 and report["leaked_processes"] == 0, report
    assert report["server_exit_status"] == 0
    time.sleep(0.2)
    assert sandbox_processes() == []


def _call_body(**case):
    return {"code": "def f(x):\n    return x", "tests": {
        "kind": "call", "entry_point": "f", "cases": [dict({"args": [1], "expected": 1}, **case)]}}


class Raw(str):
    """A request body sent as it is, not encoded as JSON."""


def _nested_args(depth):
    return Raw(json.dumps(_call_body(args=["NEST"])).replace('"NEST"', "[" * depth + "]" * depth))


# Bodies with a field of the wrong type (or not a spec at all), and the field the answer names.
MALFORMED = {
    "tolerance-string": (_call_body(compare="approx", tolerance="abc"), "tolerance"),
    "tolerance-list": (_call_body(compare="approx", tolerance=[1]), "tolerance"),
    "tolerance-negative": (_call_body(compare="approx", tolerance=-1), "tolerance"),
    "approx-expected-string": (_call_body(compare="approx", expected="1"), "expected"),
    "compare-list": (_call_body(compare=["json"]), "compare"),
    "timeout-string": (dict(_call_body(), timeout_s="5"), "timeout_s"),
    "timeout-bool": (dict(_call_body(), timeout_s=True), "timeout_s"),
    "memory-float": (dict(_call_body(), memory_mb=256.5), "memory_mb"),
    "language-number": (dict(_call_body(), language=3), "language"),
    "code-number": (dict(_call_body(), code=3), "code"),
    "tests-list": (dict(_call_body(), tests=[]), "tests.kind"),
    "cases-string": ({"code": "", "tests": {"kind": "stdio", "cases": "x"}}, "tests.cases"),
    "stdin-number": ({"code": "", "tests": {"kind": "stdio", "cases": [{"stdin": 1, "stdout": ""}]}}, "stdin"),
    "args-nested-800": (_nested_args(800), "args"),
    "args-nested-50000": (_nested_args(50000), "nested"),
    "body-null": (None, "JSON object"),
    "body-string": ("spec", "JSON object"),
    "batch-with-a-number": ([_call_body(), 5], "JSON object"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_run_tests_answers_400_naming_the_field(served, name):
    body, field = MALFORMED[name]
    body = body if isinstance(body, Raw) else json.dumps(body)
    status, text = _post(served, "/run_tests", body, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 400, text
    assert field in json.loads(text)["error"], text


def test_run_code_answers_400_for_wrongly_typed_fields(served):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for body, field in (({"code": "print(1)", "run_timeout": "2"}, "timeout_s"),
                        ({"code": "print(1)", "memory_limit_MB": True}, "memory_mb"),
                        ({"code": "print(1)", "language": ["python"]}, "language"),
                        (None, "JSON object")):
        status, text = _post(served, "/run_code", json.dumps(body), auth)
        assert status == 400 and field in json.loads(text)["error"], (body, text)


def test_non_ascii_content_length_is_refused(served):
    host, port = served.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/run_code")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Content-Length", "\u00b2")  # a digit to str.isdigit, not to int()
    connection.endheaders()
    assert connection.getresponse().status == 411
    connection.close()


def test_sigterm_stops_serve_while_the_pool_is_busy(bench_module):
    """Jobs that would run for minutes do not hold up SIGTERM; nothing is left behind."""
    bench = bench_module("sandbox_load")
    process, url = bench.start_server(workers=1)
    sleeper = json.dumps({"code": "import time\ntime.sleep(300)", "run_timeout": 120})
    batch = json.dumps([{"code": "import time\ntime.sleep(300)", "timeout_s": 120,
                         "tests": {"kind": "program"}}] * 2)
    senders = [threading.Thread(target=_post_quietly, args=(url, path, body), daemon=True)
               for path, body in (("/run_code", sleeper), ("/run_tests", batch), ("/run_code", sleeper))]
    for sender in senders:
        sender.start()
    with SandboxClient(url) as client:
        while client.health()["queued"] < 4:
            time.sleep(0.05)
    time.sleep(0.5)  # the first job is running in the slot
    assert bench.stop_server(process) == 0
    assert sandbox_processes() == []


def _post_quietly(url, path, body):
    try:
        _post(url, path, body)
    except (OSError, http.client.HTTPException):
        pass  # a request cut off by the shutdown
