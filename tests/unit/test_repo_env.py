"""``env: repo`` without a sandbox run: unified diffs made and applied, the tool-call syntax,
the workspace's edits, scripted episodes (the environment and the grader's replay of the same
turns agree), budgets, the checks a config gets, and the repository the grader runs."""

from __future__ import annotations

import pytest

import repo_instances as R
from tempering.build import build_tasks
from tempering.config import ConfigError, TrainConfig
from tempering.envs import check_env, make_env
from tempering.rewards import build_reward
from tempering.rewards.repo import RepoReward, graded_files, model_turns, patch_kinds
from tempering.rewards.repo_patch import PatchError, apply_patch, make_patch, touched_paths
from tempering.rewards.repo_workspace import STOP, Workspace, format_call, parse_call, replay
from tempering.types import Rollout, Turn

BEFORE = {"pkg/a.py": "".join(f"line {i}\n" for i in range(1, 21)), "pkg/b.py": "b = 1", "gone.py": "x = 1\n",
          "empty.py": ""}


@pytest.mark.parametrize("after", [
    {**BEFORE, "pkg/a.py": BEFORE["pkg/a.py"].replace("line 2\n", "LINE 2\n").replace("line 19\n", "")},
    {**BEFORE, "pkg/b.py": "b = 2"},  # no newline at the end, before and after
    {**BEFORE, "pkg/b.py": "b = 2\n"},
    {**BEFORE, "pkg/b.py": "b = 1\r\nc = 2\r\n"},  # Windows line ends, and separators only str.splitlines knows:
    {**BEFORE, "pkg/a.py": BEFORE["pkg/a.py"].replace("line 3\n", "s = 'a\u2028b\x0cc\x1dd'\n")},
    {k: v for k, v in {**BEFORE, "new/c.py": "c = 3\n", "new/__init__.py": ""}.items()
     if k not in ("gone.py", "empty.py")},
])
def test_make_patch_and_apply_patch_round_trip(after):
    diff = make_patch(BEFORE, after)
    assert diff and apply_patch(BEFORE, diff) == after
    assert make_patch(BEFORE, BEFORE) == ""


def test_apply_patch_finds_a_hunk_by_its_text_when_its_line_numbers_are_wrong():
    diff = "--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1,3 +1,3 @@\n line 11\n-line 12\n+twelve\n line 13\n"
    assert apply_patch(BEFORE, diff)["pkg/a.py"].splitlines()[10:13] == ["line 11", "twelve", "line 13"]
    git = "diff --git a/pkg/b.py b/pkg/b.py\nindex 1..2 100644\n--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-b = 1\n" \
          "\\ No newline at end of file\n+b = 2\n"
    assert apply_patch(BEFORE, git)["pkg/b.py"] == "b = 2\n"


@pytest.mark.parametrize("diff, message", [
    ("--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-no such line\n+x\n", "pkg/a.py: hunk 1 does not apply"),
    ("--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n", "nope.py: no such file"),
    ("--- /dev/null\n+++ b/pkg/b.py\n@@ -0,0 +1 @@\n+x\n", "pkg/b.py: the diff adds it"),
    ("--- /dev/null\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x\n", "../evil.py: path outside the repository"),
    ("--- /dev/null\n+++ /etc/evil.py\n@@ -0,0 +1 @@\n+x\n", "/etc/evil.py: path outside the repository"),
    ("--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-y = 1\n", "gone.py: hunk 1 does not apply"),
    ("just some text", "no file in the diff"),
])
def test_apply_patch_refuses_naming_the_file_and_what_is_wrong(diff, message):
    with pytest.raises(PatchError, match=message.replace(".", r"\.")):
        apply_patch(BEFORE, diff)
    assert BEFORE["pkg/b.py"] == "b = 1"  # the input is never changed


def test_parse_call_reads_each_tool_and_format_call_writes_what_it_reads():
    assert [parse_call(format_call(tool, "x")).tool for tool in ("ls", "read", "test", "submit")] == \
        ["ls", "read", "test", "submit"]
    assert parse_call("I will look.\n<read> pkg/a.py </read>").argument == "pkg/a.py"
    diff = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert parse_call(f"<patch>\n{diff}</patch>").argument == f"\n{diff}"  # a diff is kept as written
    assert parse_call('<replace path="a.py"><new>x</new></replace>').error.startswith("replace is <replace")
    assert parse_call("<read>a.py</read> then <ls></ls>").tool == "ls"  # the last call counts
    assert parse_call("<read>unclosed") is None
    assert set(STOP) == {"</ls>", "</read>", "</replace>", "</patch>", "</test>", "</submit>"}


def test_workspace_edits_refuse_what_would_be_ambiguous_or_outside():
    space = Workspace({"a.py": "x = 1\nx = 1\ny = 2\n"})
    with pytest.raises(ValueError, match="occurs 2 times in a.py"):
        space.replace("a.py", "x = 1\n", "x = 3\n")
    with pytest.raises(ValueError, match="not in a.py as written"):
        space.replace("a.py", "z", "w")
    assert space.replace("a.py", "y = 2\n", "y = 3\n") == "replaced in a.py"
    assert space.replace("pkg/new.py", "", "n = 1\n") == "created pkg/new.py"
    for bad in ("../x.py", "/tmp/x.py", "pkg/../../x.py"):
        with pytest.raises(ValueError, match="outside the repository"):
            space.replace(bad, "", "x")
    assert space.outside == 3 and space.original == {"a.py": "x = 1\nx = 1\ny = 2\n"}
    assert apply_patch(space.original, space.diff()) == space.files


def play(problem, texts, **options):
    """Scripted model turns through the environment: its steps and the rollout they make."""
    env = make_env("repo", options)
    prompt = env.reset(problem)
    steps, turns = [], []
    for text in texts:
        steps.append(env.step(text))
        turns.append(Turn(text, 0, 0, "stop", info=steps[-1].info))
        if steps[-1].done:
            break
    return env, prompt, steps, Rollout(problem, [1], [], [], turns[-1].text, "stop", 0, turns=turns)


def test_a_scripted_episode_and_the_graders_replay_of_its_turns_agree():
    problem = R.problem(R.stock_instance())
    texts = [format_call("ls"), "Let me read it. " + format_call("read", "pkg/stock.py"), "no call, just thinking",
             R.FIX_CALL,
             format_call("patch", "--- a/pkg/stock.py\n+++ b/pkg/stock.py\n@@ -1 +1 @@\n-not there\n+x\n"),
             format_call("read", "/etc/passwd"), format_call("submit"), format_call("replace", path="pkg/late.py",
                                                                                     old="", new="after the end")]
    env, prompt, steps, rollout = play(problem, texts)
    assert prompt.startswith("You are working in a Python repository") and prompt.endswith(problem.prompt)
    assert steps[0].observation == "<result>pkg/__init__.py\npkg/report.py\npkg/stock.py\ntests/test_stock.py</result>"
    assert steps[1].observation == f"<result>{R.STOCK}</result>"
    assert steps[2].observation.startswith("<result>error: no tool call") and not steps[2].done
    assert steps[3].observation == "<result>replaced in pkg/stock.py</result>"
    assert "hunk 1 does not apply" in steps[4].observation and "outside the repository" in steps[5].observation
    assert steps[6].done and len(steps) == 7  # the turn after the submit is never played
    assert [s.info["tool_errors"] for s in steps] == [0, 0, 1, 0, 1, 1, 0]
    assert sum(s.info["edits"] for s in steps) == 1 and sum(s.info["tool_calls"] for s in steps) == 6
    replayed = replay(problem.meta["repo"]["files"], model_turns(rollout))
    assert replayed.files == env.workspace.files and replayed.files["pkg/stock.py"] == R.FIXED_STOCK
    assert (replayed.outside, replayed.failed) == (1, 1)


def test_budgets_end_the_episode_or_refuse_a_test_run():
    problem = R.problem(R.stock_instance())
    _, _, steps, rollout = play(problem, [format_call("test"), format_call("ls"), format_call("ls"), format_call("ls")],
                                max_tool_calls=3, max_test_runs=0)
    assert "no test runs left (this task allows 0)" in steps[0].observation and steps[0].info["test_runs"] == 0
    assert [s.done for s in steps] == [False, False, True] and steps[2].observation is None
    _, _, steps, _ = play(problem, [format_call("read", "pkg/stock.py")], max_output_chars=40, results="messages")
    content = steps[0].observation[0]["content"]
    assert steps[0].observation[0]["role"] == "user" and len(content) <= 40 and "\n...\n" in content


def test_a_turn_cut_off_by_the_token_budget_is_not_replayed():
    problem = R.problem(R.stock_instance())
    edit = format_call("replace", path="pkg/stock.py", old="    items[name] = left\n", new="    items[name] = 0\n")
    cut = Rollout(problem, [1], [], [], edit, "length", 0, turns=[Turn(edit, 0, 0, "length")])
    assert model_turns(cut) == [] and model_turns(Rollout(problem, [1], [], [], edit, "stop", 0)) == [edit]


def test_the_chat_prompt_gets_the_guide_as_its_system_message():
    problem = R.problem(R.stock_instance())
    chat = type(problem)(problem.task, problem.id, [{"role": "user", "content": "fix it"}], "", meta=problem.meta)
    prompt = make_env("repo", {}).reset(chat)
    assert prompt[0]["role"] == "system" and "<submit></submit>" in prompt[0]["content"]
    assert prompt[1]["content"] == "fix it"
    assert make_env("repo", {"guide": False}).reset(chat) == chat.prompt


@pytest.mark.parametrize("options, message", [
    ({"max_tool_calls": 0}, "env option max_tool_calls must be a whole number of at least 1, got 0"),
    ({"max_test_runs": -1}, "env option max_test_runs must be a whole number, 0 or more, got -1"),
    ({"max_output_chars": 2.5}, "env option max_output_chars must be a whole number"),
    ({"results": "chat"}, "env option results must be one of inline, messages"),
    ({"timeout_s": 0}, "env option timeout_s must be a number of seconds"),
    ({"sandbox": {"workers": -1}}, "env option sandbox: workers must be between 0"),
    ({"sandbox": {"colour": "red"}}, "env option sandbox: reward 'code' has no option 'colour'"),
])
def test_a_config_with_a_bad_repo_option_fails_when_it_is_built_naming_the_key(options, message):
    with pytest.raises(ValueError, match=message):
        check_env("repo", options)
    config = TrainConfig.model_validate({"tasks": [{"name": "add", "env": {"name": "repo", "options": options}}]})
    with pytest.raises(ConfigError, match=rf"tasks\.0 \(add\): {message}"):
        build_tasks(config)


def test_the_graded_repository_takes_its_tests_from_the_record_not_the_patch():
    instance = R.stock_instance()
    record = instance.to_record()
    diff = make_patch(instance.files, {**instance.files, "pkg/stock.py": R.FIXED_STOCK, "tests/test_stock.py": "",
                                       "tests/test_extra.py": "def test_x(): pass\n", "conftest.py": "x = 1\n"})
    files = graded_files(record, diff)
    assert files["pkg/stock.py"] == R.FIXED_STOCK and files["tests/test_stock.py"] == R.HIDDEN_STOCK_TESTS
    assert files["tests/test_report.py"] == R.HIDDEN_REPORT_TESTS
    assert "tests/test_extra.py" not in files and "conftest.py" not in files
    kinds = patch_kinds(diff, 0)
    assert (kinds["tests"], kinds["conftest"], kinds["runner"], kinds["outside"]) == (1.0, 1.0, 0.0, 0.0)
    assert patch_kinds(make_patch({}, {"sitecustomize.py": "import os\nos.system('x')\n"}), 0)["runner"] == 1.0
    runner = make_patch({}, {"pkg/x.py": "import sys\nrunner = sys.modules['_runner']\n"})
    assert patch_kinds(runner, 0)["runner"] == 1.0
    assert patch_kinds(instance.patch, 0) == {kind: 0.0 for kind in patch_kinds(instance.patch, 0)}
    assert touched_paths(diff) == ["conftest.py", "pkg/stock.py", "tests/test_extra.py", "tests/test_stock.py"]


def test_an_episode_without_a_change_scores_zero_unrun_and_bad_reward_options_are_named():
    reward = RepoReward(workers=1)
    problem = R.problem(R.stock_instance())
    rollout = Rollout(problem, [1], [], [], format_call("submit"), "stop", 0,
                      turns=[Turn(format_call("test"), 0, 0, "stop", info={"test_runs": 1.0}),
                             Turn(format_call("submit"), 0, 0, "stop", info={"test_runs": 0.0})])
    result, = reward.score_batch([problem], [rollout])
    assert result.score == 0.0 and result.error is None
    assert [result.components[key] for key in ("no_patch", "fixed", "test_runs")] == [1.0, 0.0, 1.0]
    assert reward._code._sandbox is None  # nothing to run: no pool was started
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds"):
        build_reward("repo", {"timeout_s": -1})
    with pytest.raises(ValueError, match="reward 'repo' has no option 'credit'"):
        build_reward("repo", {"credit": "all"})
    with pytest.raises(ValueError, match="problem repo/x has no repository record"):
        reward.score_batch([type(problem)("repo", "x", "", "")], [rollout])


class DownSandbox:
    """A sandbox whose every test is a sandbox fault, or whose service cannot be reached."""

    def __init__(self, unreachable: bool):
        self.unreachable, self.calls = unreachable, 0

    def test_many(self, specs):
        from tempering.sandbox.client import SandboxHTTPError
        from tempering.sandbox.spec import CaseResult, TestResult

        self.calls += 1
        if self.unreachable:
            raise SandboxHTTPError("connection refused")
        return [TestResult.from_cases([CaseResult("sandbox_error", 0.0)]) for _ in specs]


@pytest.mark.parametrize("unreachable, error", [(False, "sandbox_error"),
                                                 (True, "SandboxHTTPError: connection refused")])
def test_a_grader_outage_is_retried_then_an_error_not_a_zero(unreachable, error):
    reward = RepoReward(workers=1, retries=2)
    reward._code._sandbox = down = DownSandbox(unreachable)
    problem = R.problem(R.stock_instance())
    fix = format_call("patch", R.stock_instance().patch)
    result, = reward.score_batch([problem], [Rollout(problem, [1], [], [], fix, "stop", 0)])
    assert result.error == error and down.calls == 3
