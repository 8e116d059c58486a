"""A run SIGKILLed again and again, and resumed each time, ends bitwise where an
uninterrupted run ends: same final weights, same step records in metrics.jsonl.

The kills are real SIGKILLs of a real ``temper train`` process: some at named points
(inside sampling, inside a learner step, in the middle of writing a checkpoint; see
``tempering.faults``), some after a random delay, wherever the run happens to be.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tempering import checkpoint
from tempering.train import is_timing

ARGS = ["steps=30", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4",
        "rollout.max_new_tokens=24", "eval.problems_per_task=6", "eval.max_new_tokens=24",
        "checkpoint.every=1", "checkpoint.keep=2"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def temper(*args: str, kill_at: str | None = None, kill_during: Path | None = None,
           rng: random.Random | None = None) -> int:
    """Run ``temper train``; with ``kill_at`` it kills itself at that point; with ``kill_during``
    (a run folder) it is SIGKILLed a random moment after it has finished its first new step."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    proc = subprocess.Popen([sys.executable, "-m", "tempering.cli", "train", "--quiet", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if kill_during is not None:
        metrics = kill_during / "metrics.jsonl"
        start = _lines(metrics)
        while proc.poll() is None and _lines(metrics) <= start:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.15))  # a step of this run takes about that long
        proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"temper train failed ({proc.returncode}):\n{err[-3000:]}")
    return proc.returncode


def step_records(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing(k)} for r in records]


def weights(run: Path) -> bytes:
    from safetensors.torch import load_file

    tensors = load_file(run / "checkpoint-final" / "model.safetensors")
    return b"".join(name.encode() + t.numpy().tobytes() for name, t in sorted(tensors.items()))


def test_sigkilled_sync_run_resumes_bitwise(tmp_path: Path, tiny_model_dir: Path):
    reference, run = tmp_path / "reference", tmp_path / "run"
    args = [*ARGS, f"model.path={tiny_model_dir}"]
    assert temper(*args, "--run-dir", str(reference)) == 0

    rng = random.Random(7)
    kills = ["sample:3", "learn:2", "checkpoint:2", None, "learn:3", None, "checkpoint:1", "sample:2", None,
             "checkpoint:3", None, "sample:2", None]
    outcomes, torn_seen = [], False
    for i, kill_at in enumerate(kills):
        if checkpoint.latest(run) is not None and checkpoint.latest(run).name == "step-00000030":
            break
        before = checkpoint.latest(run)
        code = temper(*([*args, "--run-dir", str(run)] if i == 0 else ["--resume", str(run)]), kill_at=kill_at, kill_during=None if kill_at else run, rng=rng)
        outcomes.append(code)
        if kill_at and kill_at.startswith("checkpoint") and code == -signal.SIGKILL:
            torn = [p for p in checkpoint.checkpoints_dir(run).iterdir() if p.name.startswith(".tmp-")]
            assert torn, "a kill inside a checkpoint write leaves its temporary directory"
            newest = checkpoint.latest(run)
            assert newest is not None and not newest.name.startswith(".")
            assert newest == before or int(newest.name[5:]) > int(before.name[5:] if before else -1)
            checkpoint.load_state(newest)  # and what resume would pick loads
            torn_seen = True
    assert outcomes.count(-signal.SIGKILL) >= 10, outcomes
    assert torn_seen
    assert temper("--resume", str(run)) == 0

    assert weights(run) == weights(reference)
    assert step_records(run) == step_records(reference)
    assert [r["step"] for r in step_records(run)] == list(range(1, 31))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval_after"] == json.loads((reference / "summary.json").read_text())["eval_after"]


def test_resume_refuses_overrides_and_non_runs(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "--resume", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "not a run folder" in result.stderr
    (tmp_path / "config.yaml").write_text("steps: 1\n")
    result = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "--resume", str(tmp_path), "steps=3"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "saved config" in result.stderr


PARTIAL = ["threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
           "eval.problems_per_task=4", "eval.max_new_tokens=8", "checkpoint.every=1", "checkpoint.keep=2",
           "pipeline.mode=async", "pipeline.partial_rollouts=true", "pipeline.partial_chunk_tokens=6"]
"""An async run with partial rollouts: each round after the first takes the learner's new
weights after 6 of its at most 16 tokens."""


@pytest.fixture(scope="module")
def partial_reference(tmp_path_factory, tiny_model_dir: Path) -> Path:
    """An uninterrupted async run with partial rollouts, 8 steps."""
    run = tmp_path_factory.mktemp("partial") / "reference"
    assert temper(*PARTIAL, "steps=8", f"model.path={tiny_model_dir}", "--run-dir", str(run)) == 0
    return run


def kill_and_resume(run: Path, args: list[str], kills: list[str | None], rng: random.Random) -> list[int]:
    """Start the run in ``run`` and resume it after each try of ``kills`` (a named point, or None:
    a random moment after the process's first new step), then resume it to the end; the tries'
    exit codes (a try the run outlived exits 0 and ends the tries)."""
    outcomes = []
    for i, kill_at in enumerate(kills):
        outcomes.append(temper(*([*args, "--run-dir", str(run)] if i == 0 else ["--resume", str(run)]),
                               kill_at=kill_at, kill_during=None if kill_at else run, rng=rng))
        if outcomes[-1] == 0:
            return outcomes
    assert temper("--resume", str(run)) == 0
    return outcomes


def assert_same_run(run: Path, reference: Path, steps: int) -> None:
    assert weights(run) == weights(reference)
    assert step_records(run) == step_records(reference)
    assert [r["step"] for r in step_records(run)] == list(range(1, steps + 1))


def test_an_async_run_with_partial_rollouts_repeats_itself(tmp_path: Path, tiny_model_dir: Path,
                                                           partial_reference: Path):
    """Two async runs with partial rollouts and the same seed: the same step records and the
    same weights, whatever the timing of the sampling thread against the learner's."""
    again = tmp_path / "again"
    assert temper(*PARTIAL, "steps=8", f"model.path={tiny_model_dir}", "--run-dir", str(again)) == 0
    assert_same_run(again, partial_reference, 8)
    records = step_records(partial_reference)
    # new weights did take over within rounds: tokens of two versions in every round after the first
    assert all(0 < r["staleness/token_mean"] < r["staleness/mean"] == 1 for r in records[1:]), records


def test_a_sigkilled_async_run_with_partial_rollouts_resumes_bitwise(tmp_path: Path, tiny_model_dir: Path,
                                                                     partial_reference: Path):
    """Killed in the middle of a round, as it takes new weights, and at a random moment, then
    resumed: the uninterrupted run's weights and step records, bit for bit."""
    run = tmp_path / "run"
    outcomes = kill_and_resume(run, [*PARTIAL, "steps=8", f"model.path={tiny_model_dir}"], ["swap:3", None],
                               random.Random(5))
    assert outcomes == [-signal.SIGKILL] * 2
    assert_same_run(run, partial_reference, 8)


@pytest.mark.slow
def test_an_async_run_with_partial_rollouts_killed_at_ten_points_resumes_bitwise(tmp_path: Path,
                                                                                tiny_model_dir: Path):
    """Ten SIGKILLs, at named points drawn by a seeded generator (inside sampling, as a round
    takes new weights, inside a learner step, inside a checkpoint write, before a round) and at
    random moments, spread over a 24-step run (slow: about 15 runs of the CLI)."""
    reference, run = tmp_path / "reference", tmp_path / "run"
    args = [*PARTIAL, "steps=24", f"model.path={tiny_model_dir}"]
    assert temper(*args, "--run-dir", str(reference)) == 0
    rng = random.Random(17)
    kills = [None if rng.random() < 0.3 else f"{rng.choice(['swap', 'sample', 'learn', 'checkpoint', 'round'])}:"
             f"{rng.randint(1, 3)}" for _ in range(12)]
    outcomes = kill_and_resume(run, args, kills, rng)
    assert outcomes.count(-signal.SIGKILL) >= 10, (kills, outcomes)
    assert_same_run(run, reference, 24)


def test_sigkilled_async_run_loses_no_rollouts(tmp_path: Path, tiny_model_dir: Path):
    """Asynchronous mode with two rounds buffered, killed and resumed: every rollout the
    surviving run sampled is trained on, dropped as stale, or still buffered at the end, and
    it ends bitwise where the uninterrupted run ends (where weights change is decided by the
    learner's steps, not by when the sampling thread gets to them)."""
    reference, run = tmp_path / "reference", tmp_path / "run"
    args = [*ARGS, f"model.path={tiny_model_dir}", "pipeline.mode=async", "pipeline.buffer_rounds=2",
            "eval.problems_per_task=30"]
    assert temper(*args, "--run-dir", str(reference)) == 0
    rng = random.Random(3)
    kills = ["sample:4", "learn:2", "checkpoint:2", None, "learn:3", None]
    outcomes = []
    for i, kill_at in enumerate(kills):
        outcomes.append(temper(*([*args, "--run-dir", str(run)] if i == 0 else ["--resume", str(run)]),
                               kill_at=kill_at, kill_during=None if kill_at else run, rng=rng))
    assert outcomes.count(-signal.SIGKILL) >= 5, outcomes
    assert temper("--resume", str(run)) == 0

    summary = json.loads((run / "summary.json").read_text())
    counts = summary["rollouts"]
    assert counts["sampled"] == counts["taken"] + counts["dropped_stale"] + counts["left_in_buffer"], counts
    assert counts["taken"] >= 30 * 4 * 4  # every step trained a full round
    records = step_records(run)
    assert [r["step"] for r in records] == list(range(1, 31))
    assert all(r["staleness"] <= 1 for r in records)
    # each rollout trained is counted once in its step's histogram, at most max_staleness behind
    assert all(r["staleness/hist/0"] + r["staleness/hist/1"] == 4 * 4 and r["staleness/max"] <= 1 for r in records)
    assert weights(run) == weights(reference)
    assert records == step_records(reference)


def test_a_new_run_refuses_a_folder_that_holds_one(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    result = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "--run-dir", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "already holds a run" in result.stderr and "--resume" in result.stderr
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n', "nothing of the old run is touched"


def test_a_run_whose_data_file_changed_refuses_to_resume_with_a_clear_error(tmp_path, tiny_model_dir, capsys):
    from tempering.cli import main

    data = tmp_path / "data.jsonl"
    records = [{"question": f"{i}+1=", "answer": i + 1} for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = tmp_path / "run"
    args = ["train", "--quiet", "--run-dir", str(run), f"model.path={tiny_model_dir}", "steps=2", "threads=1",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
            "eval.problems_per_task=2", "eval.max_new_tokens=4", "checkpoint.every=1",
            "tasks=[{name: dataset, options: {path: " + str(data) + ", kind: math}}]"]
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 0
    data.write_text("".join(json.dumps(r) + "\n" for r in records[:30]))  # records removed under the run
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["train", "--quiet", "--resume", str(run)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "cannot resume from" in err and "the file now has" in err and "Traceback" not in err
