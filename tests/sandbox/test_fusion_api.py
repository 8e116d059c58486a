"""SandboxFusion's official client (``sandbox-fusion``) against ``temper sandbox serve``.

Every call the client offers, each asserting what a real SandboxFusion answers: its status
labels, the return codes of failed and killed programs, compile results, files in and out,
and the service's own memory limit for what the client cannot send. The service is the
``serve`` command as a subprocess on 127.0.0.1, its token in the endpoint's path (the
client sends no headers).
"""

import asyncio
import base64
import json
import time
import urllib.error
import urllib.request

import pytest
from sandbox_fusion import (RunCodeRequest, SubmitRequest, SummaryMapping, TestConfig,
                            get_prompt_by_id, get_prompt_by_id_async, get_prompts,
                            get_prompts_async, run_code, run_code_async, run_concurrent,
                            run_concurrent_pure, run_jupyter, run_jupyter_async, set_dataset_endpoint,
                            set_endpoint, set_sandbox_endpoint, submit, submit_async, submit_safe,
                            submit_safe_async, summary_run_code_result)
from sandbox_fusion import config as fusion_config
from sandbox_fusion.models import GetPromptByIdRequest, GetPromptsRequest, RunJupyterRequest

from tempering.sandbox import LANGUAGES
from tempering.sandbox.fusion import FUSION_LANGUAGES
from tempering.sandbox.languages import offered

TOKEN = "fusion-token-3b9d"
SERVICE_MEMORY_MB = 256
MAPPING = SummaryMapping(Success="ok", Failed="failed", CompileFailed="compile_failed",
                         CompileTimeout="compile_timeout", RunFailed="run_failed",
                         RunTimeout="run_timeout")


@pytest.fixture(scope="module")
def endpoint(bench_module):
    bench = bench_module("sandbox_load")
    process, url = bench.start_server(workers=2, token=TOKEN,
                                      extra=("--memory-mb", str(SERVICE_MEMORY_MB)))
    yield f"{url}/{TOKEN}"
    assert bench.stop_server(process) == 0


def _run(endpoint, **fields):
    """One call as users make it: default retries, so a SandboxError or HTTP error raises."""
    return run_code(RunCodeRequest(**fields), endpoint=endpoint)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# code -> (top status, run_result status, return code, summary), as SandboxFusion gives them
PROGRAMS = {
    "clean": ("print(input())", "Success", "Finished", 0, "ok"),
    "exit-3": ("import sys\nsys.exit(3)", "Failed", "Finished", 3, "run_failed"),
    "exception": ("raise ValueError('no')", "Failed", "Finished", 1, "run_failed"),
    "segfault": ("import ctypes\nctypes.string_at(0)", "Failed", "Finished", -11, "run_failed"),
    "sigkill": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "Failed", "Finished", -9,
                "run_failed"),
    "timeout": ("while True:\n    pass", "Failed", "TimeLimitExceeded", None, "run_timeout"),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_statuses_and_return_codes_are_sandboxfusions(endpoint, name):
    code, status, run_status, return_code, summary = PROGRAMS[name]
    answer = _run(endpoint, code=code, language="python", stdin="7", run_timeout=1)
    assert (answer.status, answer.run_result.status, answer.run_result.return_code) == (
        status, run_status, return_code), answer
    assert answer.compile_result is None
    assert summary_run_code_result(answer, MAPPING) == summary
    if name == "clean":
        assert (answer.run_result.stdout, answer.message) == ("7\n", "")


def test_output_over_a_mebibyte_is_cut_and_the_run_reported_as_it_ended(endpoint):
    """SandboxFusion keeps the first MiB and lets the program finish (it was killed, -9)."""
    code = "import sys\nprint('x' * (3 << 20))\nprint('more', file=sys.stderr)\nsys.exit(3)"
    answer = _run(endpoint, code=code, language="python")
    assert (answer.status, answer.run_result.status, answer.run_result.return_code) == (
        "Failed", "Finished", 3), answer.message
    assert len(answer.run_result.stdout) == 1 << 20 and answer.run_result.stderr == ""
    assert "left out" in answer.message
    clean = _run(endpoint, code="print('x' * (2 << 20))", language="python")
    assert (clean.status, clean.run_result.return_code, len(clean.run_result.stdout)) == (
        "Success", 0, 1 << 20)
    assert summary_run_code_result(clean, MAPPING) == "ok"


def test_compile_results_and_compile_timeout(endpoint):
    good = _run(endpoint, code="#include <cstdio>\nint main() { std::puts(\"hi\"); }", language="cpp")
    assert (good.status, good.compile_result.status, good.compile_result.return_code) == (
        "Success", "Finished", 0)
    assert (good.run_result.return_code, good.run_result.stdout) == (0, "hi\n")
    bad = _run(endpoint, code="int main() { return missing; }", language="cpp")
    assert (bad.status, bad.compile_result.status, bad.run_result) == ("Failed", "Finished", None)
    assert bad.compile_result.return_code != 0 and "missing" in bad.compile_result.stderr
    assert summary_run_code_result(bad, MAPPING) == "compile_failed"
    slow = _run(endpoint, code="#include <iostream>\nint main() { std::cout << 1; }", language="cpp",
                compile_timeout=0.05)
    assert (slow.status, slow.compile_result.status, slow.run_result) == (
        "Failed", "TimeLimitExceeded", None)
    assert summary_run_code_result(slow, MAPPING) == "compile_timeout"


def _skip_unless_offered(language):
    if not LANGUAGES[language].available():
        pytest.skip(f"{language} has no toolchain the sandbox can run on this machine")


@pytest.mark.parametrize("language, code", [
    ("nodejs", "console.log(6 * 7)"),
    ("bash", "echo $((6 * 7))"),
    ("java", "public class Main { public static void main(String[] a) { System.out.println(6 * 7); } }"),
])
def test_other_languages(endpoint, language, code):
    _skip_unless_offered({"nodejs": "javascript"}.get(language, language))
    answer = _run(endpoint, code=code, language=language, run_timeout=20, compile_timeout=20)
    assert (answer.status, answer.run_result.return_code, answer.run_result.stdout) == (
        "Success", 0, "42\n"), answer


def test_pytest_runs_the_programs_tests(endpoint):
    _skip_unless_offered("pytest")
    passing = _run(endpoint, code="def test_yes():\n    assert 6 * 7 == 42\n", language="pytest",
                   run_timeout=20)
    assert (passing.status, passing.run_result.return_code) == ("Success", 0), passing
    failing = _run(endpoint, code="def test_no():\n    assert 6 * 7 == 41\n", language="pytest",
                   run_timeout=20)
    assert (failing.status, failing.run_result.return_code) == ("Failed", 1)
    assert "1 failed" in failing.run_result.stdout


def test_pytest_takes_the_requests_args(endpoint):
    """SandboxFusion runs ``pytest FILE *args``; the official client cannot send ``args``."""
    _skip_unless_offered("pytest")
    code = "def test_good():\n    assert True\n\ndef test_bad():\n    assert False\n"
    status, answer = _post(endpoint, {"code": code, "language": "pytest", "run_timeout": 20,
                                      "args": ["-k", "good"]})
    assert (status, answer["status"], answer["run_result"]["return_code"]) == (200, "Success", 0), answer
    assert "1 passed, 1 deselected" in answer["run_result"]["stdout"]
    status, answer = _post(endpoint, {"code": code, "language": "pytest", "args": "-k good"})
    assert status == 400 and "'args'" in answer["error"], answer


def test_a_language_this_machine_lacks_fails_at_once(endpoint):
    lacking = sorted(FUSION_LANGUAGES - set(offered()) - {"nodejs"})
    started = time.monotonic()
    answer = _run(endpoint, code="package main", language=lacking[0])
    assert time.monotonic() - started < 5  # no retries: the client got no error to retry
    assert (answer.status, answer.compile_result, answer.run_result) == ("Failed", None, None)
    assert repr(lacking[0]) in answer.message and "python" in answer.message
    assert summary_run_code_result(answer, MAPPING) == "failed"


def test_the_services_memory_limit_applies_to_what_the_client_cannot_send(endpoint):
    hungry = f"block = bytearray({SERVICE_MEMORY_MB + 100} << 20)\nprint('allocated')"
    answer = _run(endpoint, code=hungry, language="python")
    assert (answer.status, answer.run_result.return_code) == ("Failed", 1)
    assert "memory_limit" in answer.message
    modest = _run(endpoint, code=f"block = bytearray({SERVICE_MEMORY_MB // 4} << 20)\nprint('ok')",
                  language="python")
    assert (modest.status, modest.run_result.stdout) == ("Success", "ok\n")


def test_a_larger_memory_limit_than_the_service_cap_gets_the_cap(endpoint):
    hungry = f"block = bytearray({SERVICE_MEMORY_MB + 100} << 20)\nprint('allocated')"
    status, answer = _post(endpoint, {"code": hungry, "language": "python", "memory_limit_MB": 4096})
    assert (status, answer["status"]) == (200, "Failed") and "memory_limit" in answer["message"], answer


def test_a_python_program_imports_a_module_sent_in_files(endpoint):
    """``python solution.py`` puts the program's folder first on sys.path, as SandboxFusion runs it."""
    answer = _run(endpoint, code="import helper\nfrom pkg.inner import y\nprint(helper.x + y)",
                  language="python", files={"helper.py": _b64(b"x = 40\n"), "pkg/__init__.py": _b64(b""),
                                            "pkg/inner.py": _b64(b"y = 2\n")})
    assert (answer.status, answer.run_result.stdout) == ("Success", "42\n"), answer


def test_files_in_and_fetch_files_out(endpoint):
    blob = bytes(range(256)) * 3
    code = ("import pathlib\n"
            "n = int(pathlib.Path('data/in.txt').read_text())\n"
            "pathlib.Path('out/result.txt').parent.mkdir()\n"
            "pathlib.Path('out/result.txt').write_text(str(n * 2))\n"
            "print(len(pathlib.Path('blob.bin').read_bytes()))")
    answer = _run(endpoint, code=code, language="python",
                  files={"data/in.txt": _b64(b"21"), "blob.bin": _b64(blob)},
                  fetch_files=["out/result.txt", "blob.bin", "never-written.txt"])
    assert (answer.status, answer.run_result.stdout) == ("Success", f"{len(blob)}\n"), answer
    assert {name: base64.b64decode(data) for name, data in answer.files.items()} == {
        "out/result.txt": b"42", "blob.bin": blob}
    big = _run(endpoint, code="open('big.bin', 'wb').write(bytes(9 << 20))", language="python",
               fetch_files=["big.bin"])
    assert (big.status, big.files) == ("Success", {}) and "left out: big.bin" in big.message
    header = _run(endpoint, language="cpp", files={"answer.h": _b64(b"#define ANSWER 42\n")},
                  code='#include <cstdio>\n#include "answer.h"\nint main() { std::printf("%d", ANSWER); }')
    assert (header.status, header.run_result.stdout) == ("Success", "42")


def test_run_concurrent_helpers_and_the_async_client(endpoint):
    requests = [RunCodeRequest(code=f"print({i} * 2)", language="python") for i in range(40)]
    answers = run_concurrent(run_code, kwargs=[{"request": r, "endpoint": endpoint} for r in requests],
                             concurrency=40)
    assert [a.run_result.stdout for a in answers] == [f"{i * 2}\n" for i in range(40)]
    pure = run_concurrent_pure([lambda r=r: run_code(r, endpoint=endpoint) for r in requests[:8]])
    assert [a.status for a in pure] == ["Success"] * 8

    async def all_async():
        return await asyncio.gather(*(run_code_async(r, endpoint=endpoint) for r in requests[:20]))
    assert [a.run_result.stdout for a in asyncio.run(all_async())] == [f"{i * 2}\n" for i in range(20)]


def test_set_endpoint_calls(endpoint, monkeypatch):
    for name in ("SANDBOX_ENDPOINT", "DATASET_ENDPOINT"):
        monkeypatch.setattr(fusion_config, name, getattr(fusion_config, name))
    request = RunCodeRequest(code="print('set')", language="python")
    prompts = GetPromptsRequest(dataset="mbpp", config=TestConfig())
    set_endpoint(endpoint)
    assert run_code(request).run_result.stdout == "set\n"
    with pytest.raises(Exception, match="501"):
        get_prompts(prompts)
    set_endpoint("http://127.0.0.1:9")  # nothing listens there
    set_sandbox_endpoint(endpoint)
    assert run_code(request).run_result.stdout == "set\n"
    set_dataset_endpoint(endpoint)
    with pytest.raises(Exception, match="501"):
        get_prompts(prompts)


def test_evaluation_endpoints_are_absent_with_a_clear_error(endpoint):
    config = TestConfig(provided_data={"id": 0, "content": "x", "test": "assert True"})
    submission = SubmitRequest(dataset="humaneval_python", id=0, completion="x", config=config)
    prompts = GetPromptsRequest(dataset="humaneval_python", config=config)
    prompt = GetPromptByIdRequest(dataset="humaneval_python", id=0, config=config)
    jupyter = RunJupyterRequest(cells=["1 + 1"])
    calls = {
        "not offered here": [lambda: submit(submission, endpoint=endpoint, max_attempts=1),
                             lambda: asyncio.run(submit_async(submission, endpoint=endpoint, max_attempts=1))],
        "Jupyter": [lambda: run_jupyter(jupyter, endpoint=endpoint, max_attempts=1),
                    lambda: asyncio.run(run_jupyter_async(jupyter, endpoint=endpoint, max_attempts=1))],
        "no datasets": [lambda: get_prompts(prompts, endpoint=endpoint),
                        lambda: asyncio.run(get_prompts_async(prompts, endpoint=endpoint)),
                        lambda: get_prompt_by_id(prompt, endpoint=endpoint),
                        lambda: asyncio.run(get_prompt_by_id_async(prompt, endpoint=endpoint))],
    }
    for words, attempts in calls.items():
        for call in attempts:
            with pytest.raises(Exception, match=f"501.*{words}"):
                call()
    # submit_safe turns every error into a rejection on the client's side (it logs a warning):
    # here that is the 501 above, never a verdict of this service.
    for rejected in (submit_safe(submission, endpoint=endpoint, max_attempts=1),
                     asyncio.run(submit_safe_async(submission, endpoint=endpoint, max_attempts=1))):
        assert (rejected.accepted, rejected.tests) == (False, [])


def _post(endpoint, body):
    """``(status, answer)`` of a /run_code body the official client cannot send."""
    request = urllib.request.Request(f"{endpoint}/run_code", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_requests_the_official_server_refuses_are_refused_naming_the_field(endpoint):
    def post(body):
        status, answer = _post(endpoint, body)
        return status, answer.get("error", "")
    assert post({"code": "", "language": "python", "files": {"../escape": _b64(b"x")}})[1].startswith(
        "files['../escape']")
    assert "fetch_files[0]" in post({"code": "", "language": "python", "fetch_files": ["/etc/passwd"]})[1]
    assert "base64" in post({"code": "", "language": "python", "files": {"a": "not base64!"}})[1]
    assert "compile_timeout" in post({"code": "", "language": "cpp", "compile_timeout": "10"})[1]
    assert post({"code": "print(1)", "language": "python", "memory_limit_MB": -1}) == (200, "")


@pytest.mark.parametrize("stdin", ["\ud800", "ok\udfff", 5, ["x"]])
def test_stdin_that_is_not_utf8_text_is_a_400_naming_it_at_once(endpoint, stdin):
    """A lone surrogate (JSON carries it, UTF-8 cannot) was a sandbox fault after retries that
    held a slot for seconds; a number was taken for a string."""
    started = time.monotonic()
    status, answer = _post(endpoint, {"code": "print(input())", "language": "python", "stdin": stdin})
    assert status == 400 and answer["error"].startswith("stdin must be"), answer
    assert time.monotonic() - started < 2
