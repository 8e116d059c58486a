"""Prompts longer than the model's context are refused, truncated or left out, by
``rollout.max_prompt_tokens`` and ``rollout.long_prompts``, never sampled as they are."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from tempering.cli import main
from tempering.config import ConfigError
from tempering.rollout.hf import HFGenerator, SamplingParams
from tempering.types import Problem

ARGS = ["steps=1", "threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "eval.problems_per_task=2", "eval.max_new_tokens=8", "checkpoint.every=0"]


def _dataset(tmp_path, long_at=(7,)):
    records = [{"question": f"{i}+1=" if i not in long_at else "9" * 5000 + "+1=", "answer": i + 1}
               for i in range(40)]
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _train(capsys, tmp_path, model_dir, data, *extra):
    capsys.readouterr()
    task = f"tasks=[{{name: dataset, options: {{path: {data}, kind: math, style: raw}}}}]"
    with pytest.raises(SystemExit) as done:
        main(["train", "--quiet", "--run-dir", str(tmp_path / "run"), f"model.path={model_dir}", task, *ARGS, *extra])
    return done.value.code, capsys.readouterr().err


def test_a_dataset_prompt_beyond_the_context_stops_the_run_at_start_up(tmp_path, tiny_model_dir, capsys):
    code, err = _train(capsys, tmp_path, tiny_model_dir, _dataset(tmp_path))
    assert code == 2 and "Traceback" not in err
    # 256 positions - 8 new tokens; a 5004-character record is counted in its first 5 * 249 (5: "<bos>")
    assert (f"task dataset, record {tmp_path / 'data.jsonl'}:8: the prompt is over the limit of 248 tokens "
            "(its first 1245 characters are 1246 tokens)") in err and "rollout.long_prompts" in err
    assert not (tmp_path / "run").exists(), "refused before the run folder was made"


def test_skip_leaves_long_records_out_and_truncate_keeps_them_cut(tmp_path, tiny_model_dir, capsys):
    data = _dataset(tmp_path)
    code, err = _train(capsys, tmp_path / "skip", tiny_model_dir, data, "rollout.long_prompts=skip")
    assert code == 0, err
    assert f"task dataset: left out 1 records whose prompts are over 248 tokens (first: {data}:8)" in err
    code, err = _train(capsys, tmp_path / "cut", tiny_model_dir, data, "rollout.long_prompts=truncate",
                       "rollout.max_prompt_tokens=100")
    assert code == 0, err


@pytest.mark.parametrize("mode", ["error", "skip"])
def test_a_dataset_whose_every_prompt_is_too_long_exits_2_naming_the_first(tmp_path, tiny_model_dir, capsys, mode):
    data, held_out = tmp_path / "long.jsonl", _dataset(tmp_path, long_at=())
    data.write_text("".join(json.dumps({"question": "9" * (300 + i), "answer": i}) + "\n" for i in range(40)))
    code, err = _train(capsys, tmp_path, tiny_model_dir, data, f"rollout.long_prompts={mode}",
                       f"tasks.0.options.eval_path={held_out}")
    assert code == 2 and "Traceback" not in err
    assert f"{data}:1" in err and "the limit of 248" in err
    assert not (tmp_path / "run").exists(), "refused before the run folder was made"


def test_the_sampler_truncates_or_refuses_a_generated_prompt(tiny_policy):
    model, tokenizer = tiny_policy
    generator = HFGenerator(model, tokenizer, chat_template=False)
    problem = Problem(task="add", id="long", prompt="1" * 400 + "+1=\n", answer="")
    cut = generator.generate([problem], 2, SamplingParams(max_new_tokens=4, max_prompt_tokens=50,
                                                          long_prompts="truncate"))
    full = generator.encode_prompt(problem.prompt)
    assert [r.prompt_ids for r in cut[0].rollouts] == [full[-50:]] * 2
    with pytest.raises(ConfigError, match="task add, record long: the prompt is 405 tokens, over the limit of 252"):
        generator.generate([problem], 2, SamplingParams(max_new_tokens=4, long_prompts="error"))


def test_long_prompts_are_sampled_in_batches_their_cache_fits(tiny_policy, monkeypatch):
    """A batch holds ``batch_size`` rows, or fewer where their key/value cache would pass
    ``CACHE_BUDGET_BYTES`` (the evaluation's 256 rows at 4,096 tokens would not fit SmolLM2's in
    24 GB); the completions are the same either way."""
    from tempering.rollout import hf

    model, tokenizer = tiny_policy
    problems = [Problem(task="add", id=str(i), prompt=f"{i}+{7 * i}=" + " " * 150 + "\n", answer="") for i in range(6)]
    params = SamplingParams(max_new_tokens=8, greedy=True)
    generator = HFGenerator(model, tokenizer, chat_template=False, batch_size=256)
    whole = generator.generate(problems, 2, params)
    positions = max(len(generator.encode_prompt(p.prompt)) for p in problems) + params.max_new_tokens
    config = model.config  # keys and values of every layer, float32
    row_bytes = positions * 2 * config.num_hidden_layers * config.hidden_size * 4
    monkeypatch.setattr(hf, "CACHE_BUDGET_BYTES", 5 * row_bytes + row_bytes // 2, raising=False)
    batches = []
    sample = generator.sample_with_alternatives
    monkeypatch.setattr(generator, "sample_with_alternatives",
                        lambda prompts, *a, **k: batches.append(len(prompts)) or sample(prompts, *a, **k))
    cut = generator.generate(problems, 2, params)
    assert batches == [5, 5, 2]
    assert [[r.completion_ids for r in g.rollouts] for g in cut] == [[r.completion_ids for r in g.rollouts] for g in whole]


def _peak_rss_mb(args: list[str]) -> tuple[int, int, str]:
    """Run ``temper`` in a child: its exit status, its peak resident memory in MiB and its
    error output. Its address space is capped at 6 GiB, so a regression that tokenizes a huge
    record whole (about 13 GB) fails here instead of exhausting the machine."""
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # noqa: E731
    child = subprocess.Popen([sys.executable, "-m", "tempering.cli", *args], stderr=subprocess.PIPE, text=True,
                             preexec_fn=cap)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss // 1024, err


def test_one_huge_record_among_twenty_is_left_out_in_bounded_memory(tmp_path, tiny_model_dir):
    short = [{"question": f"{i}+1=", "answer": i + 1} for i in range(19)]
    huge = [*short[:3], {"question": "9" * 30_000_000, "answer": 1}, *short[3:]]
    peaks = {}
    for name, records in (("short", short), ("huge", huge)):
        data = tmp_path / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
        task = f"tasks=[{{name: dataset, options: {{path: {data}, kind: math, style: raw, eval_path: {data}}}}}]"
        code, peaks[name], err = _peak_rss_mb(["train", "--quiet", "--run-dir", str(tmp_path / name),
                                                f"model.path={tiny_model_dir}", task, *ARGS,
                                                "rollout.long_prompts=skip"])
        assert code == 0, err
    assert f"left out 2 records whose prompts are over 248 tokens (first: {tmp_path / 'huge.jsonl'}:4)" in err
    # the file is read whole (a 30 MB line, its text, its JSON value): a few times its size, not 450 bytes a character
    assert peaks["huge"] - peaks["short"] < 400, peaks
