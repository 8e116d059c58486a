"""The Python API behind ``from tempering import ...``: the commands as functions.

Each function does what its command does, from the same config: :func:`train` is ``temper
train``, :func:`evaluate` is ``temper eval``, :func:`load_model` loads what ``model.path``
names, :func:`run_code` is ``temper sandbox run``. A config is given as a
:class:`~tempering.config.TrainConfig`, a dict of its keys, a YAML file or a shipped config's
name (``quickstart``), with ``key=value`` overrides as on the command line; a bad one raises
:class:`~tempering.config.ConfigError` naming the key, as the command would print it.

Plug-ins registered with the ``register_*`` decorators live in the process that registered
them: a run in this process sees them, Ray workers in other processes do not (name those
``module:function`` in the config instead, which any process can import).

Not here: ``temper serve`` and ``temper report`` (use the commands).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from tempering.config import ConfigError, PretrainConfig, TrainConfig, apply_override, validate_config
from tempering.config import load_config as load_config_file
from tempering.threads import passive_waits

passive_waits()  # before torch is imported (by the functions below): see tempering.threads

ConfigSource = Union[TrainConfig, Mapping[str, Any], str, Path, None]
"""A config: the object, a dict of its keys, a YAML path or shipped name; None = the quickstart."""


def load_config(source: ConfigSource = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """The config ``source`` stands for, with ``key=value`` ``overrides`` applied (values read as YAML).

    Examples:
        >>> load_config({"steps": 5}, ["rollout.group_size=4"]).rollout.group_size
        4
    """
    if source is None or isinstance(source, (str, Path)):
        return load_config_file(source, list(overrides))
    data = source.model_dump(mode="json") if isinstance(source, TrainConfig) else copy.deepcopy(dict(source))
    for assignment in overrides:
        apply_override(data, assignment)
    return validate_config(data)


def train(config: ConfigSource = None, overrides: Sequence[str] = (), *, run_dir: Optional[str] = None,
          progress: bool = False, resume: bool = False) -> dict:
    """Train as ``temper train`` does; return the run's summary (also in ``summary.json``).

    The summary holds ``eval_before`` and ``eval_after`` (accuracy per task), ``steps``,
    ``wall_s``, ``checkpoint`` (the final model's folder, loadable by :func:`load_model` or
    ``AutoModelForCausalLM.from_pretrained``) and the rollout counters. ``run_dir`` sets the
    output folder (default: a new one under ``runs/``); ``resume`` continues the run in it (a
    ConfigError when it holds none, as ``temper train --resume`` refuses).
    """
    from tempering.train import train as run

    settings = load_config(config, overrides)
    if run_dir is not None:
        settings = settings.model_copy(update={"run_dir": str(run_dir)})
    if resume and not (settings.run_dir and (Path(settings.run_dir) / "config.yaml").is_file()):
        raise ConfigError(f"resume=True: run_dir={settings.run_dir} is not a run folder (no config.yaml in it); "
                          "pass run_dir, the folder of the run to continue, or drop resume to start one")
    return run(settings, progress=progress, resume=resume)


def _with_tasks(config: TrainConfig, tasks: Optional[Sequence[Union[str, Mapping[str, Any]]]]) -> TrainConfig:
    if tasks is None:
        return config
    if not tasks:
        raise ConfigError("tasks: name at least one task, e.g. tasks=['add']")
    entries = [{"name": t} if isinstance(t, str) else dict(t) for t in tasks]
    return validate_config({**config.model_dump(mode="json"), "tasks": entries})  # a bad entry: a ConfigError


def evaluate(model: Optional[str] = None, config: ConfigSource = None, overrides: Sequence[str] = (), *,
             tasks: Optional[Sequence[Union[str, Mapping[str, Any]]]] = None, samples: Optional[int] = None,
             k: Sequence[int] = (), best_of: Sequence[str] = (), progress: bool = False) -> dict:
    """Evaluate as ``temper eval`` does: greedy accuracy on each task's held-out problems, and
    with ``samples`` (n per problem) pass@k and maj@k for each ``k`` (default 1 and n).

    ``model`` is anything ``model.path`` takes (default: the config's); ``tasks`` replaces the
    config's tasks, as names (``["add", "rg:leg_counting"]``) or task entries (``{"name":
    "dataset", "options": {...}}``). ``best_of`` adds best-of-k for each k: ``"verifier"`` (the
    sample the task's own grader scores best, an oracle) and ``"rm:PATH"`` (the sample a reward
    model scores best, as ``temper rm train`` saves one) and ``"prm:PATH"`` (a process reward
    model, as ``temper prm train`` saves one), as ``best_of@k[verifier]``, ``best_of@k[rm]`` and
    ``best_of@k[prm]``. A task run in an environment also gets ``greedy[round<=r]`` and
    ``pass@k[round<=r]`` for r up to its ``max_turns``.

    Returns the dict ``temper eval --json`` writes: ``accuracy``, ``per_task``, ``metrics``
    (task -> metric -> ``value``, ``ci``, ``problems``), ``samples``, ``notes``, ``model``,
    ``settings``, ...; e.g. ``evaluate("runs/x", tasks=["add"], samples=8, k=[1, 8],
    best_of=["verifier", "rm:runs/rm"])["metrics"]["add"]["best_of@8[rm]"]["value"]``.
    """
    from tempering.eval_model import parse_best_of, run_evaluation, sampled_settings

    settings = _with_tasks(load_config(config, overrides), tasks)
    chosen = parse_best_of(list(best_of), "best_of")
    if samples is None:
        if k or best_of:
            raise ConfigError("k and best_of need samples, the number of samples per problem")
        return run_evaluation(settings, model, None, chosen, progress)
    ks = tuple(sorted(set(k) or {1, samples}))
    if samples < 1 or ks[0] < 1 or ks[-1] > samples:
        raise ConfigError(f"samples={samples}, k={list(ks)}: each k must be between 1 and samples")
    return run_evaluation(settings, model, sampled_settings(settings, samples, ks), chosen, progress)


def load_model(path: str = "builtin:tiny", *, dtype: str = "float32", device: str = "auto",
               progress: bool = False) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of anything ``model.path`` takes: ``builtin:tiny``,
    ``builtin:generalist`` and ``builtin:tiny-long`` (pre-trained on first use, then cached), ``builtin:smollm2``, a
    model folder or checkpoint, a hub id,
    a ``.gguf`` file. The model is a transformers ``PreTrainedModel`` in eval mode on ``device``
    (``auto``: CUDA when torch sees a GPU)."""
    from tempering.models.device import resolve_device
    from tempering.policy import load_policy

    validate_config({"model": {"path": path, "dtype": dtype, "device": device}})  # a bad one: a ConfigError
    model, tokenizer, _ = load_policy(path, dtype, PretrainConfig(), progress, device=resolve_device(device))
    return model.eval(), tokenizer


def run_code(code: str, language: str = "python", *, stdin: str = "", timeout_s: float = 5.0,
             memory_mb: int = 512, isolation: str = "auto") -> Any:
    """Run one untrusted program in the sandbox and return its :class:`~tempering.sandbox.RunResult`
    (``status``, ``exit_code``, ``stdout``, ``stderr``, ``wall_s``, ``cpu_s``).

    This starts a one-slot pool and stops it after the run; for many programs keep an
    :class:`~tempering.sandbox.Executor` (``with Executor(workers=4) as sandbox: ...``), whose
    workers are started once. A machine that cannot isolate programs raises
    :class:`~tempering.sandbox.SandboxUnavailable` saying why; ``code`` or ``stdin`` that is
    not UTF-8 text (not a string, or holding a lone surrogate) raises
    :class:`~tempering.sandbox.SpecError` naming it, before any sandbox starts.
    """
    from tempering.sandbox import Executor, Limits, RunRequest

    request = RunRequest(code, language, stdin, Limits(timeout_s=timeout_s, memory_mb=memory_mb))
    with Executor(workers=1, isolation=isolation) as sandbox:
        return sandbox.run(request)
