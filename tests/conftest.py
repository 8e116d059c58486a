"""Shared fixtures for the foundation tests: a private model cache and a miniature built-in model.

The miniature model is pre-trained by the real ``tempering.pretrain`` code, only smaller and
shorter, so the tests exercise the same path as ``temper train`` without the minutes it takes.
It is good enough to write the ``answer: N`` format some of the time, which gives RL steps a
reward signal; it is not good at arithmetic.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
from pathlib import Path

import pytest

from tempering.torch_extensions import hide_cuda_extensions

hide_cuda_extensions()  # before any test module imports transformers (as importing tempering does)

MINI_PRETRAIN = {
    "hidden_size": 32,
    "layers": 1,
    "heads": 2,
    "steps": 100,
    "batch_docs": 16,
    "lr": 1e-2,
    "warmup_steps": 5,
}
"""PretrainConfig fields of the miniature model (about 15k parameters, seconds to train)."""


@pytest.fixture(scope="session")
def tempering_cache(tmp_path_factory):
    """A fresh model cache for the session, so the user's own cache is never read or written;
    one for all the run's worker processes (the cache's writes are atomic, and two workers
    making one entry at once both succeed), so a model is pre-trained once per run."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    path = root / "tempering-cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TEMPERING_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_model_dir(tempering_cache):
    """The miniature built-in model, pre-trained once per session into the private cache."""
    from tempering.config import PretrainConfig
    from tempering.pretrain import ensure_pretrained

    return ensure_pretrained(PretrainConfig(**MINI_PRETRAIN), progress=False)


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir):
    """``(model, tokenizer)`` of the miniature model, fp32, eval mode; tests must not train it."""
    from tempering.models.loading import load_model

    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="session")
def ipv6_loopback():
    """``"::1"``, or the test is skipped where this machine has no IPv6 loopback to bind."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    return "::1"


@pytest.fixture(scope="session")
def bench_module():
    """``bench_module("generation")``: the module of ``bench/generation.py``, loaded by path
    (the bench scripts are not a package)."""
    root = Path(__file__).resolve().parents[1] / "bench"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"bench_{name}", root / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def readme_links() -> list[tuple[str, str]]:
    """(path, anchor) of every relative link in README.md (anchor '' where there is none)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text)
    return [tuple(target.partition("#")[::2]) for target in targets if not re.match(r"[a-z]+:", target)]
