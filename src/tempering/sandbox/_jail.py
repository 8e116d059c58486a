"""Linux primitives for the sandbox: namespaces, the jailed filesystem, rlimits, seccomp.

Runs inside the worker process (``_zygote.py``), before any untrusted code, so it uses
only the standard library, ``ctypes`` and ``pyseccomp``. Nothing here decides a verdict.
"""

import ctypes
import errno
import os
import platform
import resource
import socket
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWCGROUP = 0x02000000
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET, CLONE_NEWCGROUP)
SLOT_NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
PR_SET_CHILD_SUBREAPER = 36
SECCOMP_MODE_FILTER = 2

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

# Devices a program may open; everything else under /dev is absent.
DEVICES = ("null", "zero", "full", "random", "urandom")
# Files from /etc that programs and language runtimes read; the rest of /etc stays hidden.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
             "nsswitch.conf", "host.conf", "mime.types")


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source, target, fstype, flags: int = 0, data=None) -> None:
    def enc(s):
        return None if s is None else os.fsencode(s)
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def umount(target: str) -> None:
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(MNT_DETACH)), f"umount {target}")


# Typed once, so that a call converts plain ints and makes no ctypes objects: a run's child
# calls it after its fork, where every object made or touched costs a page copied.
_prctl = _libc.prctl
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
_prctl.restype = ctypes.c_int


def prctl(option: int, arg: int = 0) -> None:
    _check(_prctl(option, arg, 0, 0, 0), "prctl")


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent goes away."""
    prctl(PR_SET_PDEATHSIG, 9)


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unsupported machine {platform.machine()}")
    _check(_libc.syscall(ctypes.c_long(number), os.fsencode(new_root), os.fsencode(put_old)),
           "pivot_root")


def _bind_readonly(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mirror_top_level(root: str, name: str) -> None:
    host = "/" + name
    if os.path.islink(host):
        os.symlink(os.readlink(host), os.path.join(root, name))
    elif os.path.isdir(host):
        _bind_readonly(host, os.path.join(root, name))


def host_devices() -> list:
    return ["/dev/" + name for name in DEVICES]


def _make_dev(root: str) -> None:
    dev = os.path.join(root, "dev")
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        target = os.path.join(dev, name)
        open(target, "a").close()
        mount("/dev/" + name, target, None, MS_BIND)
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NOEXEC)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(link, os.path.join(dev, name))
    mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


# Directories the new root can be assembled on. The first one that is not an ancestor of
# anything bound into the root is used: a tmpfs mounted there would hide that source
# (a Python environment under /tmp, say) before it could be bound.
_STAGING_POINTS = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp", "/run")


def _staging_point(sources) -> str:
    for candidate in _STAGING_POINTS:
        if os.path.isdir(candidate) and not any(
                src == candidate or src.startswith(candidate + "/") for src in sources):
            return candidate
    raise OSError(errno.ENOENT, "no directory to build the sandbox root on: every one of "
                  f"{', '.join(_STAGING_POINTS)} is missing or holds the Python installation")


def scratch_point(bound_paths) -> str:
    """Where each job's scratch tmpfs is mounted: /tmp, unless something bound into the jail
    (the Python environment; in ``bwrap`` mode also the worker's folder) lives under /tmp,
    where a tmpfs would hide it or, mounted first, hold its mount point; then /scratch.
    TMPDIR, HOME and the working directory always name it, so only programs that hard-code
    /tmp notice.

    >>> scratch_point(["/usr/local"]), scratch_point(["/tmp/checkout/.venv"])
    ('/tmp', '/scratch')
    """
    return "/scratch" if any(p == "/tmp" or p.startswith("/tmp/") for p in bound_paths) else "/tmp"


def build_root(python_paths, hostname: str = "sandbox") -> None:
    """Replace this mount namespace's root with a minimal read-only tree.

    Visible: /usr (and the /bin, /lib... links into it), a short list of /etc files, the
    Python installation(s) in ``python_paths``, a few /dev nodes, a fresh /proc for this
    PID namespace and an empty /tmp mount point for the per-job scratch tmpfs. The rest of
    the host (home directories, /root, working trees, /var, /srv, /mnt, /sys) is unmounted.
    Must run as root in a fresh mount and PID namespace.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = _staging_point(["/usr", "/etc", "/dev", *python_paths])
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    _bind_readonly("/usr", root + "/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        _mirror_top_level(root, name)
    for name in ETC_FILES:
        if os.path.exists("/etc/" + name):
            _bind_readonly("/etc/" + name, f"{root}/etc/{name}")
    for path in python_paths:
        if not path.startswith("/usr/"):
            _bind_readonly(path, root + path)
    _make_dev(root)
    os.makedirs(root + "/proc")
    # A program sees its own uid's processes only: not the worker, nor the children it
    # forked ahead of their runs (root's, waiting for a run of their own).
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    os.makedirs(root + scratch_point(python_paths), exist_ok=True)
    os.makedirs(root + "/.old")
    pivot_root(root, root + "/.old")
    os.chdir("/")
    umount("/.old")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    socket.sethostname(hostname)


def mount_scratch(path: str, size_mb: int, uid: int, gid: int) -> None:
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={size_mb}m,nr_inodes=4096,mode=700,uid={uid},gid={gid}")


_RLIMITS = {
    "address_space": resource.RLIMIT_AS,
    "cpu_s": resource.RLIMIT_CPU,
    "file_size": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
    "core": resource.RLIMIT_CORE,
    "stack": resource.RLIMIT_STACK,
    "locked_memory": resource.RLIMIT_MEMLOCK,
    "message_queue": resource.RLIMIT_MSGQUEUE,
}


def apply_rlimits(limits: dict) -> None:
    """Set the per-job resource limits; hard limits are set too, so they cannot be raised."""
    for name, value in limits.items():
        # The CPU hard limit sits one second above the soft one so the program first gets
        # SIGXCPU, which the parent reads as a timeout rather than an unexplained kill.
        hard = value + 1 if name == "cpu_s" else value
        resource.setrlimit(_RLIMITS[name], (value, hard))


PR_SET_KEEPCAPS, CAP_DAC_READ_SEARCH = 8, 2
_CAPABILITY_VERSION_3 = 0x20080522


def drop_privileges(uid: int, gid: int, keep_read_search: bool = False) -> None:
    """Become ``uid``/``gid`` with no capabilities, or with CAP_DAC_READ_SEARCH alone when
    ``keep_read_search`` (it is lost again on execve: no file or ambient capabilities)."""
    if keep_read_search:
        prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if keep_read_search:
        header = ctypes.create_string_buffer(struct.pack("Ii", _CAPABILITY_VERSION_3, 0), 8)
        kept = 1 << CAP_DAC_READ_SEARCH
        data = ctypes.create_string_buffer(struct.pack("6I", kept, kept, 0, 0, 0, 0), 24)
        _check(_libc.capset(header, data), "capset")


def hand_over_stdio(uid: int, gid: int) -> None:
    """Make ``uid`` the owner of the pipes on descriptors 0-2, before dropping to it.

    The worker made them as root, mode 0600. The descriptors work either way, but opening
    one again by path (/dev/stdin, /proc/self/fd/1) checks the pipe's owner, so without
    this a program could read ``sys.stdin`` but not ``open("/dev/stdin")``. The mode stays
    0600 and the pipes are fresh for each run; another slot's uid cannot reach them, since
    following a process's fd links needs ptrace access to it (the same uid).
    """
    for fd in (0, 1, 2):
        os.fchown(fd, uid, gid)


def reachable_by_others(path: str) -> bool:
    """Whether any uid may walk to ``path`` and list it: every directory on the way has
    the others-execute bit, and ``path`` the others-read bit.

    >>> reachable_by_others("/usr"), reachable_by_others("/proc/1/root/nonexistent")
    (True, False)
    """
    parts = path.rstrip("/").split("/")
    try:
        walk = [os.stat("/".join(parts[:i]) or "/").st_mode for i in range(1, len(parts) + 1)]
    except OSError:
        return False
    return all(mode & 0o001 for mode in walk) and bool(walk[-1] & 0o004)


# Syscalls that no program under test needs and that widen the attack surface: namespace
# and mount manipulation, tracing other processes, kernel modules and keys, eBPF,
# io_uring (a second syscall interface seccomp cannot see), clocks, reboot and swap, and
# System V IPC, whose segments, semaphores and queues outlive the job in its slot's IPC
# namespace (carrying data to the slot's later jobs, holding memory no job limit counts).
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "open_by_handle_at", "name_to_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "keyctl", "add_key", "request_key", "syslog", "quotactl", "vhangup",
    "sethostname", "setdomainname", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "iopl", "ioperm", "lookup_dcookie", "personality", "uselib",
    "fanotify_init",
    "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
    "msgget", "msgsnd", "msgrcv", "msgctl",
)


def seccomp_program(private_unix: bool = False) -> bytes:
    """Compile the job filter once and return its BPF bytes for :class:`SeccompFilter`.

    Default allow, with EPERM for :data:`DENIED_SYSCALLS`, for sockets of any family but
    AF_UNIX, and for clone() with namespace flags; clone3 answers ENOSYS so libc falls back
    to clone(), whose flags the filter can inspect. Other architectures' syscall ABIs kill.
    ``private_unix`` (for jobs that share the host's network namespace and file system)
    also refuses connect(), sendmsg() and sendto() with an address, so unix sockets only
    link the job's own processes (socketpair) and never reach a host service.
    """
    import pyseccomp as sc

    flt = sc.SyscallFilter(sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(eperm, name)
        except (OSError, ValueError, RuntimeError):
            continue
    for name in ("socket", "socketpair"):
        flt.add_rule(eperm, name, sc.Arg(0, sc.NE, socket.AF_UNIX))
    for flag in NAMESPACE_FLAGS:
        flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    if private_unix:
        for name in ("connect", "sendmsg", "sendmmsg"):
            flt.add_rule(eperm, name)
        flt.add_rule(eperm, "sendto", sc.Arg(4, sc.NE, 0))
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as sink:
        flt.export_bpf(sink)
    with os.fdopen(read_fd, "rb") as source:
        return source.read()


def seccomp_program_apart(private_unix: bool = False) -> bytes:
    """:func:`seccomp_program`, compiled in a throwaway child, so that pyseccomp and its
    library never enter the calling worker: the worker forks once per run, and every
    mapping it holds is copied and torn down again with each run's child (pyseccomp made
    that about 1 ms of CPU more per run here)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_fd)
            data = seccomp_program(private_unix)
            while data:
                data = data[os.write(write_fd, data):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as source:
        program = source.read()
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 or not program:
        raise OSError(errno.EINVAL, "the seccomp filter could not be compiled (is pyseccomp installed?)")
    return program


class SeccompFilter:
    """A compiled filter (:func:`seccomp_program`'s bytes) held ready to load: its BPF
    program and the ``sock_fprog`` that points at it are built once, in the worker, so that
    loading it in a run's child builds nothing (55 of the child's page faults, 0.5 ms of its
    CPU, when each child built them)."""

    def __init__(self, program: bytes):
        self.program = ctypes.create_string_buffer(program, len(program))
        fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(self.program))
        self.fprog = ctypes.create_string_buffer(fprog, len(fprog))
        self.address = ctypes.addressof(self.fprog)


def load_seccomp(flt: SeccompFilter) -> None:
    """Install a prepared filter on this thread (needs no_new_privs or CAP_SYS_ADMIN)."""
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, flt.address, 0, 0), "seccomp")


def python_paths() -> list:
    """Directories the Python runtime needs: its installation and the active environment."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
             os.path.realpath(os.path.dirname(sys.executable))}
    return sorted(p for p in paths if p != "/")


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a slot's own uid), wherever it is: a helper child
    takes that uid and signals -1, which reaches exactly the processes of its uid. A fork
    racing with the signal is aborted by the kernel, so one pass leaves none running."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, 9)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def namespaces_work() -> bool:
    """Whether this process may create the slot namespaces and remount in them (root with
    CAP_SYS_ADMIN and no seccomp or LSM rule against it); tried in a throwaway child."""
    pid = os.fork()
    if pid == 0:
        try:
            unshare(SLOT_NAMESPACES)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
        except OSError:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


if __name__ == "__main__":
    # The executor's probe, run as a fresh single-threaded process (forking is then safe).
    sys.exit(0 if namespaces_work() else 1)
