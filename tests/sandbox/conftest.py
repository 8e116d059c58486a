"""Fixtures for the sandbox tests: one real executor for the session, and leak probes.

Set ``TEMPERING_SANDBOX_ISOLATION`` (namespaces, bwrap) to run the suite under a given
mode; by default the strongest available one is used, and the tests skip with the reason
when this machine offers none.
"""

import os
import socket

import pytest

from tempering.sandbox import Executor, SandboxUnavailable, choose_isolation

# Set before any worker starts: no program may see it, through its environment or /proc.
SECRET = "tempering-sandbox-test-secret-5f2c"
os.environ["TEMPERING_SANDBOX_TEST_SECRET"] = SECRET


def _isolation():
    try:
        return choose_isolation(os.environ.get("TEMPERING_SANDBOX_ISOLATION", "auto"))
    except SandboxUnavailable as err:
        pytest.skip(f"no sandbox isolation on this machine: {err}")


@pytest.fixture(scope="session")
def executor():
    with Executor(workers=2, isolation=_isolation()) as pool:
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


def sandbox_processes():
    """Host processes owned by a sandbox uid (the executor gives slots uids >= 1,000,000)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                uid_line = next(line for line in handle if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) >= 1_000_000:
            found.append(int(entry))
    return found


def open_fds():
    return len(os.listdir("/proc/self/fd"))
