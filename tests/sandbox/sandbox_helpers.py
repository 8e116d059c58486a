"""Probes shared by the sandbox tests (kept out of conftest.py so that tests can import
them by a name no other conftest shadows)."""

import os

# Set before any worker starts: no program may see it, through its environment or /proc.
SECRET = "tempering-sandbox-test-secret-5f2c"
os.environ["TEMPERING_SANDBOX_TEST_SECRET"] = SECRET


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


def fd_targets() -> dict[int, str]:
    """What each open descriptor of this process points at (for a failure message)."""
    targets = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            targets[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
    return targets
