"""Probes shared by the sandbox tests (kept out of conftest.py so that tests can import
them by a name no other conftest shadows)."""

import os

# Set before any worker starts: no program may see it, through its environment or /proc.
SECRET = "tempering-sandbox-test-secret-5f2c"
os.environ["TEMPERING_SANDBOX_TEST_SECRET"] = SECRET


def _processes(with_namespace: bool):
    """(pid, uid, user namespace or None) of the host's processes, those gone excepted; the
    namespace is asked for only when ``with_namespace`` (and None where it may not be read)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as handle:
                uid = int(next(line for line in handle if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration):
            continue
        try:
            namespace = os.readlink(f"/proc/{entry}/ns/user") if with_namespace else None
        except OSError:
            namespace = None
        yield int(entry), uid, namespace


def _foreign_namespaces() -> set:
    """User namespaces other than this process's that already hold this user's processes (a
    browser's or a rootless container's, say): no jail of these tests lives in them."""
    return {namespace for _, uid, namespace in _processes(True) if uid == os.getuid()}


_NOT_JAILS = _foreign_namespaces() | {os.readlink("/proc/self/ns/user")} if os.getuid() else set()


def uid_block(pid: int) -> range:
    """The sandbox uids that the pools made by process ``pid`` give their slots (as the
    executor allots them: a block of 16 pools of MAX_WORKERS slots per process)."""
    from tempering.sandbox.executor import MAX_WORKERS

    low = 1_000_000 + (pid % (1 << 20)) * 16 * MAX_WORKERS
    return range(low, low + 16 * MAX_WORKERS)


def sandbox_processes(*pids: int):
    """Host processes of the sandboxes: as root, those of a slot uid of this process's pools or
    of the pools made by the processes ``pids`` (a server run as a subprocess), so that another
    test process's sandboxes running beside these tests are not counted; as another user, its
    own processes in a user namespace made since these tests began (``bwrap`` jails run under
    the caller's uid, each job in a user namespace of its own)."""
    if os.getuid() == 0:
        blocks = [uid_block(pid) for pid in (os.getpid(), *pids)]
        return [pid for pid, uid, _ in _processes(False) if any(uid in block for block in blocks)]
    return [pid for pid, uid, namespace in _processes(True)
            if uid == os.getuid() and namespace is not None and namespace not in _NOT_JAILS]


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
