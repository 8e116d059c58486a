"""Named points where a run can be made to die, for testing crash recovery for real.

``TEMPERING_KILL_AT=<point>:<n>`` makes the process send itself SIGKILL the n-th time it
reaches ``<point>`` (1-based; several comma-separated entries allowed). Points: ``round``
(a sampling round about to start, before its probes of paused domains and its draw),
``sample`` (inside sampling), ``swap`` (in the middle of a round of partial rollouts, as it
takes new weights between two decoding steps), ``learn`` (inside a learner step, after the
gradients, before the optimizer update), ``checkpoint`` (in the middle of writing a
checkpoint). Unset, a point costs one dictionary lookup.

``TEMPERING_STOP_AT`` takes the same entries and sends SIGSTOP instead: the process halts
there until it gets SIGCONT, so that a test can change the world at a known instant of the
run (stop the grader's service before a given round) and the run is reproducible.

SIGKILL cannot be caught, so what survives is exactly what a power cut or an OOM kill
would leave: this is how the resume tests show that no instant of a run is unsafe.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_counts: Counter = Counter()


class TrainingDiverged(RuntimeError):
    """Repeated non-finite steps and nothing to roll back to: the run cannot go on."""


class WorkerLost(RuntimeError):
    """A Ray actor the run needs is gone and cannot be started again (its node stopped, or no
    node left offers its resources): the run stops, to be continued from its last checkpoint."""


def _targets(variable: str) -> set[tuple[str, int]]:
    spec = os.environ.get(variable, "")
    targets = set()
    for entry in filter(None, spec.split(",")):
        name, _, count = entry.partition(":")
        targets.add((name.strip(), int(count or 1)))
    return targets


def point(name: str) -> None:
    """Die (or halt) here if ``TEMPERING_KILL_AT`` (or ``TEMPERING_STOP_AT``) says so."""
    if "TEMPERING_KILL_AT" not in os.environ and "TEMPERING_STOP_AT" not in os.environ:
        return
    _counts[name] += 1
    if (name, _counts[name]) in _targets("TEMPERING_STOP_AT"):
        os.kill(os.getpid(), signal.SIGSTOP)
    if (name, _counts[name]) in _targets("TEMPERING_KILL_AT"):
        os.kill(os.getpid(), signal.SIGKILL)
