"""Checkpoint writing and discovery: only complete, fully renamed, intact directories count."""

import errno
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from tempering import checkpoint
from tempering.config import ConfigError
from tempering.models.tiny import build_model
from tempering.reporting.metrics import truncate_metrics


def _model():
    return build_model(vocab_size=12, hidden_size=16, layers=1, heads=2, max_positions=32, seed=0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)


def test_save_is_complete_loadable_and_keeps_the_newest(tmp_path: Path):
    model = _model()
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, model, None, {"step": step, "t": torch.arange(step)}, keep=2)
    names = [p.name for p in checkpoint.list_checkpoints(tmp_path)]
    assert names == ["step-00000002", "step-00000003"]
    latest = checkpoint.latest(tmp_path)
    assert checkpoint.load_state(latest)["t"].tolist() == [0, 1, 2]
    other = build_model(vocab_size=12, hidden_size=16, layers=1, heads=2, max_positions=32, seed=1,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    checkpoint.load_model_weights(other, latest)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    meta = json.loads((latest / "meta.json").read_text())
    assert meta["step"] == 3 and meta["files"]["trainer.pt"]["size"] == (latest / "trainer.pt").stat().st_size
    assert len(meta["files"]["model/model.safetensors"]["sha256"]) == 64


def test_partial_and_doomed_directories_are_never_picked_and_are_cleaned(tmp_path: Path):
    model = _model()
    checkpoint.save(tmp_path, 4, model, None, {"step": 4})
    root = checkpoint.checkpoints_dir(tmp_path)
    (root / ".tmp-step-00000005-123").mkdir()                      # a write cut short
    (root / ".tmp-step-00000005-123" / "trainer.pt").write_bytes(b"torn")
    (root / ".del-step-00000001-9").mkdir()                         # a deletion cut short
    no_meta = root / "step-00000009"                                # a directory without meta.json
    no_meta.mkdir()
    (no_meta / "trainer.pt").write_bytes(b"")
    assert checkpoint.latest(tmp_path).name == "step-00000004"
    assert sorted(checkpoint.clean_partial(tmp_path)) == [".del-step-00000001-9", ".tmp-step-00000005-123"]
    assert sorted(os.listdir(root)) == ["step-00000004", "step-00000009"]


def test_a_kill_inside_save_leaves_the_previous_checkpoint_as_latest(tmp_path: Path, monkeypatch):
    model = _model()
    checkpoint.save(tmp_path, 1, model, None, {"step": 1})

    def die(name):
        if name == "checkpoint":
            raise KeyboardInterrupt  # stands in for the SIGKILL the integration test sends
    monkeypatch.setattr(checkpoint.faults, "point", die)
    try:
        checkpoint.save(tmp_path, 2, model, None, {"step": 2})
    except KeyboardInterrupt:
        pass
    assert checkpoint.latest(tmp_path).name == "step-00000001"
    assert any(p.name.startswith(".tmp-step-00000002") for p in checkpoint.checkpoints_dir(tmp_path).iterdir())


def test_truncate_metrics_keeps_steps_up_to_the_checkpoint_and_drops_a_torn_line(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "rew')
    assert truncate_metrics(path, 3) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    assert truncate_metrics(tmp_path / "missing.jsonl", 3) == 0


def _flip_a_byte(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, reason", [
    (lambda c: _flip_a_byte(c / "trainer.pt"), "trainer.pt does not match its sha256"),
    (lambda c: _flip_a_byte(c / "model" / "model.safetensors"), "model/model.safetensors does not match its sha256"),
    (lambda c: (c / "trainer.pt").write_bytes((c / "trainer.pt").read_bytes()[:50]), "trainer.pt is 50 bytes"),
    (lambda c: (c / "model" / "model.safetensors").unlink(), "model/model.safetensors is missing"),
    (lambda c: (c / "meta.json").write_text("{"), "meta.json is unreadable"),
])
def test_a_damaged_newest_checkpoint_is_skipped_saying_why(tmp_path: Path, damage, reason):
    model = _model()
    for step in (1, 2):
        checkpoint.save(tmp_path, step, model, None, {"step": step}, keep=2)
    damage(checkpoint.latest(tmp_path))
    reported = []
    found = checkpoint.usable(tmp_path, report=reported.append)
    assert found.name == "step-00000001"
    assert len(reported) == 1 and "step-00000002" in reported[0] and reason in reported[0]
    assert checkpoint.resume_point(tmp_path).name == "step-00000001"


def test_a_run_whose_checkpoints_are_all_damaged_is_refused_not_started_over(tmp_path: Path):
    checkpoint.save(tmp_path, 1, _model(), None, {"step": 1})
    _flip_a_byte(checkpoint.latest(tmp_path) / "trainer.pt")
    with pytest.raises(ConfigError, match="no checkpoint is intact"):
        checkpoint.resume_point(tmp_path)
    assert checkpoint.resume_point(tmp_path / "never-checkpointed") is None


def _as_earlier_format(path: Path) -> None:
    """Rewrite meta.json as checkpoints were written before manifests had checksums."""
    meta = json.loads((path / "meta.json").read_text())
    meta["files"] = {name: entry["size"] for name, entry in meta["files"].items()}
    (path / "meta.json").write_text(json.dumps(meta))


def test_an_earlier_format_checkpoint_is_used_and_checked_as_far_as_it_can_be(tmp_path: Path):
    model = _model()
    for step in (1, 2):
        checkpoint.save(tmp_path, step, model, None, {"step": step, "t": torch.arange(1000)}, keep=2)
        _as_earlier_format(checkpoint.latest(tmp_path))
    assert checkpoint.usable(tmp_path, report=pytest.fail).name == "step-00000002"
    newest = checkpoint.latest(tmp_path)
    with zipfile.ZipFile(newest / "trainer.pt") as archive:  # damage a tensor's bytes, not the archive's layout
        info = next(i for i in archive.infolist() if "/data/" in i.filename)
    header = (newest / "trainer.pt").read_bytes()[info.header_offset:info.header_offset + 30]
    name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    _flip_a_byte(newest / "trainer.pt", info.header_offset + 30 + name_len + extra_len + 10)
    reported = []
    assert checkpoint.usable(tmp_path, report=reported.append).name == "step-00000001"
    assert "does not match its CRC" in reported[0]


def test_a_full_disk_during_a_checkpoint_leaves_the_previous_ones_and_no_partial_one(tmp_path: Path, monkeypatch):
    model = _model()
    checkpoint.save(tmp_path, 1, model, None, {"step": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(checkpoint.StorageError) as caught:
        checkpoint.save(tmp_path, 2, model, None, {"step": 2})
    message = str(caught.value)
    assert "step-00000002" in message and "no space left on device (the disk is full)" in message
    assert "--resume" in message
    assert sorted(os.listdir(checkpoint.checkpoints_dir(tmp_path))) == ["step-00000001"], "no partial checkpoint"
    assert checkpoint.usable(tmp_path, report=pytest.fail).name == "step-00000001"


def test_a_write_error_that_is_not_about_space_passes_unchanged(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(checkpoint.torch, "save", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        checkpoint.save(tmp_path, 1, _model(), None, {"step": 1})


@pytest.mark.parametrize("error, reason", [
    (PermissionError(errno.EACCES, "Permission denied", "/proc/x"), "cannot write /proc/x: permission denied"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/proc/x"), "cannot write /proc/x: not a directory"),
])
def test_a_write_error_is_reported_by_its_cause_even_where_no_space_is_free(error, reason):
    with pytest.raises(checkpoint.StorageError) as caught, checkpoint.writing(Path("/proc/x")):  # /proc: 0 bytes free
        raise error
    assert str(caught.value).startswith(reason)
    assert "disk is full" not in str(caught.value) and "Free space" not in str(caught.value)


def test_a_non_empty_folder_that_is_not_a_run_is_refused(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty and not a run folder .it holds notes.txt."):
        checkpoint.check_run_dir(str(tmp_path), resume=False)
    (tmp_path / "notes.txt").unlink()
    (tmp_path / "config.yaml").write_text("steps: 1\n")
    with pytest.raises(ConfigError, match="already holds a run; continue it with `temper train --resume"):
        checkpoint.check_run_dir(str(tmp_path), resume=False)
    checkpoint.check_run_dir(str(tmp_path), resume=True)
    checkpoint.check_run_dir(str(tmp_path / "new"), resume=False)


def test_a_run_folder_is_locked_against_other_processes_until_released(tmp_path: Path):
    path, lock = checkpoint.open_run_dir(str(tmp_path / "run"), resume=False)
    other = f"from tempering import checkpoint\ncheckpoint.open_run_dir({str(path)!r}, resume=True)"
    result = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
    assert f"is in use by another temper process (pid {os.getpid()})" in result.stderr
    lock.release()
    assert subprocess.run([sys.executable, "-c", other]).returncode == 0


def _log(path: Path, steps: list[int], torn: str = "") -> None:
    path.write_text("".join(json.dumps({"step": step}) + "\n" for step in steps) + torn)


def test_a_run_that_starts_writes_its_config_and_one_that_resumes_cuts_its_logs_to_the_checkpoint(tmp_path: Path):
    from tempering.config import TrainConfig

    config = TrainConfig(steps=7, run_dir=str(tmp_path / "run"))
    started = checkpoint.open_run(config.run_dir, resume=False)
    assert started.resume_from is None
    assert started.start(config, restore=lambda found: pytest.fail("nothing to restore")) is None
    assert "steps: 7" in (started.path / "config.yaml").read_text()
    checkpoint.save(started.path, 2, _model(), None, {"step": 2})
    _log(started.path / "metrics.jsonl", [1, 2, 3], torn='{"step": 4, "lo')
    _log(started.path / "samples.jsonl", [1, 2, 3])
    started.finish({"steps": 3})
    assert json.loads((started.path / "summary.json").read_text()) == {"steps": 3}

    resumed = checkpoint.open_run(config.run_dir, resume=True)
    assert resumed.start(config.model_copy(update={"steps": 9}), restore=lambda found: found.name) == "step-00000002"
    assert [json.loads(line)["step"] for line in (resumed.path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert [json.loads(line)["step"] for line in (resumed.path / "samples.jsonl").read_text().splitlines()] == [1, 2]
    assert "steps: 7" in (resumed.path / "config.yaml").read_text(), "a resumed run keeps the config it started with"
    resumed.lock.release()


def test_open_run_refuses_a_folder_another_process_holds(tmp_path: Path):
    held = checkpoint.open_run(str(tmp_path / "run"), resume=False)
    other = f"from tempering import checkpoint\ncheckpoint.open_run({str(held.path)!r}, resume=True)"
    result = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True)
    assert f"is in use by another temper process (pid {os.getpid()})" in result.stderr
    held.finish({})
    assert subprocess.run([sys.executable, "-c", other]).returncode == 0
