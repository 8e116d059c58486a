"""Helpers of the sandbox benchmarks that decide what gets measured."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sandbox_humaneval.py"


def _module():
    spec = importlib.util.spec_from_file_location("sandbox_humaneval", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commented_exec_line_is_enabled_at_the_code_indentation():
    source = ("def run():\n    try:\n        with guard():\n# WARNING: read this first\n"
              "#                         exec(check_program, exec_globals)\n"
              "        result = 1\n    except Exception:\n        pass\n")
    enabled = _module().enable_exec_line(source)
    assert "        with guard():\n# WARNING: read this first\n            exec(check_program, exec_globals)\n" in enabled
    compile(enabled, "enabled", "exec")


def test_active_exec_line_is_left_alone():
    assert _module().enable_exec_line("exec(check_program, exec_globals)\n") is None
