"""`temper` refuses bad configs with exit status 2 and one short message, before any model work.

Each command runs against an empty model cache in an empty folder: that both stay empty
shows the refusal came before pre-training, model loading or making a run folder.
"""

import os
import subprocess
import sys

import pytest


def _temper(args, cwd, cache):
    env = {**os.environ, "TEMPERING_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "tempering.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, expected", [
    (["train", "steps=abc"], "steps='abc': Input should be a valid integer"),
    (["train", "rollout.temperature=abc"], "rollout.temperature='abc': Input should be a valid number"),
    (["train", "nosuch.key=1"], "nosuch: unknown key (allowed here: algorithm, checkpoint, eval,"),
    (["train", "tasks.0.name=nosuch"], "tasks.0 (nosuch): unknown task 'nosuch'; known: add, dataset, mul, sub"),
    (["train", "tasks.0.rewards={nosuch: 1}"], "unknown reward 'nosuch'; known: code, exact_match, format, length, match, math, model"),
    (["train", "algorithm.advantage=nosuch"], "algorithm.advantage: unknown advantage 'nosuch'; known: "),
    (["train", "nosuch.yaml", "steps=1"], "config file nosuch.yaml does not exist"),
    (["pretrain", "pretrain.hidden_size=abc"], "pretrain.hidden_size='abc'"),
    (["eval", "rewards.options={exact_match: {nosuch: 1}}"],
     "rewards.options.exact_match: reward 'exact_match' has no option 'nosuch'"),
])
def test_a_bad_config_exits_2_with_a_short_message_and_no_traceback(tmp_path, args, expected):
    cache, cwd = tmp_path / "cache", tmp_path / "cwd"
    cache.mkdir()
    cwd.mkdir()

    result = _temper(args, cwd, cache)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith(f"temper {args[0]}: ")
    assert expected in result.stderr
    assert len(result.stderr.splitlines()) <= 3
    assert not any(cache.iterdir()), "nothing was pre-trained"
    assert not any(cwd.iterdir()), "no run folder was made"
