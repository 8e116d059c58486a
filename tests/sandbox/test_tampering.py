"""What the parent sees a program do to its harness (``TestResult.tampering``), from the
runs themselves: fake messages on the result channel and exits before the checks ran,
however the source spells them; honest programs, failing ones included, show nothing."""

import textwrap
import threading

import pytest

from tempering.sandbox import CallCase, SandboxClient, StdioCase, Tests, TestSpec
from tempering.sandbox.server import SandboxHTTPServer

ADD = Tests("call", (CallCase([1, 2], 3), CallCase([3, 4], 7)), "add")
DONE = "b'{\"done\": true}\\n'"


def _call(code):
    return TestSpec("python", textwrap.dedent(code), ADD, 2.0, 256)


CALL_PROGRAMS = {  # name: (code, tampering seen, cases passed)
    "honest": ("def add(a, b):\n    return a + b", (), 2),
    "wrong": ("def add(a, b):\n    return a - b", (), 0),
    "crash-at-import": ("raise ValueError('no')\ndef add(a, b):\n    return a + b", (), 0),
    "sys.exit-in-a-case": ("import sys\ndef add(a, b):\n    sys.exit(0)", (), 0),
    "exit-1-at-import": ("import os\nos._exit(1)", (), 0),
    "exit-0-at-import": ("import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b", ("early_exit",), 0),
    "os._exit-in-a-case": ("import os\ndef add(a, b):\n    os._exit(0)", ("early_exit",), 0),
    "fake-reports": ("import os, json\nfor i in range(2):\n"
                     "    os.write(3, (json.dumps({'case': i, 'value': 42}) + '\\n').encode())\n"
                     "def add(a, b):\n    return -1", ("result_channel",), 0),
    "not-json-but-right": ("import os\nos.write(3, b'hello\\n')\ndef add(a, b):\n    return a + b",
                           ("result_channel",), 2),
    "done-then-exit-by-getattr": (f"import os\ngetattr(os, 'wri' + 'te')(3, {DONE})\n"
                                  "getattr(os, '_ex' + 'it')(0)", ("result_channel", "early_exit"), 0),
    "done-through-fdopen": ("import os\nwith os.fdopen(3, 'w') as f:\n    f.write('{\"done\": true}\\n')\n"
                            "def add(a, b):\n    return -1", ("result_channel",), 0),
}


@pytest.mark.parametrize("name", sorted(CALL_PROGRAMS))
def test_call_runs_report_what_the_program_did(executor, name):
    code, seen, passed = CALL_PROGRAMS[name]
    result = executor.test(_call(code))
    assert (result.tampering, result.passed) == (seen, passed), result


def test_a_report_written_ahead_of_the_runner_is_seen_and_judged_by_its_value(executor):
    """The parent takes the first report of a case, so a program can get its own in first:
    the runner's ``start`` that follows shows it, and the value is judged all the same."""
    code = ("import os, json\nos.write(3, (json.dumps({'start': 0}) + '\\n').encode())\n"
            "os.write(3, (json.dumps({'case': 0, 'value': 99}) + '\\n').encode())\n"
            "def add(a, b):\n    return a + b")
    result = executor.test(_call(code))
    assert result.tampering == ("result_channel",), result
    assert [case.status for case in result.cases] == ["wrong_answer", "passed"], result


def test_stdio_runs_report_any_result_channel_line(executor):
    cases = (StdioCase("2", "4"),)
    honest = TestSpec("python", "print(int(input()) * 2)", Tests("stdio", cases), 2.0, 256)
    forged = TestSpec("python", f"import os\nos.write(3, {DONE})\nprint(5)", Tests("stdio", cases), 2.0, 256)
    honest_result, forged_result = executor.test_many([honest, forged])
    assert (honest_result.status, honest_result.tampering) == ("passed", ())
    assert (forged_result.status, forged_result.tampering) == ("failed", ("result_channel",))


def test_program_checks_report_exits_before_their_end_but_not_a_single_forged_done(executor):
    """A program check trusts the program's own ``done``: one forged and followed by an exit
    looks like the runner's (the verdict says ``program``); a second one, or an exit without
    any, shows."""
    def program(code):
        return executor.test(TestSpec("python", code, Tests("program"), 2.0, 256))

    assert program("x = 1").tampering == ()
    assert program("import sys\nsys.exit(0)\nassert False").tampering == ("early_exit",)
    twice = program(f"import os\nos.write(3, {DONE})\nassert True")
    assert (twice.status, twice.tampering) == ("passed", ("result_channel",))
    once = program(f"import os\nos.write(3, {DONE})\nos._exit(0)\nassert False")
    assert (once.status, once.verdict, once.tampering) == ("passed", "program", ())


def test_tampering_crosses_the_http_service(executor):
    server = SandboxHTTPServer(executor, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = _call(CALL_PROGRAMS["done-then-exit-by-getattr"][0])
        with SandboxClient(server.url) as client:
            remote, = client.test_many([spec])
    finally:
        server.shutdown()
        server.server_close()
    assert remote.tampering == ("result_channel", "early_exit") == executor.test(spec).tampering
