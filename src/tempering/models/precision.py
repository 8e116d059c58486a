"""``precision``: float32 or bfloat16 autocast for the learner and the sampler, chosen for the
CPU at hand.

Machines of one kind differ: on a CPU with native bf16 (Intel's AMX, AVX512-BF16) a
one-thread bf16 product at SmolLM2's shapes measured 6-11x the float32 one, while on a CPU
without those instructions bf16 is emulated and several times slower than float32. A fixed
default is wrong on one of them. ``precision: auto`` decides per run:

- on a GPU, bf16 where torch says the device computes it;
- on a CPU whose ``/proc/cpuinfo`` lacks the bf16 flags (or cannot be read), float32, with
  nothing measured;
- on a CPU with them, one forward and backward pass of the model itself is timed on one
  thread in float32 and under bf16 autocast, and bf16 is taken when it is at least
  :data:`MIN_SPEEDUP` times faster. The products alone are no guide: on an AMD EPYC with
  AVX512-BF16 they ran 2.1-2.4x as fast in bf16 at SmolLM2's shapes while SmolLM2's whole
  pass ran 1.0-1.5x (the rest of the pass gains nothing and pays for the casts). The
  measurement is kept in the cache (``precision.json``), one entry per CPU model name and
  model shape, so a machine measures a model once.

Taking bf16 turns on ``pipeline.mismatch_correction: tis`` when it was ``none``: the sampler
and the learner then compute in bf16 through different kernels (the sampler's decoder, the
learner's full forward), and their log-probs of the same tokens differ more than in float32.
``fp32`` and ``bf16`` set both sides without measuring; unset, ``learner.bf16`` and
``rollout.bf16`` stay as configured.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tempering.models.device import _read_cpuinfo, cpu_bf16, slow_bf16

MIN_SPEEDUP = 1.5
"""How much faster bf16 autocast must run the model's products than float32 for ``auto`` to take
it: below that the speed is not worth its rounding."""

MIN_ONEDNN_SPEEDUP = 1.2
"""How much faster oneDNN's float32 products must run a decoding step than MKL's for ``auto`` to
take them: they round differently from the learner's (MKL's), which doubles the learner/sampler
mismatch, so a small gain is not worth it."""

PROBE_TOKENS = 256
"""Tokens of the timed passes (fewer where the model's context is shorter)."""


@dataclass(frozen=True)
class Choice:
    """What a run computes in: ``bf16`` for both learner and sampler or not, and why."""

    bf16: bool
    reason: str
    measured: Optional[dict[str, float]] = field(default=None)
    onednn: Optional[bool] = None
    """The built-in sampler's float32 products by oneDNN or not (``rollout.onednn``), where
    ``auto`` chose them too (:func:`choose_products`); None: ``rollout.onednn`` as configured."""
    products: Optional[dict[str, float]] = None
    """The products' seconds that choice was made from."""

    def describe(self) -> str:
        text = f"{'bf16 autocast' if self.bf16 else 'float32'} ({self.reason})"
        if self.onednn is not None and self.products:
            speedup = self.products["mkl_s"] / self.products["onednn_s"]
            text += (f"; sampler products by {'oneDNN' if self.onednn else 'MKL'} (a decoding step's ran "
                     f"{speedup:.2f}x as fast by oneDNN as by MKL, {'at least' if self.onednn else 'under'} "
                     f"{MIN_ONEDNN_SPEEDUP}x)")
        return text


def cpu_model_name(cpuinfo: Optional[str]) -> str:
    """The ``model name`` line of ``/proc/cpuinfo``'s text (``lscpu``'s Model name), or the
    architecture when there is none.

    >>> cpu_model_name("processor\\t: 0\\nmodel name\\t: AMD EPYC 7B13\\n")
    'AMD EPYC 7B13'
    """
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "model name" and value.strip():
            return value.strip()
    return platform.machine() or "unknown CPU"


def model_key(model_config: Any) -> str:
    """What the speed of a model's pass depends on besides the CPU: its type and widths."""
    def get(*names: str) -> int:
        return next((int(getattr(model_config, n)) for n in names if getattr(model_config, n, None)), 0)

    return (f"{getattr(model_config, 'model_type', 'model')} hidden {get('hidden_size', 'n_embd')} "
            f"mlp {get('intermediate_size', 'n_inner')} layers {get('num_hidden_layers', 'n_layer')} "
            f"vocab {get('vocab_size')}")


def time_passes(model: Any, tokens: int = PROBE_TOKENS, repeats: int = 3) -> dict[str, float]:
    """Seconds of one forward and backward pass of ``model`` over a row of ``tokens`` ids (at
    most its context), on one thread, in float32 and under bf16 autocast: the best of
    ``repeats`` after one untimed pass each. Nothing of the run changes: the weights and their
    gradients are as before, torch's random state too, and the caller's thread count."""
    context = getattr(model.config, "max_position_embeddings", 0) or tokens
    device = next(model.parameters()).device
    ids = torch.randint(3, model.config.vocab_size, (1, max(2, min(tokens, context))),
                        generator=torch.Generator().manual_seed(0)).to(device)
    grads = {name: p.grad for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)  # the passes' gradients must not add into the run's
    training, threads = model.training, torch.get_num_threads()

    def one_pass(bf16: bool) -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            start = time.perf_counter()
            model(input_ids=ids).logits.float().mean().backward()
            seconds = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        return seconds

    torch.set_num_threads(1)
    model.eval()  # no dropout, so no random draws
    try:
        with torch.random.fork_rng(devices=[]):
            seconds = {}
            for name, bf16 in (("fp32_s", False), ("bf16_s", True)):
                one_pass(bf16)
                seconds[name] = min(one_pass(bf16) for _ in range(repeats))
            return seconds
    finally:
        torch.set_num_threads(threads)
        model.train(training)
        for name, p in model.named_parameters():
            p.grad = grads[name]


def _cached(path: Path, key: str, fields: tuple[str, ...] = ("fp32_s", "bf16_s")) -> Optional[dict[str, float]]:
    try:
        entry = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and entry[k] > 0 for k in fields):
        return {k: float(entry[k]) for k in fields}
    return None


def _remember(path: Path, key: str, measured: dict[str, float]) -> None:
    """Add ``key`` to the cache file, written whole and renamed into place; a cache that cannot
    be written only costs a measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            entries = {}
        entries = entries if isinstance(entries, dict) else {}
        entries[key] = measured
        handle, partial = tempfile.mkstemp(prefix=".precision-", dir=path.parent)
        with os.fdopen(handle, "w") as out:
            json.dump(entries, out, indent=1, sort_keys=True)
        os.replace(partial, path)
    except OSError:
        pass


def choose(setting: str, device: torch.device, model: Any = None, cache: Optional[Path] = None,
           cpuinfo: Optional[str] = None, machine: Optional[str] = None,
           measure: Callable[[Any], dict[str, float]] = time_passes) -> Choice:
    """The precision ``setting`` (``fp32``, ``bf16`` or ``auto``) means for ``model`` on
    ``device``. ``cache`` is the measurements' file (None: measure every time); ``cpuinfo``
    and ``machine`` default to this machine's; ``measure(model)`` times the passes."""
    if setting == "fp32":
        return Choice(False, "precision=fp32")
    if setting == "bf16":
        return Choice(True, "precision=bf16")
    if setting != "auto":
        raise ValueError(f"precision must be fp32, bf16 or auto, got {setting!r}")
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
        return Choice(native, "precision=auto: this GPU computes bf16" if native
                      else "precision=auto: this GPU has no bf16")
    if device.type != "cpu":
        return Choice(False, f"precision=auto: float32 on {device.type}")
    cpuinfo = _read_cpuinfo() if cpuinfo is None else cpuinfo
    machine = platform.machine() if machine is None else machine
    name = cpu_model_name(cpuinfo)
    if not cpu_bf16(cpuinfo, machine):
        return Choice(False, f"precision=auto: {name} has no bf16 instructions, bf16 would be emulated")
    key = f"{name} | {model_key(model.config)}"
    measured = _cached(cache, key) if cache is not None else None
    if measured is None:
        measured = measure(model)
        if cache is not None:
            _remember(cache, key, measured)
    speedup = measured["fp32_s"] / measured["bf16_s"]
    verdict = "at least" if speedup >= MIN_SPEEDUP else "under"
    return Choice(speedup >= MIN_SPEEDUP, f"precision=auto: on {name} a pass of this model ran {speedup:.2f}x as "
                  f"fast under bf16 autocast as in float32, {verdict} {MIN_SPEEDUP}x", measured)


def choose_products(choice: Choice, model: Any, measure: Callable[[Any], dict[str, float]],
                    cache: Optional[Path] = None, cpuinfo: Optional[str] = None) -> Choice:
    """``choice`` with the built-in sampler's float32 products chosen too: oneDNN's when
    ``measure(model)`` (seconds of a decoding step's products, ``mkl_s`` and ``onednn_s``:
    ``tempering.rollout.fast_llama.time_products``) finds them at least
    :data:`MIN_ONEDNN_SPEEDUP` times faster than MKL's, measured once per CPU model and model
    shape and kept in ``cache``. Under bf16 the products are bf16 ones and nothing is chosen."""
    if choice.bf16:
        return choice
    key = f"products | {cpu_model_name(_read_cpuinfo() if cpuinfo is None else cpuinfo)} | {model_key(model.config)}"
    measured = _cached(cache, key, ("mkl_s", "onednn_s")) if cache is not None else None
    if measured is None:
        measured = measure(model)
        if cache is not None:
            _remember(cache, key, measured)
    return replace(choice, onednn=measured["mkl_s"] / measured["onednn_s"] >= MIN_ONEDNN_SPEEDUP, products=measured)


def apply(config: Any, choice: Choice) -> Any:
    """A copy of the run's config with ``learner.bf16`` and ``rollout.bf16`` (and
    ``rollout.onednn`` where the choice made it) as ``choice`` says,
    and ``pipeline.mismatch_correction: tis`` when bf16 is taken and no correction was set."""
    learner = config.learner.model_copy(update={"bf16": choice.bf16})
    sampler = {"bf16": choice.bf16} if choice.onednn is None else {"bf16": choice.bf16, "onednn": choice.onednn}
    rollout = config.rollout.model_copy(update=sampler)
    pipeline = config.pipeline
    if choice.bf16 and pipeline.mismatch_correction == "none":
        pipeline = pipeline.model_copy(update={"mismatch_correction": "tis"})
    return config.model_copy(update={"learner": learner, "rollout": rollout, "pipeline": pipeline})


def emulated(device: torch.device, choice: Choice, cpuinfo: Optional[str] = None,
             machine: Optional[str] = None) -> Optional[str]:
    """Why bf16, when ``choice`` takes it, is emulated here (``precision=bf16`` on a CPU without
    bf16 instructions), or None."""
    if not choice.bf16:
        return None
    reason = slow_bf16(device, ["learner.bf16", "rollout.bf16"], cpuinfo, machine)
    if reason is None:
        return None
    return reason.partition(": bf16 is emulated")[0].replace("learner.bf16 and rollout.bf16 set", "precision=bf16") \
        + ": bf16 is emulated, several times slower than float32; set precision=auto (float32 here) or fp32"
