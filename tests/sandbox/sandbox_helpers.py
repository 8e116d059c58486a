"""Probes shared by the sandbox tests (kept out of conftest.py so that tests can import
them by a name no other conftest shadows)."""

import os

# Set before any worker starts: no program may see it, through its environment or /proc.
SECRET = "tempering-sandbox-test-secret-5f2c"
os.environ["TEMPERING_SANDBOX_TEST_SECRET"] = SECRET


def sandbox_processes():
    """Host processes of this caller's sandboxes: as root, those of a slot uid (pools give
    their slots uids >= 1,000,000); as another user, its own processes in another user
    namespace (``bwrap`` jails run under the caller's uid, in a namespace of their own)."""
    me, own_namespace = os.getuid(), os.readlink("/proc/self/ns/user")
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as handle:
                uid = int(next(line for line in handle if line.startswith("Uid:")).split()[1])
            if me == 0:
                sandboxed = uid >= 1_000_000
            else:
                sandboxed = uid == me and os.readlink(f"/proc/{entry}/ns/user") != own_namespace
        except (OSError, StopIteration):
            continue  # gone, or not ours to inspect
        if sandboxed:
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
