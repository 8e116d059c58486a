"""The ``bwrap`` isolation mode, for callers that are not root.

As root (CI runs as root), the containment tests of test_adversarial.py and this file run
again in a subprocess as the unprivileged user ``nobody`` with the isolation forced to
``bwrap`` (``as_unprivileged.py`` makes the Python installation, the environment and the
checkout reachable to it). As that user, a job's scratch folder is checked to hold none of
the folders bubblewrap binds into the jail, wherever they live.
"""

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tempering.sandbox import SandboxUnavailable, _jail, choose_isolation
from tempering.sandbox.executor import namespaces_work

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
USER = "nobody"

# The attacks whose defence differs in bwrap mode: the program shares its caller's uid (its
# signals, ptrace and /proc reach that uid's processes unless the PID namespace and PID 1
# stop them), lives in a user namespace of its own, sees a root bubblewrap assembled, and
# counts towards its caller's process cap; with the leak and scratch checks around them.
# Left to the other modes' runs: refusals that rest on the seccomp filter alone (other
# socket families, io_uring, bpf, privileged calls, SysV IPC), limits the kernel applies
# alike in every mode (memory, CPU, output) and verdicts, which the parent computes.
# test name: the parameters to run (None: the test has no parameter of its own).
BWRAP_CASES = {
    "test_baseline": None,
    "test_claim1_no_escape": ("setuid-root", "ptrace-attach-worker", "unshare-user-namespace",
                              "mount-tmpfs", "chroot", "unshare-binary", "host-processes-hidden"),
    "test_claim1_setuid_binaries_raise_no_privilege": None,
    "test_claim2_no_network": ("tcp-host-loopback",),
    "test_claim2_no_host_unix_sockets": None,
    "test_claim2_unix_sockets_still_work": None,
    "test_claim3_no_host_files_or_environment": ("etc-shadow", "this-test-file", "root-home-hidden",
                                                 "environment", "proc-environ"),
    "test_claim3_host_secret_file": None,
    "test_claim4_no_writes_outside_scratch": ("usr", "root", "etc", "proc-sys", "dev"),
    "test_claim4_host_path_untouched": None,
    "test_claim4_scratch_is_fresh_each_job": None,
    "test_claim5_no_exhaustion": ("fork-bomb", "thread-bomb", "disk-fill"),
    "test_claim6_nothing_outlives_the_job": ("double-fork-setsid", "double-fork-unnamed",
                                             "bash-background", "sigstopped-child"),
    "test_claim7_no_effect_on_other_jobs": ("kill-pid-1", "kill-everything", "kill-host-pid"),
    "test_claim7_worker_ignores_its_jobs_signals": ("SIGINT", "SIGKILL", "SIGSTOP", "SIGTERM"),
    "test_claim7_concurrent_jobs_do_not_share_scratch": None,
    "test_claim7_standard_streams_stay_private_to_their_slot": None,
    "test_claim8_worker_memory_and_descriptors_out_of_reach": None,
    "test_control_stdio_tests_pass_reading_dev_stdin": ("python", "bash"),
    "test_zz_nothing_left_behind": None,
}


def _bwrap_node_ids() -> list:
    """BWRAP_CASES as pytest node ids (the ``forked`` pool: bwrap forks each run's child)."""
    ids = []
    for name, params in BWRAP_CASES.items():
        for param in params or (None,):
            ids.append(f"{HERE / 'test_adversarial.py'}::{name}[forked{'-' + param if param else ''}]")
    return ids + [f"{HERE / 'test_bwrap_mode.py'}::test_scratch_lists_none_of_the_binds_that_live_under_tmp"]


def _bwrap_usable_as_this_user():
    if os.geteuid() == 0:
        pytest.skip("bwrap mode is for users who are not root (as root this file runs itself as "
                    f"{USER}: test_containment_suite_passes_in_bwrap_mode_as_an_unprivileged_user)")
    try:
        choose_isolation("bwrap")
    except SandboxUnavailable as err:
        pytest.skip(str(err))


def test_scratch_lists_none_of_the_binds_that_live_under_tmp():
    """The worker's folder (bound into the jail) under /tmp, as in a checkout there: a job's
    working directory is still empty, and is its HOME and TMPDIR."""
    _bwrap_usable_as_this_user()
    job = textwrap.dedent("""\
        import json, sys
        from tempering.sandbox import Executor, RunRequest, executor
        show = "import json, os\\nprint(json.dumps([os.listdir('.'), os.getcwd(), os.environ['HOME'], os.environ['TMPDIR']]))"
        with Executor(workers=1, isolation="bwrap") as pool:
            result = pool.run(RunRequest(show))
        print(json.dumps([executor.ZYGOTE, result.status, result.stdout, result.stderr]))
    """)
    with tempfile.TemporaryDirectory(dir="/tmp") as checkout:
        shutil.copytree(ROOT / "src" / "tempering", Path(checkout, "src", "tempering"))
        done = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=120,
                              cwd="/", env=dict(os.environ, PYTHONPATH=f"{checkout}/src"))
    assert done.returncode == 0, done.stderr
    worker, status, stdout, stderr = json.loads(done.stdout)
    assert worker.startswith(checkout + "/") and status == "ok", (worker, status, stderr)
    listing, cwd, home, tmpdir = json.loads(stdout)
    assert listing == [] and cwd == home == tmpdir, (listing, cwd, home, tmpdir)


def _unprivileged_run_possible(needed) -> str:
    """Why the suite cannot run as the unprivileged user here, or an empty string."""
    if os.geteuid() != 0:
        return "runs as root, which can become the unprivileged user"
    if shutil.which("bwrap") is None:
        return "needs bubblewrap: install the 'bubblewrap' package (.ci/run does, as root)"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"needs the user {USER!r}"
    if not namespaces_work():
        return f"needs CAP_SYS_ADMIN, to show {USER} its Python and checkout in a mount namespace"
    closed = [path for path in needed if os.stat(path).st_mode & 0o005 != 0o005]
    if closed:
        return f"{USER} may not list {', '.join(closed)} (their mode lacks o+rx)"
    return ""


def test_containment_suite_passes_in_bwrap_mode_as_an_unprivileged_user():
    needed = [*_jail.python_paths(), str(ROOT)]
    reason = _unprivileged_run_possible(needed)
    if reason:
        pytest.skip(reason)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": pwd.getpwnam(USER).pw_dir,
           "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT / "src"), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "TEMPERING_SANDBOX_ISOLATION": "bwrap"}
    # The project's addopts are left out: the cases are named, and they run in this process's time.
    done = subprocess.run(
        [sys.executable, str(HERE / "as_unprivileged.py"), USER, ":".join(needed), sys.executable,
         "-m", "pytest", "-q", "-ra", "-o", "addopts=", "-p", "no:cacheprovider", *_bwrap_node_ids()],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode == 0 and not re.search(r"\d+ passed", summary):
        pytest.skip(f"bwrap mode could not run as {USER}: {done.stdout[-2000:]}")
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
