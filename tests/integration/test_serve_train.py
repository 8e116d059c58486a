"""`temper train` against `temper serve`: a real server subprocess on 127.0.0.1, weights
reloaded every step, and the mismatch meter showing that the learner's recomputed log-probs
are the server's on every sampled token.

With a learning rate the weights move every step, so a reload that did not happen (or
loaded the wrong weights) shows as a mismatch from step 2 on; with lr=0 the meter measures
the two implementations of one policy alone, for the built-in sampler and for the server.
A LoRA run syncs its adapters alone, which the server loads onto its base.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from serving import serving
from tempering.config import TrainConfig
from tempering.train import train


def _pretrain_config(model_dir) -> dict:
    return json.loads((model_dir / "pretrain.json").read_text())["config"]


@pytest.fixture(scope="module")
def server_url(tiny_model_dir, tempering_cache):
    with serving(tiny_model_dir, tempering_cache) as url:
        yield url


@pytest.fixture
def fresh_server_url(tiny_model_dir, tempering_cache):
    """A server of the test's own (one that has loaded adapters takes no full weights)."""
    with serving(tiny_model_dir, tempering_cache) as url:
        yield url


def served_models(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as reply:
        return json.loads(reply.read())["data"]


def served_version(url: str) -> int:
    return served_models(url)[0]["policy_version"]


def run(tiny_model_dir, run_dir, lr: float, server: dict | None, lora: dict | None = None,
        pipeline: dict | None = None) -> list[dict]:
    config = TrainConfig.model_validate({
        "model": {"lora": lora},
        "steps": 3, "threads": 1, "run_dir": str(run_dir), "pretrain": _pretrain_config(tiny_model_dir),
        "tasks": [{"name": "add", "options": {"digits": [2]}}],
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16, "server": server},
        "learner": {"lr": lr, "warmup_steps": 0},
        "algorithm": {"entropy_coef": 0.01},  # a gradient on every row, whatever the rewards
        "eval": {"problems_per_task": 4, "max_new_tokens": 16},
        "checkpoint": {"every": 0}, "pipeline": pipeline or {},
    })
    train(config, progress=False)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_training_on_a_served_model_reloads_it_every_step_and_matches_its_log_probs(
        tiny_model_dir, server_url, tmp_path):
    before = served_version(server_url)
    records = run(tiny_model_dir, tmp_path / "run", 1e-3, {"url": server_url})
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert served_version(server_url) == before + 4, "the starting weights, then one reload per step"
    assert max(r["grad_norm"] for r in records) > 0, "the weights moved"
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-5
        assert record["mismatch/k3"] < 1e-5
        assert record["mismatch/outside_clip"] == 0.0


@pytest.mark.parametrize("sampler", ["builtin", "server"])
def test_with_lr_0_the_mismatch_is_zero_in_fp32(tiny_model_dir, server_url, tmp_path, sampler):
    records = run(tiny_model_dir, tmp_path / "run", 0.0, {"url": server_url} if sampler == "server" else None)
    assert len(records) == 3
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-5
        assert record["mismatch/k3"] < 1e-5
        assert record["mismatch/outside_clip"] == 0.0


@pytest.mark.parametrize("transfer", ["disk", "http"])
def test_a_lora_run_syncs_its_adapters_to_the_server_every_step(tiny_model_dir, fresh_server_url, tmp_path, transfer):
    """Over HTTP the adapter's files are still written on the learner's side (peft writes them),
    and sent from there."""
    records = run(tiny_model_dir, tmp_path / "run", 2e-2, {"url": fresh_server_url, "weights_dir": str(tmp_path / "w"),
                                                            "weight_transfer": transfer}, lora={"rank": 4})
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert served_version(fresh_server_url) == 4, "the starting adapters, then one load per step"
    assert [m["id"] for m in served_models(fresh_server_url)] == [str(tiny_model_dir), "tempering-lora"]
    assert sorted(f.name for f in (tmp_path / "w" / "adapter").iterdir()) == ["adapter_config.json",
                                                                               "adapter_model.safetensors"]
    assert max(r["grad_norm"] for r in records) > 0, "the adapters moved"
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-5
        assert record["mismatch/k3"] < 1e-5
        assert record["mismatch/outside_clip"] == 0.0


def test_partial_rollouts_reload_the_server_between_the_chunks_of_its_requests(tiny_model_dir, fresh_server_url,
                                                                               tmp_path):
    """Async with partial rollouts against a server: a round's requests draw 6 tokens, the
    server is reloaded with the learner's next weights, and each unfinished completion goes on
    from its tokens so far under them, its tokens stamped with the version that drew them. Two
    runs draw the same tokens (seeded requests, reloads at the same points); their log-probs,
    and so the weights, agree to the last bits only (the server sums in the order its batch of
    the moment gives: docs/scale-out.md, "Exactness")."""
    from safetensors.torch import load_file

    from tempering.train import is_timing

    pipeline = {"mode": "async", "partial_rollouts": True, "partial_chunk_tokens": 6}
    runs = [run(tiny_model_dir, tmp_path / name, 1e-2, {"url": fresh_server_url}, pipeline=pipeline)
            for name in ("a", "b")]
    first, second = ([{k: v for k, v in r.items() if not is_timing(k) and not k.startswith("server/")}
                      for r in records] for records in runs)
    assert [r["policy_version"] for r in first] == [1, 2, 3]
    assert [r["server/0/version"] for r in runs[1]] == [r["server/0/version"] + 3 for r in runs[0]], \
        "one reload a round on the same server: the second run's numbering goes on from the first's"
    # the rounds after the first hold tokens of two versions: the server was reloaded within them
    assert all(0 < r["staleness/token_mean"] < r["staleness/mean"] == 1 for r in first[1:]), first
    for a, b in zip(first, second):
        assert {k: v for k, v in a.items() if not isinstance(v, float)} == \
            {k: v for k, v in b.items() if not isinstance(v, float)}, "the same tokens, counts and versions"
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5)
    weights = [load_file(tmp_path / name / "checkpoint-final" / "model.safetensors") for name in ("a", "b")]
    assert all(torch.allclose(weights[0][k], weights[1][k], rtol=1e-4, atol=1e-6) for k in weights[0])


def greedy(url: str, prompts: list[str]) -> list[list[int]]:
    body = {"prompt": prompts, "max_tokens": 12, "temperature": 0.0, "seed": 0}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return [c["token_ids"] for c in json.loads(reply.read())["choices"]]


def test_weights_sent_over_http_serve_as_the_same_weights_loaded_from_disk(
        tiny_model_dir, tempering_cache, fresh_server_url, tmp_path):
    """A run whose weights go to the server over HTTP in chunks (smaller than the model, so a
    transfer is several): nothing is written for the server, every step samples the learner's
    weights (mismatch 0), the server's version follows the run's, and at the end it answers as a
    server that loaded the run's final weights from disk."""
    records = run(tiny_model_dir, tmp_path / "run", 1e-2, {"url": fresh_server_url, "weights_dir": str(tmp_path / "w"),
                                                            "weight_transfer": "http", "chunk_mib": 0.01})
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert [r["server/0/version"] for r in records] == [r["server/expected_version"] for r in records] == [1, 2, 3]
    assert served_version(fresh_server_url) == 4, "the starting weights, then one transfer per step"
    assert not (tmp_path / "w").exists(), "nothing written for the server to read"
    assert max(r["grad_norm"] for r in records) > 0, "the weights moved"
    for record in records:
        assert record["mismatch/abs_logp"] < 1e-5
        assert record["mismatch/outside_clip"] == 0.0
    prompts = ["12+34\n", "57+68\n", "90+11\n", "23+45\n", "7+8\n", "66+77\n"]
    with serving(tiny_model_dir, tempering_cache) as from_disk:
        untouched = greedy(from_disk, prompts)
        reply = urllib.request.urlopen(urllib.request.Request(
            from_disk + "/update_weights_from_disk", json.dumps({"model_path": str(tmp_path / "run" / "checkpoint-final")}
                                                                 ).encode(), {"Content-Type": "application/json"}))
        assert json.loads(reply.read())["success"]
        assert greedy(fresh_server_url, prompts) == greedy(from_disk, prompts) != untouched


def test_a_partial_rollout_run_on_a_server_killed_and_resumed_keeps_the_uninterrupted_runs_tokens(
        tiny_model_dir, tempering_cache, tmp_path):
    """Async with partial rollouts against `temper serve`, SIGKILLed as a round takes new weights
    (``swap``) and inside a learner step, each time continued with ``--resume`` against the same
    server (now holding the killed run's newer weights, which the resumed run replaces with its
    checkpoint's): every step's tokens, counts and versions are the uninterrupted run's (against a
    server of its own), its floats and final weights equal to the server's last bits
    (docs/scale-out.md, "Exactness")."""
    import signal

    from safetensors.torch import load_file
    from test_resume import step_records, temper

    args = [f"model.path={tiny_model_dir}", "steps=8", "threads=1", "seed=3", "tasks=[{name: add, options: {digits: [2]}}]",
            "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16", "learner.lr=1e-2",
            "learner.warmup_steps=0", "algorithm.entropy_coef=0.01", "eval.problems_per_task=4",
            "eval.max_new_tokens=16", "checkpoint.every=1", "pipeline.mode=async", "pipeline.partial_rollouts=true",
            "pipeline.partial_chunk_tokens=6"]

    def records(run) -> list[dict]:  # a server's own counters and versions differ between its runs
        return [{k: v for k, v in r.items() if not k.startswith("server/")} for r in step_records(run)]

    reference, run = tmp_path / "reference", tmp_path / "run"
    with serving(tiny_model_dir, tempering_cache) as url:
        assert temper(*args, f"rollout.server.url={url}", "--run-dir", str(reference)) == 0
    with serving(tiny_model_dir, tempering_cache) as url:
        assert temper(*args, f"rollout.server.url={url}", "--run-dir", str(run), kill_at="swap:3") == -signal.SIGKILL
        assert temper("--resume", str(run), kill_at="learn:3") == -signal.SIGKILL  # the run's own config: this url
        assert served_version(url) > 3, "the killed runs left the server ahead of their checkpoints"
        assert temper("--resume", str(run)) == 0

    expected, got = records(reference), records(run)
    assert [r["step"] for r in got] == list(range(1, 9))
    assert all(0 < r["staleness/token_mean"] for r in got[1:]), "rounds took new weights between their chunks"
    for a, b in zip(expected, got):
        assert {k: v for k, v in a.items() if not isinstance(v, float)} == \
            {k: v for k, v in b.items() if not isinstance(v, float)}, "the same tokens, counts and versions"
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5)
    final = [load_file(folder / "checkpoint-final" / "model.safetensors") for folder in (reference, run)]
    assert all(torch.allclose(final[0][k], final[1][k], rtol=1e-4, atol=1e-6) for k in final[0])
