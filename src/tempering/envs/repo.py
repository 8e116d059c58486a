"""The repository environment (``env: repo``): the model works in a repository through tools,
runs its visible tests, and submits.

Each problem carries a repository record in ``problem.meta["repo"]`` (``RepoInstance.to_record()``
of :mod:`tempering.tasks.repo_records`). The model acts one tool call a turn, in the tag syntax
of :mod:`tempering.rewards.repo_workspace` (``<ls>``, ``<read>``, ``<replace path=...>``,
``<patch>``, ``<test>``, ``<submit>``); each closing tag is a stop string, so the sampler ends
the turn right after the call, and the result comes back inline as ``<result>...</result>``
(``results: inline``, the tools environment's form) or as a user message (``results:
messages``). A failing call (a missing file, an old text that is not there, a diff that does
not apply, a path outside the repository) is an ``error: ...`` result, never an exception; a
turn without a call gets an error result too and the episode goes on.

Every episode has its own workspace: a dict of the record's files in this process's memory
(nothing is written to the host's disk). ``<test>`` runs the workspace's visible test files in
a fresh sandbox job (the ``code`` reward's shared pool, or the one ``sandbox`` options choose):
the job writes the files into its own private scratch folder and prints one line a test; the
output is cut to ``max_output_chars`` (its start and its end, where the summary is). Test runs
grade nothing: the ``repo`` reward (:mod:`tempering.rewards.repo`) grades the episode in a
clean box, replaying the model's calls on the original files to find its patch.

Budgets: ``env.max_turns`` (the task's, as for every environment) bounds the turns;
``max_tool_calls`` ends the episode after that many calls; ``max_test_runs`` test runs at most,
a further ``<test>`` is an error result. ``Step.info`` counts ``tool_calls``, ``tool_errors``,
``test_runs`` and ``edits`` (logged per step as ``env/<name>``).

Not done here: pytest itself (the visible tests run by the sandbox's own collector: top-level
``test*`` functions of ``test_*.py``/``*_test.py`` files, no fixtures), a shell.
"""

from __future__ import annotations

from typing import Any, Optional

from tempering.config import ConfigError
from tempering.envs.base import Observation, Step, register_env
from tempering.rewards.repo import visible_tests_program
from tempering.rewards.repo_workspace import GUIDE, STOP, ToolError, Workspace, parse_call, record_of
from tempering.sandbox.spec import Limits, RunRequest, SpecError
from tempering.types import Problem, Prompt

RESULTS = ("inline", "messages")


def _sandbox(options: dict) -> Any:
    """The shared ``code`` reward's sandbox for these options (imported here: the reflection
    environment's registry of shared graders imports the code reward)."""
    from tempering.envs.reflection import shared_grader

    return shared_grader("code", options)


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its start and its end, the middle dropped.

    >>> cut("abcdefghijklmnop", 11), cut("short", 11)
    ('abc\\n...\\nnop', 'short')
    """
    if len(text) <= limit:
        return text
    keep = max(limit - 5, 2)
    return text[: keep // 2] + "\n...\n" + text[len(text) - (keep - keep // 2):]


def with_guide(prompt: Prompt, guide: str) -> Prompt:
    """The prompt with the tools' description before it: a text prompt's first paragraph, or
    a chat's system message (added, or its content's first paragraph)."""
    if isinstance(prompt, str):
        return f"{guide}\n\n{prompt}"
    messages = [dict(m) for m in prompt]
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{guide}\n\n{messages[0]['content']}"
        return messages
    return [{"role": "system", "content": guide}, *messages]


@register_env("repo")
class RepoEnv:
    """Episodes in a repository workspace (see the module docstring).

    ``max_tool_calls``: calls per episode, the last one ending it. ``max_test_runs``: visible
    test runs per episode. ``max_output_chars``: characters of a result shown (a test run's
    output, a file read, a listing). ``timeout_s`` and ``memory_mb``: limits of each test run.
    ``results``: ``inline`` or ``messages``. ``guide``: put the tools' description before the
    task's prompt. ``sandbox``: the options of the ``code`` reward whose pool runs the tests
    (``workers``, ``isolation``, ``url``, ``token``); empty = the shared default pool.
    """

    def __init__(self, max_tool_calls: int = 30, max_test_runs: int = 5, max_output_chars: int = 2000,
                 timeout_s: float = 10.0, memory_mb: int = 512, results: str = "inline", guide: bool = True,
                 sandbox: Optional[dict] = None):
        self._limits, self._grader = self.check_options(max_tool_calls, max_test_runs, max_output_chars,
                                                        timeout_s, memory_mb, results, guide, sandbox)
        self.max_tool_calls, self.max_test_runs = max_tool_calls, max_test_runs
        self.max_output_chars, self.results, self.guide = max_output_chars, results, guide
        self.stop = STOP
        self.workspace: Optional[Workspace] = None
        self.calls = self.test_runs = 0

    @staticmethod
    def check_options(max_tool_calls: int = 30, max_test_runs: int = 5, max_output_chars: int = 2000,
                      timeout_s: float = 10.0, memory_mb: int = 512, results: str = "inline", guide: bool = True,
                      sandbox: Optional[dict] = None) -> tuple[Limits, Any]:
        """A ConfigError naming the first option that is out of range (called when a config is
        built, before any model work); else the test runs' limits and the shared grader whose
        sandbox runs them (its pool starts at the first run)."""
        for key, value in (("max_tool_calls", max_tool_calls), ("max_output_chars", max_output_chars)):
            if type(value) is not int or value < 1:
                raise ConfigError(f"env option {key} must be a whole number of at least 1, got {value!r}")
        if type(max_test_runs) is not int or max_test_runs < 0:
            raise ConfigError(f"env option max_test_runs must be a whole number, 0 or more, got {max_test_runs!r}")
        if results not in RESULTS:
            raise ConfigError(f"env option results must be one of {', '.join(RESULTS)}, got {results!r}")
        if not isinstance(guide, bool):
            raise ConfigError(f"env option guide must be true or false, got {guide!r}")
        try:
            limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb)
        except SpecError as err:
            raise ConfigError(f"env option {err}") from None
        if not isinstance(sandbox, (dict, type(None))):
            raise ConfigError(f"env option sandbox must be a mapping of the code reward's options, got {sandbox!r}")
        try:
            return limits, _sandbox(dict(sandbox or {}))
        except ValueError as err:
            raise ConfigError(f"env option sandbox: {err}") from None

    def reset(self, problem: Problem) -> Prompt:
        self.workspace = Workspace(dict(record_of(problem)["files"]))
        self.calls = self.test_runs = 0
        return with_guide(problem.prompt, GUIDE) if self.guide else problem.prompt

    def step(self, completion: str) -> Step:
        if self.workspace is None:
            raise RuntimeError("repo: step() before reset()")
        info = {"tool_calls": 0.0, "tool_errors": 0.0, "test_runs": 0.0, "edits": 0.0}
        call = parse_call(completion)
        if call is None:
            info["tool_errors"] = 1.0
            return Step(self._observation("error: no tool call in your turn; act with one, e.g. <ls></ls>, "
                                          "or end with <submit></submit>"), info=info)
        self.calls += 1
        info["tool_calls"] = 1.0
        if call.tool == "submit":
            return Step(done=True, info=info)
        try:
            result = self._act(call, info)
        except ToolError as err:
            result, info["tool_errors"] = f"error: {err}", 1.0
        done = self.calls >= self.max_tool_calls
        return Step(None if done else self._observation(cut(result, self.max_output_chars)), done=done, info=info)

    def _act(self, call, info: dict[str, float]) -> str:
        workspace = self.workspace
        if call.tool == "ls":
            return workspace.list(call.argument)
        if call.tool == "read":
            return workspace.read(call.argument)
        if call.tool == "test":
            return self._run_tests(call.argument, info)
        result = workspace.edit(call)
        info["edits"] = 1.0
        return result

    def _run_tests(self, selection: str, info: dict[str, float]) -> str:
        if self.test_runs >= self.max_test_runs:
            raise ToolError(f"no test runs left (this task allows {self.max_test_runs}); submit when ready")
        if selection and selection.split("::")[0] not in self.workspace.files:
            raise ToolError(f"no test file {selection.split('::')[0]!r}; <ls></ls> lists the files")
        self.test_runs += 1
        info["test_runs"] = 1.0
        program = visible_tests_program(self.workspace.files, selection)
        result = self._grader.sandbox().run(RunRequest(program, limits=self._limits))
        if result.status == "sandbox_error":
            raise ToolError("the test run could not start (a sandbox fault); try again")
        output = result.stdout
        if result.status != "ok":
            tail = [line for line in result.stderr.splitlines() if line.strip()][-3:]
            output += "\n".join(["", f"the test run ended with {result.status.replace('_', ' ')}", *tail])
        return output.strip() or "no output"

    def _observation(self, text: str) -> Observation:
        if self.results == "messages":
            return [{"role": "user", "content": text}]
        return f"<result>{text}</result>"
