"""``temper dpo`` on the miniature built-in model: every loss of the family learns the held-out
preference, the reference held in memory gives what the precomputed one gives, LoRA works,
a killed run resumes to the same adapters, and bad input exits 2 naming the record. The
claim on the real tiny model (greedy accuracy up by 10 points on builtin:arithmetic, and
down with the loss's sign flipped) is the slow test at the end.

Nothing is mocked; the resume test SIGKILLs a real ``temper dpo`` process mid-run.
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
from tempering.dpo import dpo


def _pretrain_config(model_dir) -> dict:
    return json.loads((model_dir / "pretrain.json").read_text())["config"]


def _config(model_dir, run_dir, **dpo_fields) -> TrainConfig:
    return TrainConfig.model_validate({
        "threads": 1, "run_dir": str(run_dir), "model": {"path": str(model_dir)},
        "pretrain": _pretrain_config(model_dir), "checkpoint": {"every": 4},
        "dpo": {"pairs": "builtin:arithmetic", "builtin_pairs": 64, "lr": 1e-3, "batch_size": 8, "evaluate": False,
                **dpo_fields}})


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dpo_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dpo") / "run"
    return dpo(_config(tiny_model_dir, run_dir), progress=False), run_dir


def test_dpo_learns_the_heldout_preference_and_writes_a_run_folder(dpo_run):
    summary, run_dir = dpo_run
    before, after = summary["heldout_before"], summary["heldout_after"]
    assert before["margin"] == 0 and before["accuracy"] == 0  # the policy is its own reference
    assert after["accuracy"] >= 0.9 and after["margin"] > 0.3 and after["loss"] < before["loss"] - 0.1, summary
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    records = _metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, summary["steps"] + 1)) and summary["steps"] == 8
    assert all({"loss", "rewards/chosen", "rewards/rejected", "accuracy", "margin", "grad_norm", "lr"} <= set(r)
               for r in records)
    assert records[-1]["margin"] > records[0]["margin"]
    assert AutoModelForCausalLM.from_pretrained(run_dir / "checkpoint-final") is not None


def test_a_reference_held_in_memory_gives_what_the_precomputed_one_gives(dpo_run, tiny_model_dir, tmp_path):
    summary, run_dir = dpo_run
    held = dpo(_config(tiny_model_dir, tmp_path / "held", reference="model", micro_batch_size=3), progress=False)
    assert held["heldout_after"] == pytest.approx(summary["heldout_after"], abs=1e-5)
    assert [r["loss"] for r in _metrics(tmp_path / "held")] == pytest.approx([r["loss"] for r in _metrics(run_dir)],
                                                                             abs=1e-5)


@pytest.mark.parametrize("loss, options", [("ipo", {"beta": 0.5}), ("simpo", {"beta": 2.0}), ("kto", {"beta": 0.1})])
def test_every_loss_of_the_family_learns_the_heldout_preference(tiny_model_dir, tmp_path, loss, options):
    summary = dpo(_config(tiny_model_dir, tmp_path / loss, loss=loss, **options), progress=False)
    assert summary["heldout_after"]["margin"] > summary["heldout_before"]["margin"] + 0.05, summary
    assert summary["heldout_after"]["loss"] < summary["heldout_before"]["loss"], summary
    assert summary["reference"] == (None if loss == "simpo" else "precompute")


def test_kto_reads_unpaired_records(tiny_model_dir, tmp_path):
    rows = []
    for a in range(10, 70):
        rows.append({"prompt": f"{a}+{a}\n", "completion": f"answer: {2 * a}", "label": True})
        rows.append({"input": f"{a}+{a + 1}\n", "output": "i do not know", "label": False})
    data = tmp_path / "kto.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(tiny_model_dir, tmp_path / "run", pairs=str(data), loss="kto", beta=0.5)
    summary = dpo(config, progress=False)
    assert summary["train_items"] + summary["heldout_items"] == 120
    assert summary["heldout_after"]["margin"] > 0.1 and "accuracy" not in summary["heldout_after"], summary


def _temper_dpo(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TEMPERING_KILL_AT", None)
    if kill_at:
        env["TEMPERING_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "tempering.cli", "dpo", *args, "--quiet"], env=env,
                          capture_output=True, text=True)


@pytest.mark.parametrize("weights, model", [("adapter_model.safetensors", ["model.lora={rank: 4, save: adapter}"]),
                                            ("model.safetensors", ["dpo.lr=1e-3"])], ids=["lora", "full"])
def test_a_killed_dpo_run_resumes_to_the_same_weights(tiny_model_dir, tmp_path, weights, model):
    """Full fine-tuning shows that the precomputed reference comes back from the checkpoint:
    computed again, from the trained weights, it would differ."""
    settings = ["builtin:arithmetic", "threads=1", f"model.path={tiny_model_dir}",
                f"pretrain={json.dumps(_pretrain_config(tiny_model_dir))}", "dpo.builtin_pairs=48", "dpo.lr=3e-3",
                "dpo.batch_size=8", "dpo.evaluate=false", "checkpoint.every=2", *model]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert _temper_dpo(*settings, "--run-dir", str(whole)).returncode == 0
    assert _temper_dpo(*settings, "--run-dir", str(killed), kill_at="learn:4").returncode == -signal.SIGKILL
    resumed = _temper_dpo("--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr

    saved = [(run / "checkpoint-final" / weights).read_bytes() for run in (whole, killed)]
    assert saved[0] == saved[1]
    assert [r["loss"] for r in _metrics(whole)] == [r["loss"] for r in _metrics(killed)]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (whole, killed)]
    assert summaries[1]["resumed_from"] == 2 and summaries[0]["heldout_after"] == summaries[1]["heldout_after"]
    assert summaries[0]["heldout_after"]["margin"] > 0


@pytest.mark.parametrize("argv, message", [
    (["{bad}"], "{bad}:2: field 'rejected' is missing"),
    (["{unpaired}"], "{unpaired}:1: an unpaired record (prompt, completion, label), but dpo.loss=dpo learns from pairs"),
    (["{bad}", "dpo.loss=nosuch"], "dpo.loss: unknown preference loss 'nosuch'"),
    (["{tmp}/none.jsonl"], "{tmp}/none.jsonl: no such file or folder"),
    (["dpo.beta=1"], "temper dpo needs the preference records first"),
    (["builtin:arithmetic", "tasks=[{{name: add, options: {{style: program}}}}]"], "builtin:arithmetic: every task must be an arithmetic task"),
])
def test_bad_input_exits_2_before_the_model_loads(tmp_path, capsys, argv, message):
    bad, unpaired = tmp_path / "bad.jsonl", tmp_path / "unpaired.jsonl"
    bad.write_text('{"prompt": "1+1\\n", "chosen": "2", "rejected": "3"}\n{"prompt": "2+2\\n", "chosen": "4"}\n')
    unpaired.write_text('{"prompt": "1+1\\n", "completion": "2", "label": true}\n')
    names = {"bad": bad, "unpaired": unpaired, "tmp": tmp_path}
    with pytest.raises(SystemExit) as exit_:
        main(["dpo", *(a.format(**names) for a in argv), "--quiet", "--run-dir", str(tmp_path / "run"),
              "model.path=/nonexistent/model"])
    assert exit_.value.code == 2
    assert message.format(**names) in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _tiny_run(run_dir: Path, **dpo_fields) -> dict:
    config = TrainConfig.model_validate({
        "threads": 1, "run_dir": str(run_dir), "checkpoint": {"every": 0}, "eval": {"problems_per_task": 100},
        "dpo": {"pairs": "builtin:arithmetic", "builtin_pairs": 1200, "lr": 1e-5, "beta": 0.1, "batch_size": 16,
                "warmup_steps": 5, **dpo_fields}})
    return dpo(config, progress=False)


@pytest.mark.slow
def test_dpo_on_the_builtin_pairs_raises_the_tiny_models_greedy_accuracy(tmp_path):
    """The issue's claim, on the real built-in tiny model (pre-trained first if not cached):
    held-out greedy accuracy over add, sub and mul (100 problems each) rises by at least 10
    points; with the loss's sign flipped (a plug-in loss) it does not."""
    summary = _tiny_run(tmp_path / "dpo")
    gain = summary["greedy_after"]["accuracy"] - summary["greedy_before"]["accuracy"]
    assert gain >= 0.10, summary
    flipped = _tiny_run(tmp_path / "flipped", loss="preference_plugins:flipped_dpo")
    assert flipped["greedy_after"]["accuracy"] - flipped["greedy_before"]["accuracy"] < 0.02, flipped
