"""Children forked ahead of their runs (``namespaces`` mode): each run is served by one, it is
confined exactly as a child forked for the run, and neither the run nor what it leaves can
reach the children still waiting."""

import textwrap
import time

import pytest

from tempering.sandbox import Executor, RunRequest, choose_isolation

# The program's process age: its start time (field 22 of /proc/self/stat, clock ticks since
# boot) against the clock. A child forked ahead of its run is older than the run.
AGE = textwrap.dedent("""\
    import os
    ticks = os.sysconf("SC_CLK_TCK")
    start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / ticks
    print(round(float(open("/proc/uptime").read().split()[0]) - start, 2))
""")

# What confines the process: credentials, capabilities, no_new_privs, seccomp, limits,
# session, working directory, environment and open descriptors.
CONFINEMENT = textwrap.dedent("""\
    import os
    status = [line for line in open("/proc/self/status") if line.split(":")[0] in (
        "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs",
        "Seccomp", "Seccomp_filters")]
    limits = open("/proc/self/limits").read()
    print("".join(status), limits, os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid(),
          os.getcwd(), sorted(os.environ.items()), sorted(os.listdir("/proc/self/fd")),
          os.nice(0), os.listdir("."))
""")


def _namespaces():
    if choose_isolation() != "namespaces":
        pytest.skip("children are forked ahead of their runs in namespaces mode only")


def _age(pool) -> float:
    result = pool.run(RunRequest(AGE))
    assert result.status == "ok", result
    return float(result.stdout)


def test_runs_start_in_children_forked_while_the_slot_was_idle():
    _namespaces()
    with Executor(workers=1, ready=32) as ahead, Executor(workers=1) as on_demand:
        assert (ahead.ready, on_demand.ready) == (32, 0)
        time.sleep(1.0)
        ages = [_age(ahead) for _ in range(5)]
        assert min(ages) > 0.5, ages  # forked before the run came
        assert max(_age(on_demand) for _ in range(5)) < 0.3  # forked for it


def test_a_child_forked_ahead_is_confined_as_one_forked_for_its_run():
    _namespaces()
    with Executor(workers=1, ready=4) as ahead, Executor(workers=1) as on_demand:
        time.sleep(0.5)
        first, second = (pool.run(RunRequest(CONFINEMENT)) for pool in (ahead, on_demand))
        assert first.status == second.status == "ok", (first, second)
        assert "Seccomp:\t2" in first.stdout and "NoNewPrivs:\t1" in first.stdout, first.stdout
        uid = [line for line in first.stdout.splitlines() if line.startswith("Uid:")]
        assert uid and "\t0\t" not in uid[0] + "\t", uid
        assert first.stdout == second.stdout.replace(str(on_demand._slots[0].uid), str(ahead._slots[0].uid))


SIGNAL_EVERY_PID = textwrap.dedent("""\
    import os, signal
    visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    signalled = []
    for pid in range(1, 4096):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
                signalled.append(pid)
            except OSError:
                pass
    print(visible == [os.getpid()], signalled)
""")


def test_the_children_waiting_are_out_of_a_runs_sight_and_reach():
    """A run sees only itself in /proc and can signal none of the slot's other processes
    (the worker, the children waiting for later runs); those children then serve the next
    runs as usual, still forked ahead."""
    _namespaces()
    with Executor(workers=1, ready=8) as pool:
        time.sleep(0.5)
        attack = pool.run(RunRequest(SIGNAL_EVERY_PID))
        assert (attack.status, attack.stdout) == ("ok", "True []\n"), attack
        time.sleep(1.0)
        ages = [_age(pool) for _ in range(8)]
        assert min(ages) > 0.4, ages


def test_what_a_run_leaves_is_killed_before_the_next_run_starts():
    """A run that leaves a process behind (a daemon in its own session, the slot's uid):
    the next run, served by a child that waited meanwhile, can signal no process but itself
    (its uid's processes are out of its sight in /proc: none of them is dumpable)."""
    _namespaces()
    daemon = textwrap.dedent("""\
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(30)
            os._exit(0)
        print("left one")
    """)
    count = textwrap.dedent("""\
        import os
        others = 0
        for pid in range(1, 4096):  # signal 0 reaches exactly the processes of this uid
            try:
                os.kill(pid, 0)
                others += pid != os.getpid()
            except OSError:
                pass
        print(others)
    """)
    with Executor(workers=1, ready=4) as pool:
        time.sleep(0.3)
        for _ in range(3):
            assert pool.run(RunRequest(daemon)).stdout == "left one\n"
            assert pool.run(RunRequest(count)).stdout == "0\n"


def test_programs_of_other_languages_keep_the_children_waiting():
    """A run that executes another program (bash here) is forked for its run as before, and
    what the worker kills after it leaves the waiting children alone."""
    _namespaces()
    with Executor(workers=1, ready=4) as pool:
        time.sleep(0.3)
        for _ in range(3):
            result = pool.run(RunRequest("sleep 30 &\necho started", "bash"))
            assert result.stdout == "started\n", result
        assert _age(pool) > 0.2
