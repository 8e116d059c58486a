"""A grader that goes away: a real ``temper sandbox serve``, started by these tests on
127.0.0.1, grades a code task (``rewards.options.code.url``) and is stopped under a real
``temper train``. Within ``rewards.max_outage_rounds`` the run waits, samples again and
survives once the service is back; past it the run stops with exit 2, a message naming the
reward and its error, and a checkpoint that ``--resume`` continues from. A service that is
down before a run starts is refused at once, by ``temper train`` and ``temper eval``.

The tiny model writes no real programs: its completions are run as they are
(``code_fenced: false``) and fail their tests, which is enough, since what is tested is the
traffic to the grader, not the rewards.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from graders import Temper, records as _records, serve_sandbox as _serve, stop as _stop
from serving import free_port
from tempering import checkpoint
from tempering.sandbox import SandboxUnavailable, choose_isolation


@pytest.fixture(scope="module")
def isolation():
    try:
        return choose_isolation("auto")
    except SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")


@pytest.fixture
def port(isolation):
    return free_port()


@pytest.fixture
def code_config(tmp_path: Path, tiny_model_dir: Path):
    """A config that trains the tiny model on a code dataset graded by the service at ``url``."""
    def write(url: str, steps: int = 6, **fields) -> Path:
        records = [{"prompt": f"Write f(x) returning x + {k}.", "code_fenced": False,
                    "tests": {"kind": "call", "entry_point": "f", "cases": [{"args": [1], "expected": 1 + k}]}}
                   for k in range(12)]
        train, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in records[:10]))
        held_out.write_text("".join(json.dumps(r) + "\n" for r in records[10:]))
        config = {
            "threads": 1, "steps": steps, "model": {"path": str(tiny_model_dir)},
            "tasks": [{"name": "dataset", "options": {"path": str(train), "eval_path": str(held_out), "kind": "code"}}],
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
            "eval": {"problems_per_task": 2, "max_new_tokens": 8},
            "rewards": {"options": {"code": {"url": url, "timeout_s": 2.0}}, **fields},
            "checkpoint": {"every": 2},
        }
        path = tmp_path / "config.yaml"
        path.write_text(json.dumps(config))
        return path
    return write


def test_a_run_waits_out_a_sandbox_outage_and_goes_on_when_the_service_is_back(tmp_path, port, code_config):
    url = f"http://127.0.0.1:{port}"
    config = code_config(url, steps=12, max_outage_rounds=30, outage_backoff_s=0.2)
    run = tmp_path / "run"
    service = _serve(port)
    try:
        train = Temper("train", str(config), "--quiet", "--run-dir", str(run))
        train.wait_for(lambda: len(_records(run)) >= 2, "two steps were logged")
        _stop(service)
        train.wait_for(lambda: "reward outage" in train.stderr, "an outage was reported")
        service = _serve(port)
        assert train.finish() == 0, train.stderr[-3000:]
    finally:
        _stop(service)

    records = _records(run)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert records[-1]["outage_rounds"] >= 1, "the rounds sampled while the service was down are counted"
    assert records[0]["outage_rounds"] == 0
    assert f"cannot reach the sandbox at 127.0.0.1:{port}" in train.stderr
    assert "Traceback" not in train.stderr
    assert (run / "summary.json").exists()


def test_an_outage_past_the_budget_stops_with_exit_2_and_a_checkpoint_to_resume_from(tmp_path, port, code_config):
    url = f"http://127.0.0.1:{port}"
    config = code_config(url, steps=12, max_outage_rounds=2, outage_backoff_s=0.1)
    run = tmp_path / "run"
    service = _serve(port)
    train = Temper("train", str(config), "--quiet", "--run-dir", str(run))
    try:
        train.wait_for(lambda: len(_records(run)) >= 2, "two steps were logged")
    finally:
        _stop(service)
    assert train.finish() == 2, train.stderr[-3000:]

    done = len(_records(run))
    message = train.stderr.strip().splitlines()[-1]
    assert message.startswith("temper train: "), train.stderr[-3000:]
    assert "reward 'code'" in message and f"cannot reach the sandbox at 127.0.0.1:{port}" in message
    assert "rewards.max_outage_rounds=2" in message and f"--resume {run}" in message
    assert "Traceback" not in train.stderr
    assert checkpoint.latest(run).name == f"step-{done:08d}", "the run stopped with its steps saved"

    service = _serve(port)
    try:
        resumed = Temper("train", "--resume", str(run), "--quiet")
        assert resumed.finish() == 0, resumed.stderr[-3000:]
    finally:
        _stop(service)
    assert [r["step"] for r in _records(run)] == list(range(1, 13))
    assert (run / "summary.json").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_sandbox_service_down_at_start_is_refused_with_exit_2_naming_its_url(tmp_path, port, code_config, command):
    url = f"http://127.0.0.1:{port}"  # nothing listens there
    config = code_config(url)
    started = time.monotonic()
    result = Temper(command, str(config), "--quiet", *(["--run-dir", str(tmp_path / "run")] if command == "train" else []))
    assert result.finish() == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"temper {command}: rewards.options.code: ") and url in message, result.stderr
    assert "temper sandbox serve" in message
    assert not (tmp_path / "run").exists(), "refused before a run folder was made"
    assert time.monotonic() - started < 60


def test_a_service_gone_mid_run_makes_grader_faults_naming_why_and_is_not_asked_again(port):
    from tempering.rewards.code import CodeReward
    from tempering.types import Problem, Rollout

    url = f"http://127.0.0.1:{port}"
    problem = Problem(task="code", id="0", prompt="", answer="", meta={
        "code_fenced": False, "tests": {"kind": "call", "entry_point": "f", "cases": [{"args": [1], "expected": 2}]}})
    rollouts = [Rollout(problem, [1], [2], [0.0], text, "stop", 0) for text in ("def f(x):\n    return x + 1\n", "x")]
    service = _serve(port)
    try:
        reward = CodeReward(url=url)
        assert [r.score for r in reward.score_batch([problem] * 2, rollouts)] == [1.0, 0.0]
    finally:
        _stop(service)

    results = reward.score_batch([problem] * 2, rollouts)  # raised SandboxHTTPError before
    assert [r.error for r in results] == [f"SandboxHTTPError: cannot reach the sandbox at 127.0.0.1:{port}: "
                                          "[Errno 111] Connection refused"] * 2
    later = CodeReward(url=url)  # a run's evaluation builds its own: it is not refused mid-run
    assert all(r.error for r in later.score_batch([problem], rollouts[:1]))
    reward.close()
    later.close()
