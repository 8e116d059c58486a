"""The tool-use environment: the calculator's bounds, both call syntaxes, errors as
observations, and the Python tool through the real sandbox."""

import json

import pytest

from tempering.config import ConfigError
from tempering.envs.base import Environment, make_env
from tempering.envs.tools import ToolEnv, ToolError, calculate
from tempering.models.tiny import build_tokenizer
from tempering.types import Problem

TOOL_TEMPLATE = (
    "{%- if tools %}<|system|>Tools: {{ tools | map(attribute='function.name') | join(', ') }}\n{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A small chat template that renders tool definitions and tool messages (Hermes-like)."""


def _tokenizer(template=None):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize("expression, value", [
    ("47*6", "282"), ("2 + 3 * 4", "14"), ("(2 + 3) * 4", "20"), ("-5 + 2", "-3"), ("+7", "7"),
    ("10 / 4", "2.5"), ("17 // 5", "3"), ("17 % 5", "2"), ("-17 // 5", "-4"), ("2 ** 10", "1024"),
    ("2 ** -1", "0.5"), ("1.5 * 4", "6"), ("0.1 + 0.2", "0.3"), (" 12 ", "12"), ("2 ** 64", str(2**64)),
])
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("9**9**9", "exponent too large"),
    ("2 ** 100", "exponent too large"),
    ("(2 ** 64) ** 64", "number too large"),
    ("1e308 * 10", "number too large"),
    ("1" * 201, "expression too long"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "ZeroDivisionError"),
    ("5 % 0", "ZeroDivisionError"),
    ("1 +", "SyntaxError"),
    ("__import__('os').system('true')", "unsupported expression"),
    ("x + 1", "unsupported expression"),
    ("2j * 2", "unsupported expression"),
    ("True + 1", "unsupported expression"),
    ("[1] * 3", "unsupported expression"),
    ("'a' * 3", "unsupported expression"),
    ("1 < 2", "unsupported expression"),
    ("1 << 4", "unsupported expression"),
])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, message):
    with pytest.raises(ToolError, match=f"^{message}$"):
        calculate(expression)


def test_tags_syntax_runs_the_last_call_and_returns_the_result_inline():
    env = make_env("tools", {})
    assert isinstance(env, Environment)
    assert env.stop == ("</calc>",) and env.tools is None
    problem = Problem(task="mul", id="47*6", prompt="47*6\n", answer="282")
    assert env.reset(problem) == "47*6\n"
    step = env.step("first <calc>1+1</calc> then <calc>47*6</calc>")
    assert (step.observation, step.done, step.info) == ("<result>282</result>", False,
                                                       {"tool_calls": 1.0, "tool_errors": 0.0})


@pytest.mark.parametrize("turn", ["\nanswer: 282", "<calc>47*6", "<python>print(1)</python>", ""])
def test_a_turn_without_a_complete_call_of_an_enabled_tool_ends_the_episode(turn):
    step = ToolEnv(syntax="tags").step(turn)
    assert step.done and step.observation is None
    assert step.info == {"tool_calls": 0.0, "tool_errors": 0.0}


def test_errors_are_observations_counted_per_step():
    step = ToolEnv().step("<calc>1/0</calc>")
    assert (step.observation, step.done) == ("<result>error: ZeroDivisionError</result>", False)
    assert step.info == {"tool_calls": 1.0, "tool_errors": 1.0}
    assert ToolEnv(max_result_chars=8).step("<calc>10**40</calc>").observation == "<result>10000000...</result>"


def test_python_tool_runs_in_the_sandbox():
    env = ToolEnv(tools=["calculator", "python"], timeout_s=1.0, max_result_chars=50)
    assert env.stop == ("</calc>", "</python>")
    assert ToolEnv(tools="python").stop == ("</python>",)
    assert env.step("<python>print(2**10)</python>").observation == "<result>1024</result>"
    failed = env.step("<python>\nx = 1\nprint(x / 0)\n</python>")
    assert failed.observation == "<result>error: ZeroDivisionError: division by zero</result>"
    assert failed.info["tool_errors"] == 1.0
    assert env.step("<python>while True: pass</python>").observation == "<result>error: timeout</result>"
    jailed = env.step("<python>print(open('/etc/passwd').read())</python>").observation
    assert jailed.startswith(("<result>error: FileNotFoundError", "<result>error: PermissionError"))
    assert env.step("<python>print('y' * 10**6)</python>").observation == f"<result>{'y' * 50}...</result>"


def test_template_syntax_declares_the_tools_and_answers_with_tool_messages():
    tokenizer = _tokenizer(TOOL_TEMPLATE)
    env = make_env("tools", {"tools": ["calculator", "python"]}, tokenizer=tokenizer)
    assert env.stop == ("</tool_call>",)
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "python"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["expression"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "47*6?"}], tools=env.tools,
                                           tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|system|>Tools: calculator, python\n")
    step = env.step("Let me compute. " + _call("calculator", expression="47*6"))
    assert step.observation == [{"role": "tool", "content": "282"}] and not step.done
    step = env.step(_call("python", code="print(6*7)"))
    assert step.observation == [{"role": "tool", "content": "42"}]
    assert env.step("answer: 282").done


@pytest.mark.parametrize("call, error", [
    ("<tool_call>{calculator: 47*6}</tool_call>", "error: the tool call is not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", 'error: a tool call is {"name": ..., "arguments": {...}}'),
    (_call("search", query="47*6"), "error: unknown tool 'search'; tools: calculator"),
    (_call("calculator", expr="47*6"), 'error: calculator takes arguments {"expression": "..."}'),
    (_call("calculator", expression="47*"), "error: SyntaxError"),
])
def test_bad_template_calls_are_error_observations(call, error):
    step = ToolEnv(syntax="template", tokenizer=_tokenizer(TOOL_TEMPLATE)).step(call)
    assert step.observation == [{"role": "tool", "content": error}]
    assert step.info == {"tool_calls": 1.0, "tool_errors": 1.0} and not step.done


def test_auto_syntax_follows_the_tokenizer():
    assert ToolEnv(tokenizer=_tokenizer(TOOL_TEMPLATE)).template
    assert not ToolEnv(tokenizer=_tokenizer("{% for m in messages %}{{ m.content }}{% endfor %}")).template
    assert not ToolEnv(tokenizer=_tokenizer()).template
    assert not ToolEnv(syntax="tags", tokenizer=_tokenizer(TOOL_TEMPLATE)).template


@pytest.mark.parametrize("options, message", [
    ({"tools": ["calculator", "search", "web"]}, "tools: unknown search, web; known: calculator, python"),
    ({"tools": []}, "tools: none given"),
    ({"syntax": "xml"}, "syntax must be one of tags, template, auto"),
    ({"syntax": "template"}, "needs a tokenizer whose chat template handles tools"),
    ({"max_result_chars": 0}, "max_result_chars must be at least 1"),
])
def test_bad_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        ToolEnv(**options)
