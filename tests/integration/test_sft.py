"""``temper sft`` on the miniature built-in model, with the arithmetic tasks' correct worked
solutions as data: the held-out loss falls, and the checkpoint starts an RL run and is evaluated.

Nothing is mocked; the LoRA resume test SIGKILLs a real ``temper sft`` process mid-run.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from tempering.cli import main
from tempering.config import TrainConfig
from tempering.models.loading import load_model
from tempering.sft import Passes, heldout_loss, sft
from tempering.tasks import build_task
from tempering.tasks.sft_records import encode_all, load_split
from tempering.train import train


def _pretrain_config(model_dir) -> dict:
    return json.loads((model_dir / "pretrain.json").read_text())["config"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Prompt/completion records: addition problems and their correct worked solutions."""
    task = build_task("add", seed=0, digits=[2])
    path = tmp_path_factory.mktemp("sft-data") / "add.jsonl"
    with path.open("w") as f:
        for i in range(160):
            problem = task.train_problem(i)
            f.write(json.dumps({"prompt": problem.prompt, "completion": task.solution(problem)}) + "\n")
    return path


def _config(model_dir, data, run_dir, **sft_fields) -> TrainConfig:
    return TrainConfig.model_validate({
        "threads": 1, "run_dir": str(run_dir), "model": {"path": str(model_dir)},
        "pretrain": _pretrain_config(model_dir), "checkpoint": {"every": 3},
        "sft": {"data": str(data), "lr": 3e-3, "epochs": 2, "batch_tokens": 1024, "warmup_steps": 2, **sft_fields}})


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    return sft(_config(tiny_model_dir, data, run_dir), progress=False), run_dir


def test_sft_lowers_the_heldout_loss_and_writes_a_run_folder(sft_run):
    summary, run_dir = sft_run
    assert summary["heldout_loss_after"] < 0.9 * summary["heldout_loss_before"], summary
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, summary["steps"] + 1))
    assert all({"loss", "grad_norm", "lr", "answer_tokens", "tokens"} <= set(r) for r in records)
    assert (run_dir / "config.yaml").is_file() and list((run_dir / "checkpoints").glob("step-*/trainer.pt"))
    assert AutoModelForCausalLM.from_pretrained(run_dir / "checkpoint-final") is not None


def test_the_sft_checkpoint_starts_an_rl_run(sft_run, tmp_path):
    _, run_dir = sft_run
    config = TrainConfig.model_validate({
        "steps": 2, "threads": 1, "run_dir": str(tmp_path / "rl"), "model": {"path": str(run_dir / "checkpoint-final")},
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 24},
        "eval": {"problems_per_task": 4, "max_new_tokens": 24}})
    summary = train(config, progress=False)
    assert summary["steps"] == 2 and summary["model"] == str(run_dir / "checkpoint-final")


def test_the_sft_checkpoint_is_evaluated(sft_run, capsys):
    _, run_dir = sft_run
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "threads=1", "tasks=[{name: add}]", "eval.problems_per_task=4", "eval.max_new_tokens=24",
              "--quiet", "--json", "-", "--model", str(run_dir / "checkpoint-final")])
    assert exit_.value.code == 0
    assert json.loads(capsys.readouterr().out)["problems"] == {"add": 4}


def test_packed_records_give_the_padded_loss(tiny_model_dir, data):
    model, tokenizer = load_model(str(tiny_model_dir))
    train_records, _ = load_split(str(data), None, 0.1)
    examples, _ = encode_all(train_records[:40], tokenizer, False, 0, "error")
    losses = [heldout_loss(model, examples, Passes(tokenizer.pad_token_id, packing, 200, 0, False), 600)
              for packing in (True, False)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_a_bad_record_stops_sft_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1\\n", "completion": "2"}\n{"prompt": "2+2\\n"}\n')
    with pytest.raises(SystemExit) as exit_:
        main(["sft", str(bad), "--quiet", "--run-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2
    assert f"{bad}:2: field 'completion' is missing" in capsys.readouterr().err


def _temper_sft(*args: str, kill_at: str | None = None) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "tempering.cli", "sft", *args, "--quiet"], env=env,
                          capture_output=True).returncode


def test_a_killed_lora_sft_run_resumes_to_the_same_adapters(tiny_model_dir, data, tmp_path):
    settings = [str(data), "threads=1", f"model.path={tiny_model_dir}", "model.lora={rank: 4, save: adapter}",
                "sft.lr=3e-3", "sft.batch_tokens=1024", "sft.epochs=1", "checkpoint.every=2"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert _temper_sft(*settings, "--run-dir", str(whole)) == 0
    assert _temper_sft(*settings, "--run-dir", str(killed), kill_at="learn:4") == -signal.SIGKILL
    assert _temper_sft("--resume", str(killed)) == 0

    adapters = [(run / "checkpoint-final" / "adapter_model.safetensors").read_bytes() for run in (whole, killed)]
    assert adapters[0] == adapters[1]
    losses = [[json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
              for run in (whole, killed)]
    assert losses[0] == losses[1]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from"] == 2
