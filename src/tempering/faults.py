"""Named points where a run can be made to die, for testing crash recovery for real.

``TEMPERING_KILL_AT=<point>:<n>`` makes the process send itself SIGKILL the n-th time it
reaches ``<point>`` (1-based; several comma-separated entries allowed). Points: ``sample``
(inside sampling), ``learn`` (inside a learner step, after the gradients, before the
optimizer update), ``checkpoint`` (in the middle of writing a checkpoint). Unset, a point
costs one dictionary lookup.

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


def _targets() -> dict[str, int]:
    spec = os.environ.get("TEMPERING_KILL_AT", "")
    targets = {}
    for entry in filter(None, spec.split(",")):
        name, _, count = entry.partition(":")
        targets[name.strip()] = int(count or 1)
    return targets


def point(name: str) -> None:
    """Die here if ``TEMPERING_KILL_AT`` says so."""
    if "TEMPERING_KILL_AT" not in os.environ:
        return
    _counts[name] += 1
    if _targets().get(name) == _counts[name]:
        os.kill(os.getpid(), signal.SIGKILL)
