"""The sandbox worker: one per pool slot, started with a clean environment.

``python -s _zygote.py SETTINGS`` (a JSON object) with mode ``jail`` (root) enters fresh
mount, network, IPC, UTS and PID namespaces once, builds a read-only root and then serves jobs: for each job it mounts
a fresh size-capped tmpfs as /tmp, forks one child per run, which limits itself, drops to
the slot's uid, sets no_new_privs, loads the seccomp filter and runs the program. The
worker enforces the wall-clock deadline and the output caps, then kills every process left
in its PID namespace and unmounts the scratch space.

Mode ``landlock`` (root without CAP_SYS_ADMIN) stays in the host's namespaces: each job
gets a fresh scratch directory owned by the slot's uid, and each run's child, after its
limits, takes that uid, sets no_new_privs, confines its file access with Landlock and
loads a seccomp filter that also keeps unix sockets private. The worker is the subreaper
of everything the job starts, kills the slot uid's processes after every run, and stops a
job whose scratch files outgrow the cap. Mode ``bwrap`` runs one job inside a bubblewrap
sandbox made by the parent and exits; mode ``none`` runs jobs with limits and seccomp but
without namespaces (an explicit opt-in for trusted code). Jobs arrive as length-prefixed JSON on the socket whose number
the settings give; replies go back the same way. The worker reports raw outcomes only; verdicts are the parent's.
"""

import _signal
import collections
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import _jail  # noqa: E402
import _landlock  # noqa: E402
import _runner  # noqa: E402

# Programs import from the Python environment only, not from the sandbox's own folder.
sys.path[:] = [path for path in sys.path if path != _HERE]

_READ_CHUNK = 65536
_IDLE_S = 0.005
_PREPARE_NICE = 10
_RESULT_CAP = 8 << 20
_LIMIT_MARKERS = ("MemoryError", "std::bad_alloc", "heap out of memory", "Cannot allocate memory")
# Landlock mode has no size-capped tmpfs: the scratch directory is measured this often, and
# capped at this many entries (the namespaces mode's tmpfs inode cap).
_SCRATCH_CHECK_S = 0.02
_SCRATCH_ENTRIES = 4096


def send_message(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv_message(sock: socket.socket):
    header = _recv_exact(sock, 4)
    if header is None:
        return None
    body = _recv_exact(sock, struct.unpack("!I", header)[0])
    return None if body is None else json.loads(body)


def _recv_exact(sock: socket.socket, size: int):
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class Worker:
    """Serves jobs for one slot; ``mode`` is ``jail``, ``landlock``, ``bwrap`` or ``none``."""

    def __init__(self, mode: str, uid: int, gid: int, scratch_mb: int, env: dict, control_fd: int,
                 ready: int = 0, scratch: str = "/tmp", seccomp: str = ""):
        self.mode, self.uid, self.gid, self.scratch_mb = mode, uid, gid, scratch_mb
        self.env, self.control_fd = env, control_fd
        # Children forked ahead of their runs (namespaces mode): (pid, pipes), oldest first.
        self.ready_target = ready if mode == "jail" else 0
        self.ready = collections.deque()
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        # bwrap: compiled by the executor, once for all its jobs' workers.
        self.seccomp = _jail.SeccompFilter(
            bytes.fromhex(seccomp) or _jail.seccomp_program_apart(private_unix=mode == "landlock"))
        # Python's own SIGINT handler needs no resetting in a run's child (41 page faults
        # there); bwrap's worker ignores SIGINT, which its runs must not inherit.
        self.reset_sigint = signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        # bwrap: where the executor had bubblewrap mount the job's tmpfs.
        self.scratch = _jail.scratch_point(_jail.python_paths()) if mode == "jail" else scratch
        self.scratch_cap = None
        # Where per-job scratch directories go, read before TMPDIR becomes the runs' scratch.
        self.scratch_parent = tempfile.gettempdir() if mode in ("none", "landlock") else None
        self._set_environment()  # before any child is forked ahead of a job
        _runner.prepare_stdio()
        if mode == "landlock":
            # Orphans of a job become this worker's children, so none escapes the reaping.
            _jail.prctl(_jail.PR_SET_CHILD_SUBREAPER, 1)
            self.scratch_cap = (scratch_mb << 20, _SCRATCH_ENTRIES)
        # A Python installation under a private directory (/root/.pyenv) cannot be walked to
        # by the slot's uid; in-process Python programs then keep CAP_DAC_READ_SEARCH (what
        # they may open is still only what Landlock grants).
        self.keep_read_search = mode == "landlock" and not all(
            _jail.reachable_by_others(path) for path in _jail.python_paths())

    def open_scratch(self) -> None:
        if self.mode == "jail":
            _jail.mount_scratch(self.scratch, self.scratch_mb, self.uid, self.gid)
        elif self.mode in ("none", "landlock"):
            self.scratch = tempfile.mkdtemp(prefix="tempering-sandbox-", dir=self.scratch_parent)
            self._set_environment()  # a new scratch path each job in these modes
        if self.mode == "landlock":
            os.chown(self.scratch, self.uid, self.gid)

    def _set_environment(self) -> None:
        """The worker's own environment becomes its runs' (the slot's, HOME and TMPDIR the
        scratch space), so that a child inherits it rather than rebuilding it: every object
        a forked child touches costs it a page copied from the worker."""
        os.environ.clear()
        os.environ.update(self.env, HOME=self.scratch, TMPDIR=self.scratch)

    def close_scratch(self) -> None:
        if self.mode == "jail":
            _jail.umount(self.scratch)
        elif self.mode in ("none", "landlock"):
            shutil.rmtree(self.scratch, ignore_errors=True)

    def kill_all(self, pid: int) -> None:
        """Kill every process the job left (every process of the slot's uid, or the job's
        process group) and reap them."""
        if self.mode == "jail":
            self._clear_leftovers()
            return
        while True:
            try:
                if self.mode == "none":
                    os.killpg(pid, signal.SIGKILL)
                elif self.mode == "landlock":
                    _jail.kill_uid(self.uid)
                else:
                    os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.0005)
            except ChildProcessError:
                return

    def _clear_leftovers(self) -> None:
        """In its own PID namespace the worker is PID 1, so whatever a run left running
        (its processes' parents gone) is the worker's child by the time the worker has
        reaped the run's own process. Children other than the ready ones are such leftovers:
        when there are any, every process of the slot's uid is killed and they are reaped.
        The ready children are root's and are not touched."""
        ready = {pid for pid, _ in self.ready}
        while True:
            left = [pid for pid in _children() if pid not in ready]
            if not left:
                return
            _jail.kill_uid(self.uid)
            for pid in left:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass

    def run_job(self, job: dict) -> dict:
        self.open_scratch()
        try:
            for name, text in job.get("files", {}).items():
                path = os.path.join(self.scratch, name)
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(text)
                if self.mode in ("jail", "landlock"):
                    os.chown(path, self.uid, self.gid)
            reply = {"compile": None, "runs": []}
            if job.get("compile"):
                reply["compile"] = self.run_one(job["compile"])
                if reply["compile"]["status"] != "ok":
                    return reply
            for run in job["runs"]:
                reply["runs"].append(self.run_one(run))
            return reply
        finally:
            self.close_scratch()

    def run_one(self, run: dict) -> dict:
        if "argv" not in run and self.ready_target:
            # None waiting (a batch longer than the slot's children): one forked now, with
            # no rehearsal, which would only add to this run's path.
            pid, pipes = self.ready.popleft() if self.ready else self.prepare(rehearse=False)
            job_write = pipes.pop("job")[1]
            started = time.monotonic()
            try:
                _send_run(job_write, run)
            except OSError:
                pass  # the child is gone: the watch reports its setup as failed
        else:
            pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "result", "setup")}
            started = time.monotonic()
            pid = os.fork()
            if pid == 0:
                self._child(run, pipes)
            for name, (read_end, write_end) in pipes.items():
                os.close(read_end if name == "stdin" else write_end)
        try:
            watch = _Watch(run, pipes, pid, started, self.control_fd)
            if self.scratch_cap:
                watch.scratch = (self.scratch, *self.scratch_cap)
            outcome = watch.follow()
        finally:
            self.kill_all(pid)
            for name, (read_end, write_end) in pipes.items():
                _close_quietly(write_end if name == "stdin" else read_end)
        return outcome

    def prepare(self, rehearse: bool = True) -> tuple:
        """Fork a child that takes its session, descriptors, environment and seccomp filter
        now, rehearses a run (unless ``rehearse`` is false) and waits, as root, for its own
        run on a pipe (descriptor 5); the rest of its confinement (limits, uid,
        no_new_privs) follows once the run has come, as in a child forked for it. A run's
        path is then the program, not the fork."""
        pipes = {name: os.pipe() for name in ("stdin", "stdout", "stderr", "result", "setup", "job")}
        pid = os.fork()
        if pid == 0:
            self._ready_child(pipes, rehearse)
        for name, (read_end, write_end) in pipes.items():
            os.close(read_end if name in ("stdin", "job") else write_end)
        return pid, pipes

    def top_up(self, sock: socket.socket) -> None:
        """Prepare ready children while no job comes on ``sock``: once it has been quiet
        for ``_IDLE_S`` (a batch's next job follows its last reply sooner), at low priority,
        one child at a time."""
        if len(self.ready) >= self.ready_target or select.select([sock], [], [], _IDLE_S)[0]:
            return
        os.setpriority(os.PRIO_PROCESS, 0, self.nice + _PREPARE_NICE)
        try:
            while len(self.ready) < self.ready_target and not select.select([sock], [], [], 0)[0]:
                self.ready.append(self.prepare())
        finally:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)

    def _ready_child(self, pipes: dict, rehearse: bool) -> None:
        try:
            job_read = fcntl.fcntl(pipes["job"][0], fcntl.F_DUPFD, 16)  # above what 0-5 take
            self._take_descriptors(pipes)
            os.dup2(job_read, 5)
            os.closerange(6, 1 << 16)
            os.set_inheritable(5, False)
            # As root (CAP_SYS_ADMIN) the filter needs no no_new_privs yet; what follows
            # once the run has come (limits, the uid, no_new_privs) is allowed by it.
            _jail.load_seccomp(self.seccomp)
            if rehearse:
                _runner.rehearse()
            data = _read_to_end(5)
            os.close(5)
            if not data:  # the worker went away before a run came
                os._exit(0)
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)  # born while the worker prepared at low priority
            run = json.loads(data)
        except BaseException as err:
            os.write(2, f"sandbox setup failed: {err}\n".encode())
            os._exit(126)
        self._confine(run, filtered=True)
        os.close(4)
        _runner.run(run["code"], run.get("call"), run.get("check", False), 3)

    def _child(self, run: dict, pipes: dict) -> None:
        """In the forked child: confine this process, then hand it to the program."""
        try:
            self._take_descriptors(pipes)
            os.closerange(5, 1 << 16)
        except BaseException as err:
            os.write(2, f"sandbox setup failed: {err}\n".encode())
            os._exit(126)
        self._confine(run)
        if "argv" in run:
            os.set_inheritable(3, False)
            try:
                os.execve(run["argv"][0], run["argv"], os.environ)
            except OSError as err:
                os.write(2, f"cannot start {run['argv'][0]}: {err.strerror}\n".encode())
                os._exit(127)
        os.close(4)
        _runner.run(run["code"], run.get("call"), run.get("check", False), 3)

    def _take_descriptors(self, pipes: dict) -> None:
        """A new session and the run's pipes on descriptors 0-4 (the environment is the
        worker's: :meth:`_set_environment`)."""
        if self.reset_sigint:
            _signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr"), (3, "result"), (4, "setup")):
            os.dup2(pipes[name][1 if name != "stdin" else 0], fd)
        os.set_inheritable(4, False)

    def _confine(self, run: dict, filtered: bool = False) -> None:
        """The run's limits, then the slot's uid, no_new_privs, Landlock and seccomp; reports
        ``ok`` on descriptor 4, or exits 126 saying what failed."""
        try:
            os.chdir(self.scratch)
            _jail.apply_rlimits(run["rlimits"])
            if self.mode == "landlock":
                ruleset = _landlock.ruleset(_landlock_read_paths(), _jail.host_devices(), self.scratch)
            if self.mode in ("jail", "landlock"):
                _jail.hand_over_stdio(self.uid, self.gid)
                _jail.drop_privileges(self.uid, self.gid, self.keep_read_search and "argv" not in run)
            _jail.prctl(_jail.PR_SET_NO_NEW_PRIVS, 1)
            if self.mode == "landlock":
                _landlock.restrict_self(ruleset)
            if not filtered:
                _jail.load_seccomp(self.seccomp)
            os.write(4, b"ok")
        except BaseException as err:
            os.write(2, f"sandbox setup failed: {err}\n".encode())
            os._exit(126)

class _Watch:
    """Follows one running child: feeds stdin, collects output, enforces deadlines and caps."""

    def __init__(self, run: dict, pipes: dict, pid: int, started: float, control_fd: int):
        self.pid, self.started, self.control_fd = pid, started, control_fd
        self.timeout = float(run["timeout_s"])
        self.deadline = started + self.timeout
        self.hard_deadline = started + float(run.get("total_timeout_s", self.timeout))
        self.output_cap = int(run["output_bytes"])
        # Past the cap, output is dropped and the run goes on (SandboxFusion's way) instead of
        # the run being stopped with output_limit.
        self.truncate = bool(run.get("truncate_output"))
        self.truncated = False
        self.cpu_limit = run["rlimits"].get("cpu_s", float("inf"))
        self.stdin = run.get("stdin", "").encode()
        self.fds = {pipes["stdout"][0]: "stdout", pipes["stderr"][0]: "stderr",
                    pipes["result"][0]: "result", pipes["setup"][0]: "setup"}
        self.stdin_fd = pipes["stdin"][1]
        self.data = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray(),
                     "setup": bytearray()}
        self.events = []
        self.pending = b""
        self.status = None
        self.scratch = None  # (directory, byte cap, entry cap) when the worker must measure it

    def follow(self) -> dict:
        pidfd = os.pidfd_open(self.pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self.control_fd, select.POLLIN)
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        if self.stdin:
            os.set_blocking(self.stdin_fd, False)
            poller.register(self.stdin_fd, select.POLLOUT)
        else:
            os.close(self.stdin_fd)
            self.stdin_fd = None
        try:
            self._loop(poller, pidfd)
        finally:
            os.close(pidfd)
            if self.stdin_fd is not None:
                os.close(self.stdin_fd)
        return self._outcome()

    def _loop(self, poller, pidfd: int) -> None:
        while self.status is None:
            now = time.monotonic()
            limit = min(self.deadline, self.hard_deadline)
            if now >= limit:
                self.status = "timeout"
                break
            if self.scratch and _scratch_over(*self.scratch):
                self.status = "output_limit"
                break
            wait = min(limit - now, _SCRATCH_CHECK_S) if self.scratch else limit - now
            for fd, _ in poller.poll(max(1, int(wait * 1000) + 1)):
                if fd == pidfd:
                    self._drain_all()
                    return
                if fd == self.control_fd:
                    # The executor sends nothing during a job: this is its socket closing.
                    # Exiting through run_one's cleanup ends the job and everything it started.
                    raise SystemExit("the executor closed the connection during a job")
                if fd == self.stdin_fd:
                    self._feed_stdin(poller)
                elif not self._read(fd):
                    poller.unregister(fd)

    def _feed_stdin(self, poller) -> None:
        try:
            written = os.write(self.stdin_fd, self.stdin[:_READ_CHUNK])
        except BrokenPipeError:
            written = len(self.stdin)
        self.stdin = self.stdin[written:]
        if not self.stdin:
            poller.unregister(self.stdin_fd)
            os.close(self.stdin_fd)
            self.stdin_fd = None

    def _read(self, fd: int) -> bool:
        """Read what ``fd`` has now; False once it reached end of file."""
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        if chunk:
            self._take(self.fds[fd], chunk)
        return bool(chunk)

    def _take(self, name: str, chunk: bytes) -> None:
        if self.truncate and name in ("stdout", "stderr"):
            room = self.output_cap - len(self.data["stdout"]) - len(self.data["stderr"])
            if len(chunk) > room:
                chunk, self.truncated = chunk[:max(room, 0)], True
        self.data[name] += chunk
        if name == "result":
            self._note_results(chunk)
        over_output = len(self.data["stdout"]) + len(self.data["stderr"]) > self.output_cap
        if over_output or len(self.data["result"]) > _RESULT_CAP:
            self.status = "output_limit"

    def _note_results(self, chunk: bytes) -> None:
        """Record when each result line arrived; a ``start`` line restarts the case clock."""
        now = time.monotonic()
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            self.events.append([round(now - self.started, 6), line.decode("utf-8", "replace")])
            if line.startswith(b'{"start":'):
                self.deadline = now + self.timeout

    def _drain_all(self) -> None:
        """The child has exited: take what its pipes still hold, without waiting for
        descendants that may keep them open."""
        for fd, name in self.fds.items():
            os.set_blocking(fd, False)
            while self.status is None:
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                self._take(name, chunk)

    def _outcome(self) -> dict:
        if self.status is not None:
            os.kill(self.pid, signal.SIGKILL)
        _, wait_status, usage = os.wait4(self.pid, 0)
        wall = time.monotonic() - self.started
        exit_code = os.waitstatus_to_exitcode(wait_status)
        signal_name = signal.Signals(-exit_code).name if exit_code < 0 else None
        return {
            "status": self._classify(exit_code, signal_name, usage),
            "exit_code": exit_code if exit_code >= 0 else None,
            "signal": signal_name,
            "stdout": self.data["stdout"][:self.output_cap].decode("utf-8", "replace"),
            "stderr": self.data["stderr"][:self.output_cap].decode("utf-8", "replace"),
            "events": self.events,
            "truncated": self.truncated,
            "wall_s": round(wall, 6),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 6),
        }

    def _classify(self, exit_code: int, signal_name, usage) -> str:
        if self.data["setup"] != b"ok":
            return "sandbox_error"
        if self.status is not None:
            return self.status
        cpu_s = usage.ru_utime + usage.ru_stime
        if signal_name == "SIGXCPU" or (signal_name == "SIGKILL" and cpu_s >= self.cpu_limit):
            return "timeout"
        if exit_code == 0:
            return "ok"
        stderr_tail = bytes(self.data["stderr"][-4096:]).decode("utf-8", "replace")
        memory = any(event[1].startswith('{"memory_error"') for event in self.events)
        if memory or any(marker in stderr_tail for marker in _LIMIT_MARKERS):
            return "memory_limit"
        return "runtime_error"


def _scratch_over(directory: str, max_bytes: int, max_entries: int) -> bool:
    """Whether the files under ``directory`` take more than ``max_bytes`` of disk or number
    more than ``max_entries``. Walks without following links or recursing in Python."""
    used, entries, pending = 0, 0, [directory]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    used += entry.stat(follow_symlinks=False).st_blocks * 512
                    if used > max_bytes or entries > max_entries:
                        return True
        except OSError:
            continue  # removed while we looked
    return False


def _landlock_read_paths() -> list:
    """What a landlock-mode program may read and execute: the system's software, a few
    /etc files and the Python installation; never /proc, /home, /root, /tmp or the
    working tree."""
    system = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    return system + ["/etc/" + name for name in _jail.ETC_FILES] + _jail.python_paths()


def _children() -> list:
    """This process's children (zombies included), from /proc; read without a file object,
    since the worker runs this while a run's child may still share its pages."""
    fd = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY)
    try:
        return [int(pid) for pid in _read_to_end(fd).split()]
    finally:
        os.close(fd)


def _send_run(fd: int, run: dict) -> None:
    try:
        _runner._write(fd, json.dumps(run, separators=(",", ":")).encode())
    finally:
        os.close(fd)


def _read_to_end(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, _READ_CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _serve(worker: Worker, sock: socket.socket, single: bool) -> None:
    send_message(sock, {"ready": True, "pid": os.getpid()})
    while True:
        worker.top_up(sock)
        job = recv_message(sock)
        if job is None:
            return
        try:
            reply = worker.run_job(job)
        except Exception as err:  # reported to the parent as a sandbox_error, then retried
            reply = {"error": f"{type(err).__name__}: {err}"}
        send_message(sock, reply)
        if single:
            return


def _enter_namespaces(control_fd: int) -> None:
    """Unshare once; the forked child becomes PID 1 of the new namespace and carries on.

    The outer process only waits. It is not tied to the parent's lifetime by a signal
    (that would follow the parent *thread* that started it); instead the inner worker
    exits when the control socket closes, which takes the whole namespace with it.
    """
    _jail.unshare(_jail.SLOT_NAMESPACES)
    pid = os.fork()
    if pid:
        os.close(control_fd)
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _jail.die_with_parent()
    _jail.build_root(_jail.python_paths())


def main() -> None:
    settings = json.loads(sys.argv[1])
    # No job may read or write this process's memory or take its descriptors through
    # /proc: in bwrap mode programs run under the worker's own uid, which would allow it.
    _jail.prctl(_jail.PR_SET_DUMPABLE, 0)
    if settings["mode"] == "bwrap":
        # PID 1 of the job's namespace, under the program's uid: of the signals a job can
        # send it, the kernel delivers only those it handles, and Python handles SIGINT.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=settings["fd"])
    _runner.warm_up()
    if settings["mode"] == "jail":
        _enter_namespaces(settings["fd"])
    worker = Worker(settings["mode"], settings.get("uid", -1), settings.get("gid", -1),
                    settings.get("scratch_mb", 64), settings["env"], settings["fd"],
                    settings.get("ready", 0), settings.get("scratch", "/tmp"), settings.get("seccomp", ""))
    _serve(worker, sock, settings["mode"] == "bwrap")


if __name__ == "__main__":
    main()
