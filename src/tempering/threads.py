"""How many CPU threads torch uses: the cores that are free now, not all the cores there are.

Why: torch's OpenMP threads wait for each other at the end of every parallel operation, and
by default they wait by spinning. When another process holds one of the cores, the thread
placed there is descheduled while its partner spins for it, and small operations run many
times slower than on one thread (measured on 2 cores beside one busy process: a pre-training
step went from 0.25 s to 38-65 s). Two things prevent that, both applied by ``temper``:

- ``threads: 0`` (auto) counts the cores left idle by other processes, and re-counts every
  few steps while the run goes on (:class:`ThreadGovernor`), since load comes and goes;
- :func:`passive_waits` makes OpenMP threads sleep instead of spin when they wait, which
  keeps a thread that lands on a busy core from wasting its partner's core. OpenMP reads this
  once when torch is imported, so it is set in the environment before that import.

How cores are counted: two readings of ``/proc/stat`` give each allowed core's idle share
over the window between them; CPU time this process used in that window counts as free too
(it is the run's own work), so the same count works before the run starts (a short sleep)
and while it runs (the steps between re-counts are the window, at no extra cost).

Not done: CPU quotas of a cgroup (``cpu.max``) are not read; hyperthread siblings count as
cores; the run's own child processes (sandbox programs, grading processes, Ray actors) count
as other load, so a run that grades in a sandbox may be given fewer threads than it could use; without ``/proc/stat`` (not Linux) auto means every allowed core. A changed thread
count changes float summation order only, so results stay within rounding of each other,
but a run is bitwise repeatable only with a fixed ``threads``. In an async run a re-count
changes the learner's threads; the sampler thread keeps the count it started with.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Optional

PASSIVE_WAITS = {"OMP_WAIT_POLICY": "PASSIVE"}
"""OpenMP settings applied before torch is imported: waiting threads sleep rather than spin."""

SLACK = 0.3
"""A core counts towards the thread count when at least 1 - SLACK of it is free."""

WINDOW_S = 0.2
"""Seconds between the two readings when choosing threads at start-up."""

RECOUNT_EVERY = 5
"""Steps between re-counts in auto mode."""


@dataclass(frozen=True)
class CpuSample:
    """One reading: per core ``(idle, total)`` jiffies, and this process's CPU seconds."""

    cores: dict[int, tuple[int, int]]
    own_s: float
    wall_s: float


def passive_waits() -> None:
    """Ask OpenMP to sleep while waiting; has effect only before torch is first imported.

    Values the user set already are kept.
    """
    for key, value in PASSIVE_WAITS.items():
        os.environ.setdefault(key, value)


def set_torch_threads(count: int) -> None:
    """Imports torch here rather than at the top: importing this module must not load
    OpenMP, so that the CLI can still apply :func:`passive_waits` after importing it."""
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


def parse_stat(text: str) -> dict[int, tuple[int, int]]:
    """Per-core ``(idle, total)`` jiffies from the text of ``/proc/stat``.

    Idle includes iowait; total is user through steal (guest time is already in user).

    >>> parse_stat("cpu  9 0 9 9 0 0 0 0 0 0\\ncpu0 4 0 1 95 2 0 0 0 0 0\\nintr 1\\n")
    {0: (97, 102)}
    """
    cores = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(f) for f in fields[:8]]
            cores[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return cores


def sample() -> Optional[CpuSample]:
    """Read ``/proc/stat`` now; None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
    except OSError:
        return None
    return CpuSample(parse_stat(text), time.process_time(), time.monotonic())


def allowed_cpus() -> set[int]:
    """The cores this process may run on."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def free_cores(before: CpuSample, after: CpuSample, cpus: set[int]) -> float:
    """Cores of ``cpus`` not used by other processes between two readings.

    Each core adds its idle share; this process's own CPU time adds the cores it kept busy.
    """
    idle = 0.0
    for cpu in cpus & before.cores.keys() & after.cores.keys():
        idle_0, total_0 = before.cores[cpu]
        idle_1, total_1 = after.cores[cpu]
        if total_1 > total_0:
            idle += (idle_1 - idle_0) / (total_1 - total_0)
    wall = after.wall_s - before.wall_s
    own = (after.own_s - before.own_s) / wall if wall > 0 else 0.0
    return min(float(len(cpus)), idle + own)


def threads_for(free: float, allowed: int, share: int = 1) -> int:
    """Threads for ``free`` cores out of ``allowed``, split between ``share`` users; at least 1.

    >>> threads_for(1.05, 2), threads_for(1.8, 2), threads_for(3.9, 4, share=2)
    (1, 2, 2)
    """
    return max(1, min(allowed, math.floor(free + SLACK)) // share)


def auto_threads(share: int = 1, window_s: float = WINDOW_S) -> int:
    """Threads for the cores free now (sleeps ``window_s`` to see them), split ``share`` ways."""
    cpus = allowed_cpus()
    before = sample()
    if before is None:
        return max(1, len(cpus) // share)
    time.sleep(window_s)
    return threads_for(free_cores(before, sample(), cpus), len(cpus), share)


class ThreadGovernor:
    """Sets torch's threads for a run and, in auto mode, re-counts free cores as it goes.

    ``threads``: the config's value (0 = auto). ``share``: users of the cores in this process
    (2 when a sampler and a learner run side by side). Call :meth:`update` once per step.
    """

    def __init__(self, threads: int, share: int = 1, every: int = RECOUNT_EVERY):
        self.auto, self.share, self.every = threads == 0, share, every
        self.threads = threads or auto_threads(share)
        set_torch_threads(self.threads)
        self._cpus, self._last, self._calls = allowed_cpus(), sample(), 0

    def update(self) -> dict:
        """Every ``every`` calls in auto mode: re-count over the steps since the last count,
        and change torch's threads if the count moved. Returns ``{"threads": n}`` in auto
        mode (for the step's record), ``{}`` with a fixed count."""
        if not self.auto:
            return {}
        self._calls += 1
        if self._calls % self.every == 0 and self._last is not None:
            now = sample()
            free = free_cores(self._last, now, self._cpus)
            self._last, self.threads = now, threads_for(free, len(self._cpus), self.share)
            set_torch_threads(self.threads)
        return {"threads": self.threads}
