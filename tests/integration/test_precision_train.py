"""``precision`` in a real ``temper train``: the choice reaches both the sampler and the learner
(their log-probs of the same tokens disagree as bf16 rounding makes them, or agree to float32's
last digits), it is said and kept in the run folder, and ``auto`` decides as
``tempering.models.precision.choose`` does on this machine, with its measurement cached.

Real components: the miniature model, the built-in sampler and the learner."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import torch

import tempering
from tempering.models import precision
from tempering.models.device import _read_cpuinfo, cpu_bf16
from tempering.models.loading import load_model
from tempering.policy import PRECISION_FILE
from tempering.rollout import fast_llama

RUN = ["steps=1", "threads=1", "checkpoint.every=0", "rollout.prompts_per_step=2", "rollout.group_size=2",
       "rollout.max_new_tokens=12", "eval.problems_per_task=2", "eval.max_new_tokens=12", "logging.samples=0",
       "tasks=[{name: add, options: {digits: [2]}}]"]


def run(tiny_model_dir: Path, folder: Path, setting: str) -> tuple[dict, dict]:
    summary = tempering.train(None, [*RUN, f"model.path={tiny_model_dir}", f"precision={setting}"], run_dir=folder,
                              progress=False)
    step = json.loads((folder / "metrics.jsonl").read_text().splitlines()[0])
    return summary, step


@pytest.mark.parametrize("setting, bf16", [("fp32", False), ("bf16", True)])
def test_the_precision_reaches_the_sampler_and_the_learner(tiny_model_dir: Path, tmp_path: Path, setting: str,
                                                           bf16: bool):
    summary, step = run(tiny_model_dir, tmp_path / setting, setting)
    assert summary["precision"] == f"{'bf16 autocast' if bf16 else 'float32'} (precision={setting})"
    assert json.loads((tmp_path / setting / PRECISION_FILE).read_text())["bf16"] is bf16
    disagreement = step["mismatch/abs_logp"]
    if bf16:  # bf16 rounding in both passes, through different kernels
        assert disagreement > 1e-4
    else:
        assert disagreement < 1e-5


def test_auto_decides_as_choose_does_on_this_machine_and_keeps_its_measure(tiny_model_dir: Path, tmp_path: Path,
                                                                           tempering_cache: Path):
    summary, _ = run(tiny_model_dir, tmp_path / "auto", "auto")
    model, _ = load_model(str(tiny_model_dir))
    cache = tempering_cache / PRECISION_FILE
    expected = precision.choose("auto", torch.device("cpu"), model, cache)  # the run's measure, from the cache
    if fast_llama.ONEDNN:  # the sampler's float32 products chosen too, from the cache
        expected = precision.choose_products(expected, model, measured_already, cache)
    assert summary["precision"] == expected.describe()
    keys = json.loads(cache.read_text()) if cache.exists() else {}
    if cpu_bf16(_read_cpuinfo(), platform.machine()):
        assert any(precision.model_key(model.config) in key and not key.startswith("products") for key in keys)
    if not expected.bf16 and fast_llama.ONEDNN:
        assert expected.onednn is not None and "sampler products by" in summary["precision"]
        assert any(key.startswith("products | ") and precision.model_key(model.config) in key for key in keys)


def measured_already(model):
    raise AssertionError("the run measured and cached this")
