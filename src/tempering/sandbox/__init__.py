"""Isolated, concurrent, reproducible execution of untrusted programs, judged by the parent.

Code rewards are only as honest as the place the model's programs run. This package runs
them in a pool of pre-forked, jailed workers and computes every verdict in the caller's
process, from facts the jail reports (exit status, output, returned values), against
expected values that never enter the jail.

Threat model
============

The programs are hostile: written by a model that is rewarded for passing. With the
default isolation (``namespaces``, as root) the sandbox claims that a program cannot:

1. **escape to the host**: it runs as an unprivileged per-slot uid with no capabilities,
   ``no_new_privs`` set and a seccomp filter that refuses ptrace, mount, unshare/setns,
   namespace flags to clone, bpf, io_uring, kernel modules, keys, reboot and clock changes;
   setuid files do not raise privilege (``nosuid``) and its PID namespace hides the host's
   processes.
2. **reach any network**, the host's loopback included: it lives in an empty network
   namespace and may open no socket but ``AF_UNIX``.
3. **read host files or the caller's environment**: its root is a fresh read-only tree
   holding /usr, the Python installation and environment (each at its own path), a few
   /etc files (the loader cache, alternatives, localtime; not passwd or shadow) and
   /dev/{null,zero,full,random,urandom}. Nothing else of the host is mounted: not home
   directories, not the rest of /root, not the working tree. Its environment is a fixed
   list of variables and /proc shows only its own slot's processes.
4. **write outside its scratch space**: / is read-only; /tmp is a private tmpfs of
   ``scratch_mb`` MiB, fresh for each job.
5. **exhaust host memory, disk or processes**: each process is capped in address space,
   CPU time, file size, open files and stack, the slot's uid in processes and threads,
   the scratch tmpfs in bytes and inodes, and the output the parent keeps in bytes.
6. **outlive its job**: after every run the worker kills everything left in the slot's
   PID namespace, daemons and detached sessions included, and reaps them.
7. **affect other jobs**: slots have separate namespaces, uids and scratch; a program can
   neither signal its worker nor see another slot's files, and the next job starts clean.
8. **produce a passing verdict without computing the right outputs**: the parent compares
   stdout or returned values itself; an early ``exit(0)``, a return value whose ``__eq__``
   always agrees, walking the stack or writing fake result messages does not pass a case.
   Returned values cross as plain tagged JSON (:mod:`tempering.sandbox._codec`).

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
- ``bwrap`` mode (for callers that are not root; refused as root) starts one bubblewrap
  sandbox per job: slower, no per-slot uid (the process cap is per user), and no inode
  cap on the scratch tmpfs (filling it with empty files runs into the time limit
  instead). ``none`` mode (explicit opt-in) isolates nothing beyond rlimits and seccomp
  and is for trusted code only.

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
