"""The run folder is never overwritten, never shared by two runs, and never left unusable:
a damaged newest checkpoint is skipped on resume, and a full disk is one clear message that
loses nothing. Real runs of the miniature model, in this process and as separate processes."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tempering import checkpoint
from tempering.cli import main

ARGS = ["threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "eval.problems_per_task=2", "eval.max_new_tokens=8", "checkpoint.every=1", "checkpoint.keep=2"]


def _main(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["train", "--quiet", *args])
    return done.value.code, capsys.readouterr().err


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_new_run_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("my own file\n")
    (tmp_path / "summary.json").write_text("{}")
    code, err = _main(capsys, "--run-dir", str(tmp_path), "steps=1")
    assert code == 2 and "already holds a run" in err and "Traceback" not in err
    (tmp_path / "config.yaml").unlink()
    code, err = _main(capsys, "--run-dir", str(tmp_path), "steps=1")
    assert code == 2 and "is not empty and not a run folder (it holds summary.json)" in err
    assert (tmp_path / "summary.json").read_text() == "{}" and not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("run_dir, reason", [
    ("/proc/nope/run", "cannot make the run folder /proc/nope/run: no such file or directory"),
    ("{tmp}/file/run", "{tmp}/file is a file, not a folder"),
])
def test_a_run_folder_that_cannot_be_made_is_reported_with_its_real_cause(tmp_path, tiny_model_dir, capsys,
                                                                           run_dir, reason):
    (tmp_path / "file").write_text("not a folder")
    run_dir, reason = run_dir.format(tmp=tmp_path), reason.format(tmp=tmp_path)
    code, err = _main(capsys, "--run-dir", run_dir, f"model.path={tiny_model_dir}", "steps=1", *ARGS)
    assert code == 2 and "Traceback" not in err
    assert run_dir in err and reason in err
    assert "disk is full" not in err and "Free space" not in err


def test_resume_skips_a_damaged_newest_checkpoint_and_says_so(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    code, _ = _main(capsys, "--run-dir", str(run), f"model.path={tiny_model_dir}", "steps=3", *ARGS)
    assert code == 0
    newest = checkpoint.latest(run)
    assert newest.name == "step-00000003"
    data = bytearray((newest / "trainer.pt").read_bytes())
    data[-200] ^= 0xFF
    (newest / "trainer.pt").write_bytes(bytes(data))
    (run / "summary.json").unlink()

    code, err = _main(capsys, "--resume", str(run))

    assert code == 0, err
    assert f"skipping checkpoint {newest}: trainer.pt does not match its sha256" in err
    assert json.loads((run / "summary.json").read_text())["resumed_from"] == 2
    assert _steps(run) == [1, 2, 3]
    assert checkpoint.verify(checkpoint.latest(run)) is None, "step 3 was written again, intact"


def test_a_full_disk_while_checkpointing_stops_with_a_message_and_loses_nothing(tmp_path, tiny_model_dir,
                                                                              capsys, monkeypatch):
    run = tmp_path / "run"
    real_save, calls = checkpoint.torch.save, []

    def fills_up(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(*args, **kwargs)
    monkeypatch.setattr(checkpoint.torch, "save", fills_up)
    code, err = _main(capsys, "--run-dir", str(run), f"model.path={tiny_model_dir}", "steps=4", *ARGS)

    assert code == 2 and "Traceback" not in err
    assert f"cannot write {run / 'checkpoints' / 'step-00000003'}: no space left on device (the disk is full)" in err
    assert sorted(os.listdir(run / "checkpoints")) == ["step-00000001", "step-00000002"], "no half checkpoint"
    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed
    code, err = _main(capsys, "--resume", str(run))
    assert code == 0, err
    assert _steps(run) == [1, 2, 3, 4]


def test_a_full_disk_while_logging_names_the_disk_not_a_traceback(tmp_path, tiny_model_dir, capsys, monkeypatch):
    from tempering.reporting import metrics as reporting

    def full(self, record):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(reporting.MetricsWriter, "write", full)
    code, err = _main(capsys, "--run-dir", str(tmp_path / "run"), f"model.path={tiny_model_dir}", "steps=2", *ARGS)
    assert code == 2 and "Traceback" not in err
    assert "no space left on device (the disk is full)" in err and "--resume" in err


def test_a_resume_that_starts_over_removes_the_half_written_first_checkpoint(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    first = _start("--run-dir", str(run), f"model.path={tiny_model_dir}", "steps=2", *ARGS, kill_at="checkpoint:1")
    assert first.wait(timeout=600) == -signal.SIGKILL
    assert [p.name.startswith(".tmp-step-00000001-") for p in (run / "checkpoints").iterdir()] == [True]

    code, err = _main(capsys, "--resume", str(run))

    assert code == 0, err
    assert _steps(run) == [1, 2], "no checkpoint was complete: the run started over"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]


def _start(*args: str, kill_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    return subprocess.Popen([sys.executable, "-m", "tempering.cli", "train", "--quiet", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_a_step(proc: subprocess.Popen, run: Path, after: int) -> None:
    while proc.poll() is None and len(_steps(run) if (run / "metrics.jsonl").exists() else []) <= after:
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()


def test_two_runs_never_write_one_folder_and_a_killed_run_leaves_no_lock(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    first = _start("--run-dir", str(run), f"model.path={tiny_model_dir}", "steps=100000", *ARGS, kill_at="learn:2")
    assert first.wait(timeout=600) == -signal.SIGKILL

    holder = _start("--resume", str(run))
    _wait_for_a_step(holder, run, after=1)  # it holds the lock: it is writing steps
    second = _start("--resume", str(run))
    _, err = second.communicate(timeout=600)
    assert second.returncode == 2 and "Traceback" not in err
    assert f"run folder {run} is in use by another temper process (pid {holder.pid})" in err
    assert holder.poll() is None, "the holder was not disturbed"

    done = len(_steps(run))
    holder.send_signal(signal.SIGKILL)  # no chance to clean up: the kernel drops its lock
    holder.wait(timeout=60)
    third = _start("--resume", str(run))
    _wait_for_a_step(third, run, after=min(done, len(_steps(run))))
    third.send_signal(signal.SIGKILL)
    third.wait(timeout=60)


def _temper(command: str, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "tempering.cli", command, "--quiet", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def _sft_records(path: Path) -> Path:
    from tempering.tasks import build_task

    task = build_task("add", seed=0, digits=[2])
    with path.open("w") as f:
        for i in range(120):
            problem = task.train_problem(i)
            f.write(json.dumps({"prompt": problem.prompt, "completion": task.solution(problem)}) + "\n")
    return path


@pytest.mark.parametrize("command", ["train", "sft"])
def test_both_commands_hold_the_folder_and_resume_with_the_log_cut_back_to_the_checkpoint(command, tmp_path,
                                                                                         tiny_model_dir):
    run = tmp_path / "run"
    settings = {"train": ["steps=5", *ARGS[:-2], "checkpoint.every=2"],
                "sft": [str(_sft_records(tmp_path / "add.jsonl")), "threads=1", "sft.batch_tokens=1024",
                        "sft.epochs=1", "checkpoint.every=2"]}[command]
    killed = _temper(command, *settings, f"model.path={tiny_model_dir}", "--run-dir", str(run), kill_at="learn:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _steps(run) == [1, 2, 3] and checkpoint.latest(run).name == "step-00000002"

    holder = subprocess.Popen([sys.executable, "-c", f"from tempering import checkpoint; import sys\n"
                               f"held = checkpoint.open_run({str(run)!r}, resume=True); print('held', flush=True)\n"
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        refused = _temper(command, "--resume", str(run))
    finally:
        holder.communicate("", timeout=60)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"run folder {run} is in use by another temper process (pid {holder.pid})" in refused.stderr
    assert _steps(run) == [1, 2, 3], "a refused run writes nothing"

    resumed = _temper(command, "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == 2 and _steps(run) == list(range(1, summary["steps"] + 1))
