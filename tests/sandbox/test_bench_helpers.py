"""Helpers of the sandbox benchmarks that decide what gets measured."""


def test_commented_exec_line_is_enabled_at_the_code_indentation(bench_module):
    source = ("def run():\n    try:\n        with guard():\n# WARNING: read this first\n"
              "#                         exec(check_program, exec_globals)\n"
              "        result = 1\n    except Exception:\n        pass\n")
    enabled = bench_module("sandbox_humaneval").enable_exec_line(source)
    assert "        with guard():\n# WARNING: read this first\n            exec(check_program, exec_globals)\n" in enabled
    compile(enabled, "enabled", "exec")


def test_active_exec_line_is_left_alone(bench_module):
    assert bench_module("sandbox_humaneval").enable_exec_line("exec(check_program, exec_globals)\n") is None
