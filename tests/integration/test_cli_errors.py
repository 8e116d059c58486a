"""`temper` refuses bad configs with exit status 2 and one short message, before any model work.

Each command runs against an empty model cache in an empty folder: that both stay empty
shows the refusal came before pre-training, model loading or making a run folder.
"""

import os
import shutil
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
    (["train", "nosuch.key=1"], "nosuch: unknown key (allowed here: algorithm, checkpoint, dpo, eval,"),
    (["train", "tasks.0.name=nosuch"],
     "tasks.0 (nosuch): unknown task 'nosuch'; known: add, code, code:<type>, dataset, humaneval, long_context, long_context:<type>, mul, repo, rg:<type>, sub"),
    (["train", "tasks.0.options.digits=abc"], "tasks.0 (add): options.digits='abc': expected list[int]"),
    (["train", "tasks.0.rewards={nosuch: 1}"], ("unknown reward 'nosuch'; known: cited_match, code, code_format, consistency, exact_match, exact_steps, format, "
     "humaneval, length, match, math, model, process_model, reasoning_gym, repetition, repo, steps")),
    (["train", "learner.lr=.inf"], "learner.lr=inf: Input should be a finite number"),
    (["train", "rollout.temperature=.nan"], "rollout.temperature=nan: Input should be a finite number"),
    (["train", "rewards.monitors.length_reward_gain=.nan"], "length_reward_gain=nan: Input should be a finite number"),
    (["train", "algorithm.loss=json:decoder"], "algorithm.loss: loss json:decoder is a module, not a function"),
    (["train", "algorithm.loss=json:JSONDecoder"], "algorithm.loss: loss json:JSONDecoder is a class, not a function"),
    (["train", "algorithm.advantage=math:pi"], "algorithm.advantage: advantage math:pi is a float, not a function"),
    (["train", "tasks.0.name=math:pi"], "tasks.0 (math:pi): task math:pi is a float, not a function or class"),
    (["train", "tasks.0.rewards={json:JSONDecoder: 1}"],
     "tasks.0 (add): reward json:JSONDecoder is a class without a score_batch method"),
    (["train", "tasks.0.rewards={math:pi: 1}"], "tasks.0 (add): reward math:pi is a float, not a function or class"),
    (["train", "algorithm.advantage=nosuch"], "algorithm.advantage: unknown advantage 'nosuch'; known: "),
    (["train", "nosuch.yaml", "steps=1"], "config file nosuch.yaml does not exist"),
    (["pretrain", "pretrain.hidden_size=abc"], "pretrain.hidden_size='abc'"),
    (["eval", "rewards.options={exact_match: {nosuch: 1}}"],
     "rewards.options.exact_match: reward 'exact_match' has no option 'nosuch'"),
    # overrides after a flag are overrides too, in every command that takes them
    (["train", "steps=1", "--quiet", "rollout.group_size=abc"], "rollout.group_size='abc': Input should be a valid"),
    (["train", "--run-dir", "r", "steps=1", "--quiet", "nosuch.key=1"], "nosuch: unknown key"),
    (["sft", "data.jsonl", "--quiet", "steps=abc"], "steps='abc': Input should be a valid integer"),
    (["pretrain", "steps=1", "--force", "pretrain.hidden_size=abc"], "pretrain.hidden_size='abc'"),
    (["explain", "steps=1", "--probe", "0", "seed=abc"], "seed='abc': Input should be a valid integer"),
    (["eval", "builtin:tiny", "--n", "2", "steps=abc"], "steps='abc': Input should be a valid integer"),
    (["serve", "M", "--port", "0", "threads=abc"], "threads='abc': Input should be a valid integer"),
    # what the config alone decides, refused before the model loads, not at the first evaluation or step
    (["train", "steps=true"], "steps=True: Input should be a number, not true or false"),
    (["train", "tasks=[{name: code}]", "rewards.options.code={timeout_s: -1}"],
     "rewards.options.code: timeout_s must be a number of seconds in (0, 600], got -1"),
    (["train", "tasks=[{name: code, options: {partial: maybe}}]"],
     "tasks.0 (code): options.partial='maybe': expected bool"),
    # explain refuses what train refuses, rather than passing it as "could not be inspected"
    (["explain", "model.path=builtin:nonsense"],
     "model.path 'builtin:nonsense': known built-in models are builtin:tiny, builtin:generalist, builtin:tiny-long, builtin:smollm2"),
    (["explain", "tasks.0.name=nosuch"], "tasks.0 (nosuch): unknown task 'nosuch'"),
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


@pytest.mark.parametrize("command", ["train", "pretrain"])
@pytest.mark.parametrize("cache, reason", [
    ("/proc/nope/cache", "No such file or directory"),
    ("{tmp}/file/cache", "Not a directory"),
])
def test_an_unwritable_model_cache_exits_2_naming_the_variable_and_the_path(tmp_path, command, cache, reason):
    (tmp_path / "file").write_text("not a folder")
    cache = cache.format(tmp=tmp_path)

    result = _temper([command, "steps=1", "threads=1"], tmp_path, cache)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"TEMPERING_CACHE={cache}" in result.stderr and reason in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"], "no run folder was made"


DATA = {
    "one.jsonl": b'{"question": "1+1=", "answer": 2}\n',
    "latin1.jsonl": b'{"question": "1+1=", "answer": 2}\n\n{"question": "caf\xe9?", "answer": 2}\n',
}


@pytest.mark.parametrize("file, options, expected", [
    ("one.jsonl", "eval_fraction: 0.0", "tasks.0 (dataset): no held-out problems"),
    ("one.jsonl", "eval_fraction: 0.1", "tasks.0 (dataset): no held-out problems"),
    ("latin1.jsonl", "eval_fraction: 0.5", "latin1.jsonl:3: not UTF-8 text (byte 0xe9 at column 18)"),
])
def test_a_bad_dataset_exits_2_naming_the_file(tmp_path, file, options, expected):
    cache, cwd, data = tmp_path / "cache", tmp_path / "cwd", tmp_path / file
    cache.mkdir()
    cwd.mkdir()
    data.write_bytes(DATA[file])
    task = f"tasks=[{{name: dataset, options: {{path: {data}, {options}}}}}]"

    result = _temper(["train", task], cwd, cache)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert expected in result.stderr
    assert not any(cwd.iterdir()), "no run folder was made"


def _gguf_with_a_lying_header(path):
    """A GGUF header that claims far more metadata than the file holds."""
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little")
                     + (1_000_000).to_bytes(8, "little") + b"\x05\x00\x00\x00\x00\x00\x00\x00abcde")


@pytest.mark.parametrize("make, expected", [
    (lambda model, path: path.mkdir(),
     "is missing config.json, weights (*.safetensors or pytorch_model*.bin), tokenizer files"),
    (lambda model, path: (shutil.copytree(model, path), (path / "model.safetensors").write_bytes(b"\x00\xff" * 900)),
     "model.safetensors is not a valid safetensors file"),
    (lambda model, path: (shutil.copytree(model, path), (path / "config.json").unlink()), "is missing config.json"),
    (lambda model, path: _gguf_with_a_lying_header(path.with_suffix(".gguf")), "cannot load model"),
])
def test_a_broken_model_exits_2_saying_what_is_wrong(tmp_path, tiny_model_dir, make, expected):
    cache, cwd, model = tmp_path / "cache", tmp_path / "cwd", tmp_path / "model"
    cache.mkdir()
    cwd.mkdir()
    make(tiny_model_dir, model)
    path = model if model.exists() else model.with_suffix(".gguf")

    result = _temper(["train", f"model.path={path}", "steps=1"], cwd, cache)

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr and expected in result.stderr
    assert len(result.stderr.splitlines()) <= 3
    assert not any(cwd.iterdir()), "no run folder was made"
