"""Hostile programs against each threat-model claim of ``tempering.sandbox``.

One test per claim, parametrized over the programs that attack it; the claim numbers
match the module docstring. Every program runs in the real sandbox. Positive controls
check that what honest programs use (their standard streams by path, stdio tests) still
works. The last test checks that the whole suite left no processes, files, descriptors
or memory behind.
"""

import json
import os
import platform
import resource
import shutil
import socket
import stat
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pyseccomp
import pytest

from sandbox_helpers import SECRET, fd_targets, open_fds, sandbox_processes, uid_block
from tempering.sandbox import CallCase, Executor, Limits, RunRequest, StdioCase, Tests, TestSpec
from tempering.sandbox.executor import ENVIRONMENT

BASELINE = {}


def run(executor, code, language="python", timeout_s=2.0, memory_mb=256, **limits):
    request = RunRequest(textwrap.dedent(code), language,
                         limits=Limits(timeout_s=timeout_s, memory_mb=memory_mb, **limits))
    return executor.run(request)


@pytest.fixture
def unisolated():
    """A pool in mode ``none``: no namespaces, uid or Landlock, only limits and seccomp."""
    with Executor(workers=1, isolation="none") as pool:
        yield pool


def test_baseline(executor):
    """Recorded before the hostile programs, compared by the last test."""
    BASELINE.update(fds=open_fds(), fd_targets=fd_targets(), rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                    tmp=set(os.listdir("/tmp")), disk=shutil.disk_usage("/").free)


LIBC = "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"

# 1. No escape: every privileged operation is refused, the host's processes are hidden.
ESCAPES = {
    "setuid-root": "import os\ntry:\n    os.setuid(0)\n    print('ESCAPED')\nexcept OSError:\n    print('refused')",
    "ptrace-attach-worker": LIBC + "r = libc.ptrace(16, 1, 0, 0)\nprint('ESCAPED' if r == 0 else 'refused')",
    "unshare-user-namespace": LIBC + "r = libc.unshare(0x10000000)\nprint('ESCAPED' if r == 0 else 'refused')",
    "mount-tmpfs": LIBC + "r = libc.mount(b'none', b'/usr', b'tmpfs', 0, None)\nprint('ESCAPED' if r == 0 else 'refused')",
    "chroot": "import os\ntry:\n    os.chroot('/tmp')\n    print('ESCAPED')\nexcept OSError:\n    print('refused')",
    "io-uring-setup": LIBC + "r = libc.syscall(425, 8, ctypes.create_string_buffer(120))\nprint('ESCAPED' if r >= 0 else 'refused')",
    "bpf": LIBC + "r = libc.syscall(321, 0, ctypes.create_string_buffer(128), 128)\nprint('ESCAPED' if r >= 0 else 'refused')",
    "unshare-binary": "import subprocess\nr = subprocess.run(['unshare', '--user', '--map-root-user', 'id'], capture_output=True)\nprint('ESCAPED' if r.returncode == 0 else 'refused')",
    "host-processes-hidden": "import os\ntry:\n    names = [open(f'/proc/{p}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()]\nexcept OSError:\n    names = []\nprint('ESCAPED' if any(b'pytest' in n for n in names) or len(names) > 4 else 'refused')",
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_claim1_no_escape(executor, name):
    result = run(executor, ESCAPES[name])
    assert "ESCAPED" not in result.stdout, result
    assert "refused" in result.stdout, result


# Privileged kernel interfaces, called by syscall number. Past the filter and the kernel's
# own capability checks, these arguments would get another answer (another errno, or a
# harmless success such as a clock read or a key in the caller's own process keyring):
# the expected errno shows that the refusal came first, and should both layers fail,
# nothing on the host changes. name: (syscall, setup, arguments, expected errno)
PRIVILEGED_CALLS = {
    "init_module": ("init_module", "image = ctypes.create_string_buffer(b'\\x7fELF' + bytes(60))",
                    "image, ctypes.c_ulong(64), b''", "EPERM"),
    "finit_module": ("finit_module", "fd = os.open('/dev/null', os.O_RDONLY)", "fd, b'', 0", "EPERM"),
    "delete_module": ("delete_module", "", "b'tempering_absent', 0", "EPERM"),
    "add_key": ("add_key", "", "b'user', b'tempering', b'x', ctypes.c_size_t(1), -2", "EPERM"),
    "keyctl-join-session": ("keyctl", "", "1, b'tempering'", "EPERM"),
    "request_key": ("request_key", "", "b'user', b'tempering-absent', None, 0", "EPERM"),
    "reboot-wrong-magic": ("reboot", "", "ctypes.c_long(0xfee1dead), 0, ctypes.c_long(0x4321fedc), None", "EPERM"),
    "settimeofday": ("settimeofday", "tv = (ctypes.c_long * 2)(0, -1)", "tv, None", "EPERM"),
    "clock_settime": ("clock_settime", "ts = (ctypes.c_long * 2)(0, -1)", "0, ts", "EPERM"),
    "adjtimex-read": ("adjtimex", "tx = ctypes.create_string_buffer(512)", "tx", "EPERM"),
    "clock_adjtime-read": ("clock_adjtime", "tx = ctypes.create_string_buffer(512)", "0, tx", "EPERM"),
    "setns": ("setns", "", "-1, 0", "EPERM"),
    "clone-new-user": ("clone", "", "ctypes.c_ulong(0x10000000 | 0x200 | 17), 0, 0, 0, 0", "EPERM"),
    "clone3": ("clone3", "", "None, 0", "ENOSYS"),
}


def _syscall_program(name):
    syscall, setup, arguments, _ = PRIVILEGED_CALLS[name]
    number = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, syscall)
    return (f"{LIBC}import errno\n{setup}\nr = libc.syscall(ctypes.c_long({number}), {arguments})\n"
            "print('ok' if r >= 0 else errno.errorcode[ctypes.get_errno()])")


@pytest.mark.parametrize("name", sorted(PRIVILEGED_CALLS))
def test_claim1_privileged_kernel_interfaces_refused(executor, name):
    result = run(executor, _syscall_program(name))
    assert result.stdout == PRIVILEGED_CALLS[name][3] + "\n", result


def test_claim1_the_filter_alone_refuses_them(unisolated):
    """As root with every capability but no jail (mode ``none`` keeps only the limits and
    the seccomp filter), each call above still fails the same way: the claim does not rest
    on the capabilities the slot's uid lacks."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only a root program holds the capabilities these calls check")
    names = sorted(PRIVILEGED_CALLS)
    results = unisolated.run_many([RunRequest(_syscall_program(name)) for name in names])
    assert {name: r.stdout for name, r in zip(names, results)} == {
        name: PRIVILEGED_CALLS[name][3] + "\n" for name in names}


# getpid through another architecture's syscall convention, which rules written for the
# native one would not match: the filter kills the program instead. The i386 call is
# machine code: mov eax, 20; int 0x80; ret.
FOREIGN_ABIS = {
    "x32": LIBC + "libc.syscall(ctypes.c_long(0x40000000 | 39))\nprint('ran')",
    "i386-int-0x80": LIBC + "import mmap\ncode = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
                     "code.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')\n"
                     "ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()\nprint('ran')",
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and int 0x80 are x86-64 conventions")
@pytest.mark.parametrize("name", sorted(FOREIGN_ABIS))
def test_claim1_foreign_syscall_conventions_kill(executor, name):
    result = run(executor, FOREIGN_ABIS[name])
    assert (result.signal, result.stdout) == ("SIGSYS", ""), result


# Setuid-root binaries the jail shows (its /usr is the host's). A library preloaded into
# each reports, from inside the started binary, its uids, whether the loader ran it as
# privileged (AT_SECURE), its capabilities and whether setuid(0) works. A binary that did
# gain root would ignore the preload (the loader's secure mode) and report nothing.
SETUID_ROOT = [path for path in ("/usr/bin/su", "/usr/bin/passwd", "/usr/bin/mount", "/usr/bin/newgrp")
               if os.path.exists(path) and os.stat(path).st_uid == 0 and os.stat(path).st_mode & stat.S_ISUID]
PRIVILEGE_PROBE = r"""
#define _GNU_SOURCE
#include <linux/capability.h>
#include <stdio.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((constructor)) static void report(void) {
    uid_t ruid, euid, suid;
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct caps[2] = {{0}};
    getresuid(&ruid, &euid, &suid);
    syscall(SYS_capget, &header, caps);
    const char *setuid_root = setuid(0) == 0 ? "ok" : "refused";
    printf("uids=%u,%u,%u secure=%lu caps=%x,%x setuid(0)=%s\n", ruid, euid, suid,
           getauxval(AT_SECURE), caps[0].effective, caps[1].effective, setuid_root);
    fflush(stdout);
    _exit(0);
}
"""
SETUID_ATTACK = """import os, subprocess
open('probe.c', 'w').write({probe!r})
subprocess.run(['cc', '-shared', '-fPIC', '-o', 'probe.so', 'probe.c'], check=True)
print(os.getuid())
for path in {binaries!r}:
    done = subprocess.run([path], env=dict(os.environ, LD_PRELOAD=os.path.abspath('probe.so')),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    print(path, done.stdout.strip())"""


@pytest.mark.skipif(not SETUID_ROOT or shutil.which("cc") is None,
                    reason="needs a setuid-root binary in /usr/bin and a C compiler")
def test_claim1_setuid_binaries_raise_no_privilege(executor):
    result = run(executor, SETUID_ATTACK.format(probe=PRIVILEGE_PROBE, binaries=SETUID_ROOT),
                 timeout_s=30.0, memory_mb=1024)
    assert result.status == "ok", result
    uid, *reports = result.stdout.splitlines()
    unprivileged = f"uids={uid},{uid},{uid} secure=0 caps=0,0 setuid(0)=refused"
    assert uid != "0" and reports == [f"{path} {unprivileged}" for path in SETUID_ROOT], result


# 2. No network, the host's loopback included.
NETWORK = {
    "tcp-host-loopback": "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')",
    "tcp-outside": "import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('CONNECTED')",
    "udp-outside": "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('8.8.8.8', 53))\nprint('CONNECTED')",
    "ipv6-loopback": "import socket\ns = socket.create_connection(('::1', {port}), timeout=1)\nprint('CONNECTED')",
    "netlink": "import socket\ns = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)\nprint('CONNECTED')",
    "raw-packet": "import socket\ns = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\nprint('CONNECTED')",
    "bash-dev-tcp": "exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED",
}


@pytest.mark.parametrize("name", sorted(NETWORK))
def test_claim2_no_network(executor, listener, name):
    language = "bash" if name.startswith("bash") else "python"
    code = NETWORK[name].format(port=listener.getsockname()[1])
    result = run(executor, code, language)
    assert "CONNECTED" not in result.stdout
    assert result.status == "runtime_error", result
    with pytest.raises(BlockingIOError):
        listener.accept()


@pytest.fixture
def unix_listeners(tmp_path):
    """A world-writable unix socket file on the host and an abstract one, both listening."""
    named = socket.socket(socket.AF_UNIX)
    path = tmp_path / "host.sock"
    named.bind(str(path))
    os.chmod(path, 0o777)
    os.chmod(tmp_path, 0o777)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0tempering-test-" + str(os.getpid()).encode())
    for listener in (named, abstract):
        listener.listen(8)
        listener.setblocking(False)
    yield {"named": str(path), "abstract": abstract.getsockname()}, (named, abstract)
    named.close()
    abstract.close()


def test_claim2_no_host_unix_sockets(executor, unix_listeners):
    addresses, listeners = unix_listeners
    for kind, kind_of in (("stream", "SOCK_STREAM"), ("datagram", "SOCK_DGRAM")):
        for name, address in addresses.items():
            code = (f"import socket\ns = socket.socket(socket.AF_UNIX, socket.{kind_of})\n"
                    f"try:\n    s.connect({address!r})\n    s.send(b'x')\n    print('CONNECTED')\n"
                    "except OSError:\n    print('refused')")
            result = run(executor, code)
            assert result.stdout == "refused\n", (kind, name, result)
    for listener in listeners:
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_claim2_unix_sockets_still_work(executor):
    result = run(executor, "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1))")
    assert result.stdout == "b'x'\n", result


# 3. No host files, no caller environment.
def _reader(path):
    return f"import os\ntry:\n    print('READ', open({path!r}).read()[:80])\nexcept OSError as e:\n    print('refused', e.errno)"


READS = {
    "etc-shadow": _reader("/etc/shadow"),
    "etc-passwd": _reader("/etc/passwd"),
    "this-test-file": _reader(os.path.abspath(__file__)),
    "root-home": "import os\ntry:\n    print('READ', open('/root/.bashrc').read()[:80], os.listdir('/home') if os.path.isdir('/home') else '')\nexcept OSError:\n    print('refused')",
    "root-home-hidden": "import os\nprint('READ' if os.path.exists('/root/.bashrc') or os.path.exists('/home') and os.listdir('/home') else 'refused')",
    "environment": "import os\nprint('READ' if any('secret' in v for v in os.environ.values()) else 'refused', sorted(os.environ))",
    "proc-environ": "import os\nfound = []\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n        found += [p] if b'secret' in open(f'/proc/{p}/environ', 'rb').read() else []\n    except OSError:\n        pass\nprint('READ' if found else 'refused')",
}


@pytest.mark.parametrize("name", sorted(READS))
def test_claim3_no_host_files_or_environment(executor, name):
    if name == "root-home-hidden" and executor.isolation == "landlock":
        pytest.skip("landlock mode: host paths' existence is visible (see the threat model)")
    result = run(executor, READS[name])
    assert "READ" not in result.stdout and SECRET not in result.stdout + result.stderr, result


def test_claim3_every_run_has_the_fixed_environment_whatever_an_earlier_run_set(executor):
    """The environment is the fixed list with HOME and TMPDIR the run's scratch space (its
    working directory), in every run a slot serves, waiting children's included; what a run
    sets, unsets or replaces stays in its own process."""
    show = "import json, os\nprint(json.dumps([dict(os.environ), os.getcwd()]))"
    meddle = ("import os\nos.environ['LEAKED'] = '1'\nos.putenv('LEAKED_C', '1')\nos.environ.pop('PATH')\n"
              "os.environ['TZ'] = 'Europe/Paris'\n" + show)
    results = executor.run_many([RunRequest(meddle)] * 4 + [RunRequest(show)] * 12)
    assert all(r.status == "ok" for r in results), results
    seen = [json.loads(r.stdout) for r in results]
    assert all("LEAKED" in env and "PATH" not in env for env, _ in seen[:4])
    for env, cwd in seen[4:]:
        assert env == {**ENVIRONMENT, "HOME": cwd, "TMPDIR": cwd}, env


def test_claim3_host_secret_file(executor, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    result = run(executor, _reader(str(secret)))
    assert SECRET not in result.stdout and "refused" in result.stdout, result


# 4. No writes outside the scratch space; the scratch space starts empty every job.
WRITES = {
    "usr": "/usr/lib/tempering-pwned",
    "root": "/tempering-pwned",
    "etc": "/etc/tempering-pwned",
    "proc-sys": "/proc/sys/kernel/hostname",
    "dev": "/dev/tempering-pwned",
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_claim4_no_writes_outside_scratch(executor, name):
    code = f"try:\n    open({WRITES[name]!r}, 'w').write('x')\n    print('WROTE')\nexcept OSError:\n    print('refused')"
    result = run(executor, code)
    assert result.stdout == "refused\n", result


def test_claim4_host_path_untouched(executor, tmp_path):
    """Under /tmp the program can only reach its own scratch tmpfs, never the host's."""
    target = tmp_path / "pwned"
    run(executor, f"import os\nos.makedirs({str(tmp_path)!r}, exist_ok=True)\nopen({str(target)!r}, 'w').write('x')")
    assert not target.exists()


def test_claim4_scratch_is_fresh_each_job(executor):
    code = "import os\nprint(sorted(os.listdir('.')))\nopen('left-behind', 'w').write('x' * 1000)"
    results = executor.run_many([RunRequest(code) for _ in range(6)])
    assert all(r.stdout == "[]\n" for r in results), results


# 5. No exhaustion of host memory, disk, processes, CPU or the parent's memory.
EXHAUSTION = {
    "memory": ("x = bytearray(2 << 30)", {"memory_limit"}),
    "memory-creep": ("x = []\nwhile True:\n    x.append(' ' * (1 << 20))", {"memory_limit"}),
    "fork-bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", {"timeout"}),
    "thread-bomb": ("import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(100,)).start()", {"runtime_error"}),
    "disk-fill": ("with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))", {"runtime_error"}),
    "inode-fill": ("i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1", {"runtime_error"}),
    "busy-loop": ("while True:\n    pass", {"timeout"}),
    "ignore-sigxcpu": ("import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass", {"timeout"}),
    "stdout-flood": ("while True:\n    print('y' * 1000)", {"output_limit"}),
    "stderr-flood-no-newline": ("import sys\nwhile True:\n    sys.stderr.write('z' * 4096)", {"output_limit"}),
    "sleep-forever": ("import time\ntime.sleep(1000)", {"timeout"}),
    "segfault": ("import ctypes\nctypes.string_at(0)", {"runtime_error"}),
    "deep-recursion": ("import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1)\nf(0)", {"runtime_error", "memory_limit", "timeout"}),
}


@pytest.mark.parametrize("name", sorted(EXHAUSTION))
def test_claim5_no_exhaustion(executor, name):
    code, statuses = EXHAUSTION[name]
    if name == "inode-fill" and executor.isolation == "bwrap":
        statuses = statuses | {"timeout"}  # bubblewrap cannot cap a tmpfs's inodes
    if name in ("disk-fill", "inode-fill") and executor.isolation == "landlock":
        # No tmpfs: the worker measures the scratch directory and stops the job at its cap,
        # unless the time limit comes first (creating files on disk is slower than on tmpfs).
        statuses = {"output_limit", "timeout"}
    before = shutil.disk_usage("/").free
    # A program that must end by another limit than time gets room to reach it: memory-creep
    # reaches its 256 MB in about 0.2 s of CPU alone, but took 1.4 s under a full suite (page
    # faults slow when the host reclaims memory), and tmpfs writes can slow the same way.
    timeout_s = 1.5 if "timeout" in statuses else 5.0
    result = run(executor, code, timeout_s=timeout_s, output_bytes=1 << 20, file_size_mb=1024)
    assert result.status in statuses, result
    assert result.wall_s < 10
    assert len(result.stdout) + len(result.stderr) <= 1 << 20
    assert abs(shutil.disk_usage("/").free - before) < 64 << 20
    assert sandbox_processes() == []


def test_claim5_cpp_memory_and_fork(executor):
    code = "#include <vector>\n#include <unistd.h>\nint main(){ for(int i=0;i<64;i++) fork(); std::vector<char> v(1L<<33); return v[5]; }"
    result = run(executor, code, "cpp", timeout_s=2.0)
    assert result.status in {"memory_limit", "runtime_error"}, result
    assert sandbox_processes() == []


# 6. Nothing outlives its job.
DAEMONS = {
    "double-fork-setsid": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['tempering-daemon-marker', '1000'])\n    os._exit(0)\ntime.sleep(0.2)\nprint('parent done')",
    "bash-background": "(exec -a tempering-daemon-marker sleep 1000 &) ; echo parent done",
    # No marker to look for: only the check for the sandbox's processes can see this one.
    "double-fork-unnamed": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '1000'])\n    os._exit(0)\ntime.sleep(0.2)\nprint('parent done')",
    "sigstopped-child": "import os, signal, time\npid = os.fork()\nif pid == 0:\n    os.execv('/bin/sleep', ['tempering-daemon-marker', '1000'])\ntime.sleep(0.2)\nos.kill(pid, signal.SIGSTOP)\nprint('parent done')",
}


def _marker_processes(marker=b"tempering-daemon-marker"):
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_claim6_nothing_outlives_the_job(executor, name):
    language = "bash" if name.startswith("bash") else "python"
    result = run(executor, DAEMONS[name], language)
    assert "parent done" in result.stdout, result
    assert _marker_processes() == []
    assert sandbox_processes() == []


# 7. No effect on other jobs or on the worker.
ATTACKS = {
    "kill-parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "kill-pid-1": "import os, signal\nos.kill(1, signal.SIGKILL)",
    "kill-everything": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "kill-host-pid": "import os, signal\nos.kill({pid}, signal.SIGTERM)",
    "close-all-fds": "import os\nos.closerange(0, 1024)",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_claim7_no_effect_on_other_jobs(executor, name):
    attack = RunRequest(ATTACKS[name].format(pid=os.getpid()), limits=Limits(timeout_s=2.0))
    honest = RunRequest("print(sum(range(10)))")
    results = executor.run_many([attack, honest, attack, honest, honest])
    assert [r.stdout for r in results[1::2]] + [results[4].stdout] == ["45\n"] * 3, results


SYSV_IPC = textwrap.dedent("""\
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    CREATE = {create}  # IPC_CREAT | 0o600, or 0 to look for what an earlier job left
    segment = libc.shmget(0x7E57, 4096 if CREATE else 0, CREATE)
    if CREATE and segment >= 0:
        ctypes.memmove(libc.shmat(segment, None, 0), b"left", 4)
    found = [segment >= 0, libc.semget(0x7E57, 1, CREATE) >= 0, libc.msgget(0x7E57, CREATE) >= 0]
    print(found)
""")


def test_claim7_no_system_v_ipc_outlives_its_job(executor):
    """A SysV shared-memory segment, semaphore set or message queue outlives its creator:
    left in a slot, it would carry data to the slot's next jobs and hold memory no limit of
    the job counts. Every job of several rounds on each slot finds none of them."""
    for _ in range(3):
        executor.run_many([RunRequest(SYSV_IPC.format(create=0o1600)) for _ in range(4)])
    found = [r.stdout for r in executor.run_many([RunRequest(SYSV_IPC.format(create=0)) for _ in range(4)])]
    assert found == ["[False, False, False]\n"] * 4


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL", "SIGSTOP", "SIGTERM"])
def test_claim7_worker_ignores_its_jobs_signals(executor, signal_name):
    code = (f"import os, signal, time\ntry:\n    os.kill(os.getppid(), signal.{signal_name})\n"
            "except OSError:\n    pass\ntime.sleep(0.2)\nprint('finished')")
    result = run(executor, code)
    assert (result.status, result.stdout) == ("ok", "finished\n"), result


def test_claim7_concurrent_jobs_do_not_share_scratch(executor):
    writer = RunRequest("import time\nopen('shared', 'w').write('x')\ntime.sleep(0.5)\nprint('wrote')")
    reader = RunRequest("import os, time\ntime.sleep(0.2)\nprint(os.path.exists('shared'))")
    results = executor.run_many([writer, reader])
    assert results[0].stdout == "wrote\n" and results[1].stdout == "False\n", results


# Looks for the waiting job in its own /proc (by its marker) and takes its host pid too.
STREAM_THIEF = """import os
victims = {victims}
try:
    for pid in filter(str.isdigit, os.listdir('/proc')):
        if b'tempering-stdin-victim' in open(f'/proc/{{pid}}/cmdline', 'rb').read():
            victims.add(int(pid))
except OSError:
    pass
opened = []
for pid in victims:
    for fd in (0, 1, 2):
        for flags in (os.O_RDONLY, os.O_WRONLY):
            try:
                os.open(f'/proc/{{pid}}/fd/{{fd}}', flags | os.O_NONBLOCK)
            except OSError:
                continue
            opened.append((pid, fd, flags))
print('OPENED' if opened else 'refused', opened)"""


def test_claim7_standard_streams_stay_private_to_their_slot(executor):
    """A job in one slot waits with unread stdin; a job in the other slot tries to open
    that job's standard streams by path."""
    victim = RunRequest("exec -a tempering-stdin-victim sleep 2", "bash", stdin="private\n",
                        limits=Limits(timeout_s=5.0))
    with ThreadPoolExecutor(1) as background:
        running = background.submit(executor.run, victim)
        for _ in range(1000):
            victims = set(_marker_processes(b"tempering-stdin-victim"))
            if victims or running.done():
                break
            time.sleep(0.005)
        result = run(executor, STREAM_THIEF.format(victims=victims or "set()"))
        assert victims and running.result().status == "ok", (victims, running.result())
    assert result.stdout == "refused []\n", result


# 8. No passing verdict without computing the right outputs.
def _call_spec(code, expected=(3, 7)):
    cases = tuple(CallCase([a, a + 1], e) for a, e in zip((1, 3), expected))
    return TestSpec("python", textwrap.dedent(code), Tests("call", cases, "add"), 2.0, 256)


FORGERIES = {
    "exit-0-at-import": "import sys\nsys.exit(0)\ndef add(a, b):\n    return a + b",
    "os-exit-0-in-call": "import os\ndef add(a, b):\n    os._exit(0)",
    "exit-0-in-call": "import sys\ndef add(a, b):\n    sys.exit(0)",
    "always-equal": "class Yes:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Yes()",
    "int-subclass-eq": "class I(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return I(0)",
    "stack-walk": "import sys, gc\ndef add(a, b):\n    f = sys._getframe()\n    while f:\n        if 'expected' in f.f_locals:\n            return f.f_locals['expected']\n        f = f.f_back\n    for o in gc.get_objects():\n        if isinstance(o, dict) and 'expected' in o:\n            return o['expected']\n    return None",
    "forge-results": "import os, json\nfor i in range(2):\n    os.write(3, (json.dumps({'case': i, 'value': 42}) + '\\n').encode())\n    os.write(3, b'{\"done\": true}\\n')\ndef add(a, b):\n    return -1",
    "forge-garbage-protocol": "import os\nos.write(3, b'{\"case\": 0, \"value\": {\"zz\": 1}}\\n{\"case\": 1, \"error\": null}\\nnot json\\n')\ndef add(a, b):\n    return -1",
    "patch-encoder": "import sys\nfor m in list(sys.modules.values()):\n    if hasattr(m, 'encode') and hasattr(m, 'decode') and getattr(m, '__name__', '') == '_codec':\n        m.encode = lambda v: 42\ndef add(a, b):\n    return None",
    "print-verdict": "print('{\"status\": \"passed\", \"passed\": 2, \"total\": 2}')\ndef add(a, b):\n    return None",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_claim8_no_forged_pass(executor, name):
    result = executor.test(_call_spec(FORGERIES[name]))
    assert result.passed == 0 and result.status == "failed", result


MEMORY_THIEF = """import os
for pid in sorted({1, os.getppid()}):
    for path, mode in ((f'/proc/{pid}/mem', 'r+b'), (f'/proc/{pid}/fd/0', 'rb')):
        try:
            open(path, mode)
            print('OPENED', path)
        except OSError:
            print('refused')
    try:
        print('OPENED', os.listdir(f'/proc/{pid}/fd'))
    except OSError:
        print('refused')"""


def test_claim8_worker_memory_and_descriptors_out_of_reach(executor):
    """The worker (the program's parent) holds the reply and the socket to the parent;
    PID 1 of its namespace runs outside the seccomp filter. Writing either's memory or
    taking its descriptors through /proc would forge a verdict or shed the filter."""
    result = run(executor, MEMORY_THIEF)
    assert set(result.stdout.splitlines()) == {"refused"}, result


def test_claim8_honest_solution_passes(executor):
    result = executor.test(_call_spec("def add(a, b):\n    return a + b"))
    assert result.status == "passed" and result.passed == 2, result


def test_claim8_stdio_exit_before_output(executor):
    spec = TestSpec("python", "import sys\nsys.exit(0)\nprint(int(input()) * 2)",
                    Tests("stdio", (StdioCase("2", "4"),)), 2.0, 256)
    result = executor.test(spec)
    assert result.cases[0].status == "wrong_answer", result


def test_claim8_program_verdicts_are_marked_weaker(executor):
    """The whole-program fallback trusts a message from inside the sandbox: a forger can
    pass it, which is why such results carry verdict='program'. This documents the gap."""
    forged = "import os\nos.write(3, b'{\"done\": true}\\n')\nos._exit(0)\nassert False"
    result = executor.test(TestSpec("python", forged, Tests("program"), 2.0, 256))
    assert result.verdict == "program"


# Positive controls: what honest programs use keeps working under every isolation mode.
def _copy(source, target):
    return f"data = open({source!r}).read()\nwith open({target!r}, 'w') as out:\n    out.write(data)"


# Each program copies its stdin ("line\n") to stdout or stderr, naming one end by path.
STDIO_BY_PATH = {
    "read-dev-stdin": ("python", _copy("/dev/stdin", 1), "stdout"),
    "read-proc-self-fd-0": ("python", _copy("/proc/self/fd/0", 1), "stdout"),
    "write-dev-stdout": ("python", _copy(0, "/dev/stdout"), "stdout"),
    "write-proc-self-fd-1": ("python", _copy(0, "/proc/self/fd/1"), "stdout"),
    "write-dev-stderr": ("python", _copy(0, "/dev/stderr"), "stderr"),
    "write-proc-self-fd-2": ("python", _copy(0, "/proc/self/fd/2"), "stderr"),
    "bash-cat-dev-stdin": ("bash", "cat /dev/stdin", "stdout"),
    "bash-tee-dev-stderr": ("bash", "tee /dev/stderr > /dev/null", "stderr"),
}


@pytest.mark.parametrize("name", sorted(STDIO_BY_PATH))
def test_control_standard_streams_open_by_path(executor, name):
    language, code, stream = STDIO_BY_PATH[name]
    result = executor.run(RunRequest(code, language, stdin="line\n", limits=Limits(timeout_s=2.0)))
    expected = {"stdout": "", "stderr": "", stream: "line\n"}
    assert (result.status, result.stdout, result.stderr) == ("ok", expected["stdout"], expected["stderr"]), result


def test_control_standard_streams_open_by_path_unisolated(unisolated):
    requests = [RunRequest(code, language, stdin="line\n") for language, code, _ in STDIO_BY_PATH.values()]
    outputs = {name: (result.status, getattr(result, stream)) for (name, (_, _, stream)), result
               in zip(STDIO_BY_PATH.items(), unisolated.run_many(requests))}
    assert outputs == {name: ("ok", "line\n") for name in STDIO_BY_PATH}, outputs


@pytest.mark.parametrize("language, code", [
    ("python", "a, b = map(int, open('/dev/stdin').read().split())\nprint(a + b)"),
    ("bash", "read a b < /dev/stdin\necho $((a + b))"),
], ids=["python", "bash"])
def test_control_stdio_tests_pass_reading_dev_stdin(executor, language, code):
    """The harness path a code reward takes: stdio cases judged by the parent."""
    cases = (StdioCase("2 3\n", "5\n"), StdioCase("4 4\n", "8\n"))
    result = executor.test(TestSpec(language, code, Tests("stdio", cases), 2.0, 256))
    assert (result.status, result.passed) == ("passed", 2), result


def test_zz_nothing_left_behind(executor):
    """After every hostile program: no sandbox processes, no new host files in /tmp, no
    leaked descriptors in this process, no runaway memory growth and no disk consumed."""
    assert sandbox_processes() == []
    new = {fd: target for fd, target in fd_targets().items() if BASELINE["fd_targets"].get(fd) != target}
    assert open_fds() <= BASELINE["fds"], f"descriptors opened since the first test: {new}"
    assert not [p for p in set(os.listdir("/tmp")) - BASELINE["tmp"] if p.startswith("tempering-sandbox") and _ours(p)]
    rss_growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - BASELINE["rss"]) / 1024
    assert rss_growth_mb < 100
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # another test process beside this one writes to the disk too
        assert abs(shutil.disk_usage("/").free - BASELINE["disk"]) < 64 << 20


def _ours(name: str) -> bool:
    """Whether /tmp's entry ``name`` is a scratch folder of this process's pools: owned by one
    of their slot uids (landlock) or by this user (none), not by another test process's slots."""
    try:
        owner = os.stat(f"/tmp/{name}").st_uid
    except OSError:
        return False
    return owner == os.getuid() or owner in uid_block(os.getpid())
