"""The executor: a pool of sandbox workers, one slot per core by default.

Each slot is a worker process (``_zygote.py``) that set up its jail once and forks a
child per run. The executor hands jobs to free slots, enforces a backstop deadline on the
worker itself, restarts a slot whose worker died, and retries a job that hit an
infrastructure fault before reporting ``sandbox_error``. Verdicts are computed here, in
the caller's process, by :mod:`tempering.sandbox.harness`.

Isolation modes: ``namespaces`` (root with CAP_SYS_ADMIN; per-slot namespaces and uid),
``landlock`` (root without CAP_SYS_ADMIN, as in a default Docker container: per-slot uid,
Landlock and seccomp, no namespaces), ``bwrap`` (not root: one bubblewrap sandbox per
job), ``none`` (limits and seccomp only, for trusted code; never chosen automatically).
What each covers is in the package docstring.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from tempering.sandbox import _jail, _landlock, harness
from tempering.sandbox._zygote import recv_message, send_message
from tempering.sandbox.spec import (RunRequest, RunResult, SandboxAPI, SandboxUnavailable,
                                    TestResult, TestSpec)

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_zygote.py")
ISOLATION_MODES = ("auto", "namespaces", "landlock", "bwrap", "none")
MAX_WORKERS = 64
"""Slots of one pool: each pool owns a block of this many uids, one per slot."""
# Fixed environment of every program: same locale, hash seed, zone and paths on every run.
ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "TZ": "UTC",
}
MAX_READY = 64
"""Children one slot may fork ahead of its runs (``ready``)."""
_START_TIMEOUT_S = 60.0
_pools = itertools.count()


class SlotFailure(RuntimeError):
    """The worker process of a slot died, hung or answered nonsense."""


@cache
def namespaces_work() -> bool:
    """Whether this machine lets us create the slot namespaces: tried once, in a fresh
    single-threaded process (root without CAP_SYS_ADMIN, or a seccomp or AppArmor profile
    against unshare or mount, says no)."""
    probe = subprocess.run([sys.executable, "-s", _jail.__file__], env=ENVIRONMENT, cwd="/",
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=_START_TIMEOUT_S)
    return probe.returncode == 0


def _unavailable(requested: str):
    """Why ``requested`` cannot run here, or None when it can."""
    root = os.geteuid() == 0
    if requested in ("namespaces", "landlock") and not root:
        return f"isolation '{requested}' needs root; use 'bwrap' or run as root"
    if requested == "namespaces" and not namespaces_work():
        return ("isolation 'namespaces' cannot create namespaces here (it needs CAP_SYS_ADMIN, "
                "which containers usually drop); use 'landlock'")
    if requested == "landlock" and _landlock.abi_version() < 1:
        return "isolation 'landlock' needs a Linux kernel with Landlock enabled (5.13 or later)"
    if requested == "bwrap" and root:
        # As root, the sandbox's uid would map to host root and own /proc's root files.
        return "isolation 'bwrap' is for non-root users; as root use 'namespaces' or 'landlock'"
    if requested == "bwrap" and shutil.which("bwrap") is None:
        return "isolation 'bwrap' needs bubblewrap: install the 'bubblewrap' package"
    return None


def choose_isolation(requested: str = "auto") -> str:
    """Resolve ``auto`` to the strongest mode this machine offers (namespaces, then landlock
    as root; bwrap otherwise), or explain why none is safe."""
    if requested not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {requested!r}")
    if requested != "auto":
        reason = _unavailable(requested)
        if reason:
            raise SandboxUnavailable(reason)
        return requested
    candidates = ("namespaces", "landlock") if os.geteuid() == 0 else ("bwrap",)
    reasons = []
    for mode in candidates:
        reason = _unavailable(mode)
        if reason is None:
            return mode
        reasons.append(reason)
    raise SandboxUnavailable(
        f"cannot isolate programs here: {'; '.join(reasons)}. Run as root with CAP_SYS_ADMIN, "
        "use a kernel with Landlock, install bubblewrap (when not root), or pass "
        "isolation='none' (--isolation none) to run trusted code without isolation.")


def _bwrap_binds() -> list:
    """What a bwrap jail binds besides the system's folders: the Python installation and
    environment, and the worker's own folder (bubblewrap starts the worker inside)."""
    return sorted({*_jail.python_paths(), os.path.dirname(ZYGOTE)})


def _bwrap_scratch() -> str:
    """Where a bwrap job's scratch tmpfs goes: a folder none of :func:`_bwrap_binds` lies
    in. Bubblewrap makes each bind's mount point inside whatever is mounted above it, so a
    tmpfs at /tmp with a bind beneath (an environment or checkout under /tmp, as in many CI
    layouts) would list that bind's top folder in every job's working directory."""
    return _jail.scratch_point(_bwrap_binds())


@cache
def _bwrap_filter() -> str:
    """The jail's seccomp filter (hex), compiled once in this process for every bwrap job:
    each job starts a fresh worker, which would otherwise import pyseccomp to compile it
    again (0.40 s a job then, 0.30 s now, on a loaded 2-core machine)."""
    return _jail.seccomp_program().hex()


def _bwrap_prefix(scratch_mb: int) -> list:
    """A bubblewrap sandbox equivalent to the root mode's jail, for one job, for a caller
    that is not root (so the sandbox's uid maps to an unprivileged host uid).

    The worker is the sandbox's PID 1 (``--as-pid-1``): bubblewrap's own init would run
    under the program's uid, outside the seccomp filter and open to it through
    /proc/1/mem; as PID 1 the worker gets only the signals it handles from the job, and
    when it exits the kernel kills whatever else the job's PID namespace holds."""
    scratch = _bwrap_scratch()
    args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--die-with-parent", "--new-session", "--as-pid-1",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
            "--dev", "/dev", "--size", str(scratch_mb << 20), "--tmpfs", scratch, "--chdir", scratch,
            "--hostname", "sandbox"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _jail.ETC_FILES:
        args += ["--ro-bind-try", "/etc/" + name, "/etc/" + name]
    for path in _bwrap_binds():
        if not path.startswith("/usr/"):
            args += ["--ro-bind", path, path]
    return args + ["--remount-ro", "/dev", "--remount-ro", "/"]


class _Slot:
    """One worker process and its control socket."""

    def __init__(self, index: int, isolation: str, scratch_mb: int, uid_base: int, ready: int = 0):
        self.index, self.isolation, self.scratch_mb, self.ready = index, isolation, scratch_mb, ready
        self.uid = uid_base + index
        self.process = None
        self.sock = None

    def _command(self, fd: int) -> list:
        mode = {"namespaces": "jail", "landlock": "landlock", "bwrap": "bwrap", "none": "none"}[self.isolation]
        settings = {"mode": mode, "fd": fd, "uid": self.uid, "gid": self.uid,
                    "scratch_mb": self.scratch_mb, "env": ENVIRONMENT, "ready": self.ready}
        if self.isolation == "bwrap":
            # Where _bwrap_prefix mounts the scratch tmpfs, and the filter compiled once.
            settings.update(scratch=_bwrap_scratch(), seccomp=_bwrap_filter())
        # Not -I: that would ignore PYTHONHASHSEED. The environment is ENVIRONMENT alone.
        command = [sys.executable, "-s", ZYGOTE, json.dumps(settings)]
        if self.isolation == "bwrap":
            command = _bwrap_prefix(self.scratch_mb) + ["--"] + command
        return command

    def start(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                self._command(child_sock.fileno()), pass_fds=(child_sock.fileno(),),
                env=ENVIRONMENT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, cwd="/")
        finally:
            child_sock.close()
        self.sock = parent_sock
        self.sock.settimeout(_START_TIMEOUT_S)
        try:
            ready = recv_message(self.sock)
        except (OSError, ValueError):
            ready = None
        if not ready or not ready.get("ready"):
            raise SlotFailure(f"sandbox worker {self.index} ({self.isolation}) failed to start: "
                              f"{self.stop() or 'no error output'}")

    def call(self, job: dict, timeout_s: float) -> dict:
        """Send one job and wait for its reply; any transport problem is a SlotFailure."""
        if self.process is None:
            self.start()
        try:
            self.sock.settimeout(timeout_s)
            send_message(self.sock, job)
            reply = recv_message(self.sock)
        except (OSError, ValueError) as err:
            self.stop()
            raise SlotFailure(f"sandbox worker {self.index} failed: {err}") from err
        if reply is None:
            raise SlotFailure(f"sandbox worker {self.index} exited: {self.stop() or 'no error output'}")
        if self.isolation == "bwrap":
            self.stop()
        return reply

    def interrupt(self) -> None:
        """Shut the control socket down: a call waiting on it returns at once, and the worker
        ends the job it is running (and everything the job started) and exits."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> str:
        """End the worker (closing the socket makes it exit); return its error output."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        process, self.process = self.process, None
        if process is None:
            return ""
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        text = process.stderr.read().decode("utf-8", "replace").strip()
        process.stderr.close()
        return text[-2000:]


class Executor(SandboxAPI):
    """Runs programs and test specs in a pool of sandbox slots; safe to share across threads.

    ``workers``: slots (default: the CPUs this process may use). ``isolation``: see the
    module docstring. ``scratch_mb``: size of each job's private tmpfs. ``retries``: extra
    attempts for a job that met an infrastructure fault. ``ready``: children each slot
    forks ahead of its runs while it is idle (``namespaces`` mode only; 0, the default, forks
    each run's child when its run comes). A Python run then starts in a child that already
    has its session, descriptors, environment and seccomp filter, so the fork and that setup
    leave the run's path for the slot's idle time: worth it where the sandbox has cores that
    would otherwise idle, not where that idle time is another process's (docs/sandbox.md,
    "Speed").
    """

    def __init__(self, workers: int | None = None, isolation: str = "auto",
                 scratch_mb: int = 64, retries: int = 2, ready: int = 0):
        self.isolation = choose_isolation(isolation)
        self.workers = workers or len(os.sched_getaffinity(0))
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be between 1 and {MAX_WORKERS}, got {self.workers}")
        if not 0 <= ready <= MAX_READY:
            raise ValueError(f"ready must be between 0 and {MAX_READY}, got {ready}")
        self.ready = ready if self.isolation == "namespaces" else 0
        self.retries = retries
        uid_base = 1_000_000 + ((os.getpid() % (1 << 20)) * 16 + next(_pools) % 16) * MAX_WORKERS
        self._slots = [_Slot(i, self.isolation, scratch_mb, uid_base, self.ready) for i in range(self.workers)]
        self._free = queue.SimpleQueue()
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        self._closed = threading.Event()
        self._closing = threading.Lock()
        for slot in self._slots:
            self._free.put(slot)
        try:
            if self.isolation != "bwrap":
                list(self._threads.map(_Slot.start, self._slots))
        except Exception:
            self.close()
            raise

    def execute(self, job: dict, timeout_s: float) -> dict:
        """Run one raw job on a free slot, retrying infrastructure faults; never raises them."""
        error = ""
        for _ in range(self.retries + 1):
            slot = self._free.get()
            try:
                if self._closed.is_set():
                    raise RuntimeError("this sandbox executor is closed")
                reply = slot.call(job, timeout_s)
            except SlotFailure as err:
                error = str(err)
                continue
            finally:
                self._free.put(slot)
            if "error" not in reply and not harness.has_sandbox_error(reply):
                return reply
            error = reply.get("error", "the sandbox could not set up a run")
        return {"error": error}

    def run(self, request: RunRequest) -> RunResult:
        return harness.run_program(self.execute, request)

    def test(self, spec: TestSpec) -> TestResult:
        return harness.run_tests(self.execute, spec)

    def run_many(self, requests) -> list:
        """Run requests on all slots at once; results come back in input order."""
        return list(self._threads.map(self.run, requests))

    def test_many(self, specs) -> list:
        return list(self._threads.map(self.test, specs))

    def close(self) -> None:
        """Stop every worker now, running jobs included (their callers get RuntimeError);
        the workers' namespaces, processes and scratch space go with them. A second close
        returns at once."""
        with self._closing:
            if self._closed.is_set():
                return
            self._closed.set()
        for slot in self._slots:
            slot.interrupt()
        self._threads.shutdown(wait=True)
        for _ in self._slots:  # each slot once its holder let go of it
            self._free.get().stop()

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
