"""Integration fixtures: one torch thread (models this small run fastest on one, and on a
shared CPU more threads only contend), a real sandbox shared by the tests that grade code, and
a real ``temper serve`` of the miniature model for the tests of its HTTP API."""

import pytest
import torch

from serving import serving
from tempering.sandbox import Executor, RunRequest, SandboxUnavailable, choose_isolation

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def sandbox_executor():
    """A real two-slot sandbox, or a skip naming why this machine cannot isolate programs."""
    try:
        isolation = choose_isolation("auto")
    except SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")
    executor = Executor(workers=2, isolation=isolation)
    if executor.run(RunRequest("print('ready')")).stdout != "ready\n":
        executor.close()
        pytest.skip("the sandbox cannot start a program here")
    yield executor
    executor.close()


@pytest.fixture(scope="module")
def mini_server_url(tiny_model_dir, tempering_cache):
    """``temper serve`` of the miniature model under the name ``mini``, one per test module: its URL."""
    with serving(tiny_model_dir, tempering_cache, "--name", "mini") as url:
        yield url
