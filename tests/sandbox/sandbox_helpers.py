"""Probes shared by the sandbox tests (kept out of conftest.py so that tests can import
them by a name no other conftest shadows)."""

import os

# Set before any worker starts: no program may see it, through its environment or /proc.
SECRET = "tempering-sandbox-test-secret-5f2c"
os.environ["TEMPERING_SANDBOX_TEST_SECRET"] = SECRET


def uid_block(pid: int) -> range:
    """The sandbox uids that the pools made by process ``pid`` give their slots (as the
    executor allots them: a block of 16 pools of MAX_WORKERS slots per process)."""
    from tempering.sandbox.executor import MAX_WORKERS

    low = 1_000_000 + (pid % (1 << 20)) * 16 * MAX_WORKERS
    return range(low, low + 16 * MAX_WORKERS)


def sandbox_processes(*pids: int):
    """Host processes owned by a sandbox uid of this process's pools or of the pools made by the
    processes ``pids`` (a server run as a subprocess). Other processes' sandboxes, such as
    another test process running beside this one, are not counted."""
    blocks = [uid_block(pid) for pid in (os.getpid(), *pids)]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as handle:
                uid_line = next(line for line in handle if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if any(int(uid_line.split()[1]) in block for block in blocks):
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
