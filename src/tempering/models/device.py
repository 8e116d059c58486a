"""Where the policy runs (``model.device``), and whether bf16 autocast is fast there.

The learner and the sampler follow the device of the policy's parameters (batches, caches
and every tensor they make go there), so choosing a device is moving the model: the
reference model and the critic are copies of it and go with it.

bf16 autocast on a CPU without bf16 instructions is emulated: a SmolLM2-135M learner step
took 433 s instead of 45 s in float32, with nothing said. :func:`slow_bf16` recognises that
case from the CPU's flags, and :func:`warn_slow_bf16` says so at start-up. torch's kernel
level (``torch.backends.cpu.get_cpu_capability()``) is reported but does not decide: AVX512
is the level of CPUs with and without bf16 instructions alike (Skylake has none).
"""

from __future__ import annotations

import platform
import warnings
from pathlib import Path
from typing import Optional

import torch

from tempering.config import ConfigError

_X86_BF16 = ("avx512_bf16", "amx_bf16")
BF16_FLAGS = {"x86_64": _X86_BF16, "amd64": _X86_BF16, "i686": _X86_BF16, "aarch64": ("bf16",), "arm64": ("bf16",)}
"""Per architecture (``platform.machine()``, lower case), the ``/proc/cpuinfo`` flags of
CPUs that compute bf16 natively, any one of them."""


def resolve_device(name: str) -> torch.device:
    """The device ``model.device`` names: ``auto`` is CUDA when torch sees a GPU, else CPU; a
    GPU that torch does not see is a :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"model.device={name}: torch sees no CUDA device here (a CPU-only torch build, "
                              "no driver, or CUDA_VISIBLE_DEVICES empty); set model.device=cpu or auto")
        if (device.index or 0) >= count:
            raise ConfigError(f"model.device={name}: torch sees {count} CUDA device(s), cuda:0 to "
                              f"cuda:{count - 1}; choose one of them")
    return device


def cpu_bf16(cpuinfo: Optional[str], machine: str) -> Optional[bool]:
    """Whether the CPU described by ``cpuinfo`` (the text of ``/proc/cpuinfo``) computes bf16
    natively, or None when that cannot be told (no cpuinfo, another architecture).

    >>> cpu_bf16("flags\\t\\t: fpu avx512f avx512_bf16 amx_tile\\n", "x86_64")
    True
    >>> cpu_bf16("flags\\t\\t: fpu avx2 avx512f\\n", "x86_64")
    False
    >>> cpu_bf16("Features\\t: fp asimd bf16 i8mm\\n", "aarch64")
    True
    >>> cpu_bf16(None, "arm64") is None
    True
    """
    wanted = BF16_FLAGS.get(machine.lower())
    if cpuinfo is None or wanted is None:
        return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return any(flag in flags for flag in wanted)


def _read_cpuinfo() -> Optional[str]:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def slow_bf16(device: torch.device, keys: list[str], cpuinfo: Optional[str] = None,
              machine: Optional[str] = None, capability: Optional[str] = None) -> Optional[str]:
    """Why bf16 autocast, switched on by the config ``keys``, would be slow on ``device``, or
    None when it is not (a GPU, no key set, a CPU with bf16 instructions, or one whose flags
    cannot be read). ``cpuinfo``, ``machine`` and ``capability`` default to this machine's."""
    if not keys or device.type != "cpu":
        return None
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    machine = platform.machine() if machine is None else machine
    if cpu_bf16(cpuinfo, machine) is not False:
        return None
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    wanted = " or ".join(BF16_FLAGS[machine.lower()])
    return (f"{' and '.join(keys)} set, but this CPU ({machine}, torch kernels {capability}) has no bf16 "
            f"instructions ({wanted} in /proc/cpuinfo): bf16 is emulated, several times slower than float32 "
            f"(a SmolLM2-135M learner step: 433 s against 45 s); set {'=false '.join(keys)}=false")


def warn_slow_bf16(device: torch.device, rollout_bf16: bool, learner_bf16: bool) -> None:
    """Warn at start-up when the configured bf16 autocast would be emulated (:func:`slow_bf16`)."""
    keys = [key for key, on in (("rollout.bf16", rollout_bf16), ("learner.bf16", learner_bf16)) if on]
    reason = slow_bf16(device, keys)
    if reason is not None:
        warnings.warn(reason, stacklevel=2)
