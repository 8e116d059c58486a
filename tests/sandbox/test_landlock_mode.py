"""The ``landlock`` isolation mode, as root without CAP_SYS_ADMIN (a default Docker container).

The capability-dropped runs happen in subprocesses started by ``without_cap_sys_admin.py``:
``auto`` must pick the mode, ``temper sandbox run`` must work in it, and the whole
adversarial suite must pass in it. Choosing a mode where none is safe is a clear refusal.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.sandbox import SandboxUnavailable, choose_isolation, cli, executor
from tempering.sandbox import _landlock

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _has_cap_sys_admin() -> bool:
    with open("/proc/self/status") as handle:
        effective = next(line for line in handle if line.startswith("CapEff:"))
    return bool(int(effective.split()[1], 16) >> 21 & 1)


needs_droppable_root = pytest.mark.skipif(
    os.geteuid() != 0 or not _has_cap_sys_admin() or _landlock.abi_version() < 1,
    reason="needs root with CAP_SYS_ADMIN to drop, and a kernel with Landlock")


def without_cap_sys_admin(*command, timeout=600, **env):
    return subprocess.run([sys.executable, str(HERE / "without_cap_sys_admin.py"), *command],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), **env))


@needs_droppable_root
def test_auto_picks_landlock_without_cap_sys_admin():
    done = without_cap_sys_admin(sys.executable, "-c", "import sys; from tempering.sandbox import "
                                 "choose_isolation as c; print(c(), c('landlock'), file=sys.stderr); c('namespaces')")
    assert "landlock landlock" in done.stderr, done.stderr
    assert done.returncode == 1 and "isolation 'namespaces' cannot create namespaces here" in done.stderr


@needs_droppable_root
def test_cli_run_works_without_cap_sys_admin(tmp_path):
    program = tmp_path / "p.py"
    program.write_text("import json, os\nprint(os.getuid() >= 1_000_000, json.dumps([1]))")
    done = without_cap_sys_admin(sys.executable, "-m", "tempering.sandbox.cli", "sandbox", "run",
                                 str(program), "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["stdout"]) == ("ok", "True [1]\n"), out


@needs_droppable_root
def test_adversarial_suite_passes_without_cap_sys_admin():
    """Every threat-model claim, attacked as in test_adversarial.py, in landlock mode."""
    done = without_cap_sys_admin(sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                                 str(HERE / "test_adversarial.py"), TEMPERING_SANDBOX_ISOLATION="landlock")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def _nothing_works(monkeypatch, root: bool):
    monkeypatch.setattr(executor.os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(executor, "namespaces_work", lambda: False)
    monkeypatch.setattr(executor._landlock, "abi_version", lambda: 0)
    monkeypatch.setattr(executor.shutil, "which", lambda name: None)


@pytest.mark.parametrize("root", [True, False])
def test_refuses_with_every_reason_when_nothing_is_safe(monkeypatch, root):
    _nothing_works(monkeypatch, root)
    with pytest.raises(SandboxUnavailable) as refusal:
        choose_isolation("auto")
    reasons = ("CAP_SYS_ADMIN", "Landlock") if root else ("bubblewrap",)
    assert all(reason in str(refusal.value) for reason in reasons), refusal.value
    assert "--isolation none" in str(refusal.value)


def test_cli_refusal_is_one_message(monkeypatch, capsys, tmp_path):
    _nothing_works(monkeypatch, root=True)
    program = tmp_path / "p.py"
    program.write_text("print(1)")
    assert cli.main(["sandbox", "run", str(program)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("temper sandbox run: cannot isolate programs here") and "Traceback" not in err
