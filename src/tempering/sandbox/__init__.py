"""Isolated, concurrent, reproducible execution of untrusted programs, judged by the parent.

Code rewards are only as honest as the place the model's programs run. This package runs
them in a pool of jailed workers, each of which forks the children for its next runs while
it has nothing to do (``namespaces`` mode), and computes every verdict in the caller's
process, from facts the jail reports (exit status, output, returned values), against
expected values that never enter the jail.

Threat model
============

The programs are hostile: written by a model that is rewarded for passing. With the
default isolation (``namespaces``, as root) the sandbox claims that a program cannot
(``landlock`` mode, below, differs where it says):

1. **escape to the host**: it runs as an unprivileged per-slot uid with no capabilities,
   ``no_new_privs`` set and a seccomp filter that refuses ptrace, mount, unshare/setns,
   namespace flags to clone, bpf, io_uring, kernel modules, keys, System V IPC, reboot and
   clock changes
   (to root too, so this does not rest on the missing capabilities) and kills a program
   that makes a syscall through another architecture's convention (x86-64: x32, i386);
   running a setuid-root binary raises no privilege (``no_new_privs``; the jail's mounts
   are also ``nosuid``) and its PID namespace hides the host's processes.
2. **reach any network**, the host's loopback included: it lives in an empty network
   namespace and may open no socket but ``AF_UNIX``.
3. **read host files or the caller's environment**: its root is a fresh read-only tree
   holding /usr, the Python installation and environment (each at its own path), a few
   /etc files (the loader cache, alternatives, localtime; not passwd or shadow) and
   /dev/{null,zero,full,random,urandom}. Nothing else of the host is mounted: not home
   directories, not the rest of /root, not the working tree. Its environment is a fixed
   list of variables and /proc shows only its own processes (its uid's, in its slot's PID
   namespace): not the worker, nor the children waiting, as root, for runs of their own.
4. **write outside its scratch space**: / is read-only; /tmp is a private tmpfs of
   ``scratch_mb`` MiB, fresh for each job.
5. **exhaust host memory, disk or processes**: each process is capped in address space,
   CPU time, file size, open files and stack, the slot's uid in processes and threads,
   the scratch tmpfs in bytes and inodes, and the output the parent keeps in bytes.
6. **outlive its job**: after every run the worker kills everything the run left, daemons
   and detached sessions included (each becomes the worker's child, PID 1 of the slot's
   namespace, when its parent exits; every process of the slot's uid is killed), and
   reaps them.
7. **affect other jobs**: slots have separate namespaces, uids and scratch; a program can
   neither signal its worker or the children waiting for the slot's next runs (root's,
   and out of sight) nor see another slot's files, and the next job starts clean
   (no System V segment, semaphore or queue, which would outlive a job, can be made).
8. **produce a passing verdict without computing the right outputs**: the parent compares
   stdout or returned values itself; an early ``exit(0)``, a return value whose ``__eq__``
   always agrees, walking the stack or writing fake result messages does not pass a case.
   Returned values cross as plain tagged JSON (:mod:`tempering.sandbox._codec`).

Isolation modes
---------------

``auto`` picks the strongest mode that works here, found by trying: ``namespaces`` as
root when a throwaway child can create the slot namespaces, else ``landlock`` as root
when the kernel has Landlock, else ``bwrap`` when not root; otherwise it refuses and says
why (``none`` is never picked).

``landlock`` is for root without CAP_SYS_ADMIN (Docker's default): no namespace, mount or
tmpfs is possible, so each run's child takes the slot's uid, sets no_new_privs, confines
its file access with Landlock and loads the seccomp filter. The claims above hold there,
with these differences:

1. no PID namespace: /proc is not readable at all (no process list, no command lines),
   but a program can tell whether a host pid exists (``kill(pid, 0)``).
2. no network namespace: the seccomp filter also refuses connect(), sendmsg() and
   sendto() with an address, so unix sockets only join the job's own processes
   (socketpair); host unix sockets, named or abstract, are out of reach.
3. Landlock grants reading and executing only beneath /usr, /bin, /sbin, /lib*, the same
   /etc files and the Python installation, and the five /dev nodes. The existence and
   metadata (``stat``) of other host paths is visible where the directory modes let any
   user walk to them; when the Python installation itself lies under a private directory
   (e.g. /root/.pyenv), in-process Python programs keep CAP_DAC_READ_SEARCH to import from
   it, which makes every host path's existence visible (Landlock still decides what may
   be opened; the capability is gone after any execve).
4. the scratch space is a fresh directory under the host's /tmp, owned by the slot's uid
   and named by TMPDIR, HOME and the working directory (which therefore differs between
   jobs); the rest of /tmp is not writable. With no tmpfs to cap it, the worker measures
   it every 20 ms and stops the job with ``output_limit`` past ``scratch_mb`` or 4096
   entries: a program may overshoot by what it writes in 20 ms.
6. the worker is the subreaper of the job and kills every process of the slot's uid.
7. a program cannot signal its worker or other slots (other uids).

``bwrap`` is for callers that are not root (refused as root): the executor has bubblewrap
make one sandbox per job, with the jail's namespaces (user, mount, PID, network, IPC, UTS),
read-only tree, filter and limits, and starts the job's worker inside as its PID 1. The
claims above hold there, with these differences:

1. no per-slot uid: the program runs as ``nobody`` in its user namespace, which is the
   caller's uid outside. The worker shares that uid, but as the sandbox's PID 1, not
   dumpable and deaf to SIGINT, it can be neither signalled nor read by the program; the
   PID namespace hides the caller's other processes (/proc shows the worker and the job's).
3. /dev also holds bubblewrap's tty, ptmx and pts (a pty instance of the sandbox's own)
   and an empty, read-only shm.
4. the scratch tmpfs is /tmp, or /scratch when the Python environment or the sandbox's own
   folder lies under /tmp (a checkout there, say): bubblewrap would make their mount points
   inside a tmpfs above them, and a job's working directory would list them. It has no inode
   cap: filling it with empty files runs into the time limit instead.
5. the process cap counts every process of the caller's uid, not the job's alone.
6. after every run the worker kills every other process of the job's PID namespace; when it
   exits after the job, the kernel kills whatever the namespace still held.
7. separate jobs have separate sandboxes, each started afresh (slower than a fork: about
   0.3 s a job on a loaded 2-core machine).

Not covered
-----------

- Kernel vulnerabilities: the jail shares the host kernel; seccomp is a deny-list that
  narrows the attack surface, it is not a minimal allow-list.
- Fair CPU sharing: no cgroups are used, so a multi-threaded program can take more than
  its core while it runs; its CPU time is still capped. Memory is capped per process
  (address space) times the process cap, not as one total per job.
- What /usr and the Python environment contain is readable (software, not secrets); so
  are the machine's CPU and memory figures in /proc.
- Cases of one ``call`` test share one process, and runs of one job share its scratch
  directory, like a test file does; separate jobs share nothing.
- ``program`` verdicts (tests that cannot be split into calls) rely on a message from
  inside the sandbox and could be forged; results mark them ``verdict="program"``.
- ``none`` mode (explicit opt-in) isolates nothing beyond rlimits and seccomp and is for
  trusted code only.

Entry points: :class:`Executor` (local pool), :class:`SandboxClient` (the HTTP service,
same methods), :func:`humaneval_spec` (HumanEval problems as test specs), and the
``temper sandbox run|test|serve`` commands in :mod:`tempering.sandbox.cli`.
"""

from tempering.sandbox.client import SandboxClient
from tempering.sandbox.executor import Executor, choose_isolation
from tempering.sandbox.humaneval import humaneval_spec
from tempering.sandbox.languages import LANGUAGES, get_language
from tempering.sandbox.spec import (CallCase, CaseResult, Limits, RunRequest, RunResult,
                                    SandboxUnavailable, SpecError, StdioCase, Tests,
                                    TestResult, TestSpec)

__all__ = [
    "CallCase", "CaseResult", "Executor", "LANGUAGES", "Limits", "RunRequest", "RunResult",
    "SandboxClient", "SandboxUnavailable", "SpecError", "StdioCase", "TestResult", "TestSpec",
    "Tests", "choose_isolation", "get_language", "humaneval_spec",
]
