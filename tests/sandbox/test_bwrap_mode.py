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

# The claims whose defence differs in bwrap mode (namespaces, uid, PID 1, scratch tmpfs,
# process cap), with the leak and scratch checks around them. Left to the other modes'
# runs: the seccomp filter's own refusals, limits the kernel applies alike in every mode
# (CPU time, recursion) and verdicts, which the parent computes whatever the mode.
CONTAINMENT = ("(baseline or claim1_no_escape or setuid or claim2 or claim3 or claim4 or claim5 "
               "or claim6 or claim7 or worker_memory or control or nothing_left or scratch) "
               "and not (busy-loop or ignore-sigxcpu or sleep-forever or deep-recursion or unisolated or ready)")


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


def _unprivileged_run_possible():
    """Why the suite cannot run as the unprivileged user here, or None."""
    if os.geteuid() != 0:
        return "runs as root, which can become the unprivileged user"
    if shutil.which("bwrap") is None:
        return "needs bubblewrap: install the 'bubblewrap' package"
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return f"needs the user {USER!r}"
    if not namespaces_work():
        return "needs CAP_SYS_ADMIN to show the unprivileged user its Python in a mount namespace"
    return None


def test_containment_suite_passes_in_bwrap_mode_as_an_unprivileged_user():
    reason = _unprivileged_run_possible()
    if reason:
        pytest.skip(reason)
    needed = ":".join([*_jail.python_paths(), str(ROOT)])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": pwd.getpwnam(USER).pw_dir,
           "LANG": "C.UTF-8", "PYTHONPATH": str(ROOT / "src"), "PYTHONDONTWRITEBYTECODE": "1",
           "OMP_NUM_THREADS": "1", "TEMPERING_SANDBOX_ISOLATION": "bwrap"}
    done = subprocess.run(
        [sys.executable, str(HERE / "as_unprivileged.py"), USER, needed,
         sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", CONTAINMENT,
         str(HERE / "test_adversarial.py"), str(HERE / "test_bwrap_mode.py")],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode == 0 and not re.search(r"\d+ passed", summary):
        pytest.skip(f"bwrap mode could not run as {USER}: {done.stdout[-2000:]}")
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
