"""The tool-use environment: the model calls a calculator or Python, reads the result, answers.

Two call syntaxes:

- ``tags`` (declared): the model writes ``<calc>47*6</calc>`` or ``<python>print(2)</python>``;
  the closing tags are the environment's ``stop`` strings, so the turn ends right after a call,
  and the result comes back inline as ``<result>282</result>`` (the model then continues the
  same text). The built-in tiny model learns this syntax from its pre-training corpus
  (``pretrain.tool_share``), which writes it with :func:`calc_transcript`.
- ``template``: the chat template's own tool-call format (Hermes/Qwen): the model writes
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "47*6"}}</tool_call>``,
  the tools are declared to the template through :attr:`ToolEnv.tools` (JSON-schema
  definitions the runner passes to ``apply_chat_template``), and the result comes back as a
  ``tool`` message. ``auto`` picks it when the tokenizer's chat template mentions tools.

A turn without a call ends the episode; the task's rewards grade that last turn. A failing
call (bad syntax, division by zero, a crashing program, an unknown tool) is an observation
(``error: ...``), never an exception: the model is meant to learn from it, and one bad
sample must not stop a rollout. ``Step.info`` counts ``tool_calls`` and ``tool_errors``.

The calculator walks Python's ``ast`` over numbers and ``+ - * / // % **`` only, with bounds
on exponents and on the size of every intermediate, so ``9**9**9`` is an error in
microseconds; text never reaches ``eval``. The Python tool runs code in the jailed sandbox
pool (:mod:`tempering.sandbox`) of the process's shared ``code`` reward.

Not done here: several calls in one turn (the last one runs), tool-specific rewards,
stateful tools (each Python call is a fresh program).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tempering.config import ConfigError
from tempering.envs.base import Step, register_env
from tempering.types import Problem, Prompt

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_RESULT_BITS = 4096
SYNTAXES = ("tags", "template", "auto")


class ToolError(ValueError):
    """A call that failed; its message becomes the ``error: ...`` observation."""


_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text, or :class:`ToolError`.

    >>> calculate("47*6"), calculate("-(7 - 10) ** 2 // 4"), calculate("10 / 4"), calculate("17 % 5")
    ('282', '-3', '2.5', '2')
    >>> calculate("9**9**9")
    Traceback (most recent call last):
    tempering.envs.tools.ToolError: exponent too large
    >>> calculate("__import__('os')")
    Traceback (most recent call last):
    tempering.envs.tools.ToolError: unsupported expression
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError):
        raise ToolError("SyntaxError") from None
    try:
        value = _value(tree.body)
    except ZeroDivisionError:
        raise ToolError("ZeroDivisionError") from None
    except OverflowError:
        raise ToolError("number too large") from None
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError("exponent too large")
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ToolError("unsupported expression")


def _bounded(value: Any) -> int | float:
    """Every intermediate stays a real number of bounded size (``(-8) ** 0.5`` is complex)."""
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, int) and value.bit_length() <= MAX_RESULT_BITS:
        return value
    raise ToolError("number too large" if isinstance(value, (int, float)) else "not a real number")


def run_python(code: str, timeout_s: float, memory_mb: int) -> str:
    """The program's stdout, or :class:`ToolError` with its last error line (or its status:
    ``timeout``, ``memory_limit``, ...) when it did not finish cleanly."""
    from tempering.sandbox import Limits, RunRequest

    result = _sandbox().run(RunRequest(code, limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb)))
    if result.status == "ok":
        return result.stdout.rstrip()
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    raise ToolError(lines[-1].strip() if result.status == "runtime_error" and lines else result.status)


def _sandbox() -> Any:
    """The sandbox pool of the process's shared ``code`` reward (reflection episodes and code
    rewards run there too): an environment lives for one episode, and a pool per episode
    would fork its workers every time. Imported here: the rewards import the tasks, whose
    corpus imports this module."""
    from tempering.envs.reflection import shared_grader

    return shared_grader("code", {}).sandbox()


@dataclass(frozen=True)
class Tool:
    """A tool as the model sees it: its tag (``tags`` syntax) and its one argument
    (``template`` syntax)."""

    name: str
    tag: str
    argument: str
    description: str

    def schema(self) -> dict:
        """The JSON-schema definition chat templates take in ``tools=``."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {self.argument: {"type": "string"}},
                           "required": [self.argument]}}}


TOOLS = {
    "calculator": Tool("calculator", "calc", "expression",
                       "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses."),
    "python": Tool("python", "python", "code", "Run a Python program and return what it prints."),
}

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def calc_transcript(expression: str, result: str) -> str:
    """A calculator call and its result as the ``tags`` syntax writes them.

    >>> calc_transcript("47*6", "282")
    '<calc>47*6</calc><result>282</result>'
    """
    return f"<calc>{expression}</calc>{_inline(result)}"


def _inline(text: str) -> str:
    return f"<result>{text}</result>"


def uses_tool_template(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tool definitions and calls."""
    template = str(getattr(tokenizer, "chat_template", None) or "")
    return "tools" in template or "tool_call" in template


@register_env("tools")
class ToolEnv:
    """Episodes in which the model may call ``tools`` before it answers.

    ``syntax``: ``tags``, ``template`` or ``auto`` (template when ``tokenizer`` has a chat
    template with tool support). ``max_result_chars``: longer results are cut there (a
    program's stdout can be long; the model's context is not). ``timeout_s`` and
    ``memory_mb``: limits of each Python call.
    """

    def __init__(self, tools: Optional[list[str]] = None, syntax: str = "auto", tokenizer: Any = None,
                 max_result_chars: int = 200, timeout_s: float = 5.0, memory_mb: int = 256):
        names = ["calculator"] if tools is None else [tools] if isinstance(tools, str) else list(tools)
        unknown = [n for n in names if n not in TOOLS]
        if unknown or not names:
            raise ConfigError(f"env option tools: {'unknown ' + ', '.join(unknown) if unknown else 'none given'}; "
                              f"known: {', '.join(TOOLS)}")
        if syntax not in SYNTAXES:
            raise ConfigError(f"env option syntax must be one of {', '.join(SYNTAXES)}, got {syntax!r}")
        if syntax == "template" and not uses_tool_template(tokenizer):
            raise ConfigError("env option syntax: template needs a tokenizer whose chat template "
                              "handles tools; use syntax: tags")
        if max_result_chars < 1:
            raise ConfigError(f"env option max_result_chars must be at least 1, got {max_result_chars}")
        self.template = syntax == "template" or (syntax == "auto" and uses_tool_template(tokenizer))
        self._tools = {name: TOOLS[name] for name in names}
        self.max_result_chars = max_result_chars
        self._runners: dict[str, Callable[[str], str]] = {
            "calculator": calculate,
            "python": lambda code: run_python(code, timeout_s, memory_mb),
        }
        if "python" in names:
            _sandbox()  # a sandbox that cannot start says so now, not in a step
        self.tools = [tool.schema() for tool in self._tools.values()] if self.template else None
        self.stop = ("</tool_call>",) if self.template else tuple(f"</{t.tag}>" for t in self._tools.values())
        tags = "|".join(re.escape(t.tag) for t in self._tools.values())
        self._calls = _TOOL_CALL if self.template else re.compile(rf"<({tags})>(.*?)</\1>", re.DOTALL)

    def reset(self, problem: Problem) -> Prompt:
        return problem.prompt

    def step(self, completion: str) -> Step:
        calls = self._calls.findall(completion)
        if not calls:
            return Step(done=True, info={"tool_calls": 0.0, "tool_errors": 0.0})
        try:
            name, argument = self._parse_json(calls[-1]) if self.template else self._parse_tag(*calls[-1])
            result, failed = self._runners[name](argument), False
        except ToolError as err:
            result, failed = f"error: {err}", True
        if len(result) > self.max_result_chars:
            result = result[: self.max_result_chars] + "..."
        observation = [{"role": "tool", "content": result}] if self.template else _inline(result)
        return Step(observation=observation, info={"tool_calls": 1.0, "tool_errors": float(failed)})

    def _parse_tag(self, tag: str, body: str) -> tuple[str, str]:
        return next(t.name for t in self._tools.values() if t.tag == tag), body

    def _parse_json(self, call: str) -> tuple[str, str]:
        """``(tool name, argument)`` of a template call, or :class:`ToolError` saying what
        is wrong with it."""
        try:
            data = json.loads(call)
        except json.JSONDecodeError:
            raise ToolError("the tool call is not valid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ToolError('a tool call is {"name": ..., "arguments": {...}}')
        tool = self._tools.get(data["name"])
        if tool is None:
            raise ToolError(f"unknown tool {data['name']!r}; tools: {', '.join(self._tools)}")
        arguments = data.get("arguments")
        if not isinstance(arguments, dict) or not isinstance(arguments.get(tool.argument), str):
            raise ToolError(f'{tool.name} takes arguments {{"{tool.argument}": "..."}}')
        return tool.name, arguments[tool.argument]
