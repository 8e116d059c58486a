"""Checkpoint writing and discovery: only complete, fully renamed directories count."""

import json
import os
from pathlib import Path

import torch

from tempering import checkpoint
from tempering.models.tiny import build_model
from tempering.reporting import truncate_metrics


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
    assert meta["step"] == 3 and meta["files"]["trainer.pt"] > 0


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
