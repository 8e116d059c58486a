"""Fixtures for the sandbox tests: one real executor for the session, a loopback listener.

Set ``TEMPERING_SANDBOX_ISOLATION`` (namespaces, landlock, bwrap) to run the suite under a given
mode; by default the strongest available one is used, and the tests skip with the reason
when this machine offers none.
"""

import os
import socket

import pytest

import sandbox_helpers  # noqa: F401 - puts the test secret in the environment first
from tempering.sandbox import Executor, RunRequest, SandboxUnavailable, choose_isolation


def _isolation():
    try:
        return choose_isolation(os.environ.get("TEMPERING_SANDBOX_ISOLATION", "auto"))
    except SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")


@pytest.fixture(scope="session", params=[0, 8], ids=["forked", "ready"])
def executor(request):
    """The pool every claim is tested against: once forking each run's child when its run
    comes, once serving runs from children forked ahead (``ready``, namespaces mode)."""
    isolation = _isolation()
    if request.param and isolation != "namespaces":
        pytest.skip("children are forked ahead of their runs in namespaces mode only")
    with Executor(workers=2, isolation=isolation, ready=request.param) as pool:
        probe = pool.run(RunRequest("print('ready')"))
        if probe.status == "sandbox_error" and pool.isolation == "bwrap":
            # e.g. a kernel that forbids unprivileged user namespaces (Ubuntu's AppArmor
            # restriction): bubblewrap cannot start, so nothing here can be tested.
            pytest.skip(f"bubblewrap cannot create a sandbox here: {probe.stderr.strip()}")
        assert probe.stdout == "ready\n", probe
        yield pool


@pytest.fixture
def listener():
    """A TCP listener on the host's loopback; hostile programs try to reach it."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()
