"""Metric sinks on real runs: TensorBoard's event files, MLflow's local store and the offline W&B
run, read back (the first two with their own readers, W&B's log with its record format), hold
exactly the numbers of ``metrics.jsonl`` (every numeric key, every step), also after a run was
SIGKILLed and resumed; a missing package names its extra."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.config import ConfigError, load_config
from tempering.sinks import check_sinks, mlflow_uri, scalars

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")

ARGS = ["steps=4", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24",
        "eval.problems_per_task=4", "eval.max_new_tokens=24", "eval.every=2", "checkpoint.every=2",
        "logging.sinks=[tensorboard,mlflow,wandb]"]


def temper(*args: str, kill_at: str | None = None) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    proc = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "--quiet", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
    return proc.returncode


def expected(run: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl as key -> step -> value, for the keys sinks get."""
    table: dict[str, dict[int, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in scalars(record).items():
            table.setdefault(key, {})[record["step"]] = value
    return table


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    found = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return {tag: points for tag, points in found.items() if points}  # a tag whose every step was purged stays listed


def mlflow_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri(run))
    experiment = client.get_experiment_by_name("tempering")
    [found] = client.search_runs([experiment.experiment_id])  # active runs only: one, however often resumed
    return {key: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, key)]
            for key in found.data.metrics}


def log_records(data: bytes) -> list[bytes]:
    """The records of a W&B ``.wandb`` file: LevelDB's log format after a 7-byte file header,
    in 32 KiB blocks, each piece behind a 7-byte header (CRC, length, FULL/FIRST/MIDDLE/LAST)."""
    records, partial, position = [], b"", 7
    while position + 7 <= len(data):
        room = 32768 - position % 32768
        if room < 7:  # a block's tail too short for a header is padding
            position += room
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        piece = data[position + 7:position + 7 + length]
        position += 7 + length
        partial = piece if kind in (1, 2) else partial + piece
        if kind in (1, 4):
            records.append(partial)
    return records


def wandb_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The history of a run folder's newest offline W&B run, without W&B's own ``_`` keys."""
    from wandb.proto.wandb_internal_pb2 import Record

    [log] = (run / "wandb" / "latest-run").glob("*.wandb")
    found: dict[str, list[tuple[int, float]]] = {}
    for data in log_records(log.read_bytes()):
        record = Record.FromString(data)
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)  # W&B writes keys with a slash as nested ones
                if not key.startswith("_"):
                    found.setdefault(key, []).append((record.history.step.num, float(json.loads(item.value_json))))
    return found


def same(value: float, other: float) -> bool:
    """Equal to float32 precision (TensorBoard stores float32), or both NaN."""
    return (math.isnan(value) and math.isnan(other)) or math.isclose(value, other, rel_tol=1e-6, abs_tol=1e-30)


def assert_holds_metrics(found: dict[str, list[tuple[int, float]]], table: dict[str, dict[int, float]]) -> None:
    assert set(found) == set(table)
    for key, by_step in table.items():
        steps = [step for step, _ in found[key]]
        assert sorted(steps) == sorted(by_step), (key, steps)  # every step once: no gaps, no repeats
        for step, value in found[key]:
            assert same(value, by_step[step]), (key, step, value, by_step[step])


def test_sinks_hold_the_numbers_of_metrics_jsonl(tmp_path: Path, tiny_model_dir: Path):
    run = tmp_path / "run"
    assert temper(*ARGS, f"model.path={tiny_model_dir}", "--run-dir", str(run)) == 0
    table = expected(run)
    assert {"reward", "loss", "eval/accuracy", "domain/add/reward"} <= set(table)
    assert sorted(table["reward"]) == [1, 2, 3, 4] and sorted(table["eval/accuracy"]) == [2]
    assert_holds_metrics(tensorboard_scalars(run), table)
    assert_holds_metrics(mlflow_scalars(run), table)
    assert_holds_metrics(wandb_scalars(run), table)


def test_a_resumed_run_shows_each_step_once_in_the_sinks(tmp_path: Path, tiny_model_dir: Path):
    run = tmp_path / "run"
    # killed inside step 4's learner update: steps 1-3 are in every sink, the checkpoint is step 2's
    assert temper(*ARGS, f"model.path={tiny_model_dir}", "--run-dir", str(run), kill_at="learn:4") == -signal.SIGKILL
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert temper("--resume", str(run)) == 0
    table = expected(run)
    assert sorted(table["reward"]) == [1, 2, 3, 4]
    assert_holds_metrics(tensorboard_scalars(run), table)
    assert_holds_metrics(mlflow_scalars(run), table)
    assert_holds_metrics(wandb_scalars(run), table)


def test_a_sink_whose_package_is_missing_names_its_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.sinks: wandb needs the wandb package.*tempering\[wandb\]"):
        check_sinks(["tensorboard", "wandb"])


def test_an_unknown_sink_is_a_config_error():
    with pytest.raises(ConfigError, match="logging.sinks.0"):
        load_config(None, ["logging.sinks=[tensorbord]"])


def test_wandb_writes_an_offline_run_in_the_run_folder(tmp_path: Path):
    from tempering.sinks import WandbSink

    sink = WandbSink(tmp_path, [{"step": 1, "reward": 0.5}], True, {"seed": 0})
    assert sink._run.offline  # never the network
    sink.write(2, {"reward": 0.75})
    sink.close()
    wandb.teardown()  # W&B's service may write the log after finish(); its end, like this process's, waits for it
    assert wandb_scalars(tmp_path) == {"reward": [(1, 0.5), (2, 0.75)]}
