"""``temper eval``: a model's held-out accuracy on the config's tasks, greedy and sampled.

Builds the tasks, their metric rewards, the model and its sampler from the config
(``tempering.build``, the model through ``tempering.policy``), runs greedy and, with ``--n``, sampled evaluation
(``tempering.eval``), and prints the table (and ``--json``). Nothing is trained or saved.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tempering.config import ConfigError, load_config


def select_tasks(config, names: Optional[str]):
    """The config with only the tasks ``--tasks`` names, each keeping the options the config
    gives a task of that name."""
    if names is None:
        return config
    from tempering.config import TaskSpec

    chosen = list(dict.fromkeys(name.strip() for name in names.split(",") if name.strip()))
    if not chosen:
        raise ConfigError("--tasks: name at least one task, e.g. --tasks add,mul")
    specs = {spec.name: spec for spec in config.tasks}
    return config.model_copy(update={"tasks": [specs.get(name) or TaskSpec(name=name) for name in chosen]})


def _sampled_settings(args: argparse.Namespace, config):
    """``--n``/``--k`` as :class:`~tempering.eval.sampled.SampledSettings`; None for greedy only."""
    if args.n is None:
        if args.k or args.best_of:
            raise ConfigError("--k and --best-of need --n, the number of samples per problem")
        return None
    if args.n < 1:
        raise ConfigError(f"--n {args.n}: samples per problem must be at least 1")
    try:
        ks = sorted({int(k) for k in args.k.split(",")}) if args.k else sorted({1, args.n})
    except ValueError:
        raise ConfigError(f"--k {args.k!r}: expected whole numbers separated by commas, e.g. 1,5") from None
    if ks[0] < 1 or ks[-1] > args.n:
        raise ConfigError(f"--k {args.k}: each k must be between 1 and --n {args.n}")
    return sampled_settings(config, args.n, ks)


def sampled_settings(config, n: int, ks: Sequence[int]):
    """n samples per problem for the metrics at each of ``ks`` (checked by the caller), drawn at
    the config's ``rollout.temperature`` and ``top_p``, cut at ``eval.max_new_tokens`` and
    stopped at ``rollout.stop``."""
    from tempering.eval.sampled import SampledSettings
    from tempering.rollout.base import SamplingParams

    params = SamplingParams(temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                            max_new_tokens=config.eval.max_new_tokens, stop=tuple(config.rollout.stop))
    return SampledSettings(n, tuple(ks), params, config.seed)


SELECTORS = {"rm": "reward model", "prm": "process reward model"}
"""Best-of-k selector prefix (``rm:PATH``) -> what it names in a message."""


def parse_best_of(values: Sequence[str], name: str = "--best-of") -> tuple[bool, dict[str, str]]:
    """``(verifier wanted, selector -> model path)`` from the best-of values (``verifier``,
    ``rm:PATH``, ``prm:PATH``); ``name`` is how the caller calls them in a message."""
    paths: dict[str, list[str]] = {selector: [] for selector in SELECTORS}
    for value in values:
        selector, _, path = value.partition(":")
        if value != "verifier" and (selector not in SELECTORS or not path):
            raise ConfigError(f"{name} {value!r}: expected verifier or rm:PATH (a reward model) or prm:PATH "
                              "(a process reward model)")
        if value != "verifier" and path not in paths[selector]:
            paths[selector].append(path)
    for selector, found in paths.items():
        if len(found) > 1:
            raise ConfigError(f"{name}: more than one {SELECTORS[selector]} given ({', '.join(found)}); name one")
    return "verifier" in values, {selector: found[0] for selector, found in paths.items() if found}


def _selectors(paths: dict[str, str], options: dict[str, dict]) -> dict:
    """Selector name -> the reward that ranks samples for best-of-k: ``rm`` a reward model (its
    raw score), ``prm`` a process reward model with the options ``rewards.options.process_model``
    gives (its aggregation)."""
    from tempering.build import reward_model_path
    from tempering.rewards.model import ModelReward
    from tempering.rewards.process_model import ProcessModelReward

    found: dict = {}
    if "rm" in paths:
        found["rm"] = ModelReward(path=reward_model_path(paths["rm"]), transform="raw")
    if "prm" in paths:
        settings = {k: v for k, v in (options.get("process_model") or {}).items() if k != "path"}
        try:
            found["prm"] = ProcessModelReward(path=reward_model_path(paths["prm"]), **settings)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rewards.options.process_model: {exc}") from None
    return found


def evaluate_model(args: argparse.Namespace, model_path: Optional[str], config_path: Optional[str],
                   overrides: list[str]) -> int:
    """``temper eval`` with the model, config file and overrides the arguments name."""
    _check_json_path(args.json)
    config = select_tasks(load_config(config_path, overrides), args.tasks)
    result = run_evaluation(config, model_path, _sampled_settings(args, config), parse_best_of(args.best_of or []),
                            progress=not args.quiet, announce=True)
    _report(result, args.json)
    return 0


def run_evaluation(config, model_path: Optional[str], settings, best_of: tuple[bool, dict[str, str]] = (False, {}),
                   progress: bool = False, announce: bool = False) -> dict:
    """Greedy and, with ``settings``, sampled evaluation of the model (default: the config's
    ``model.path``) on the config's tasks, by round for a task in an environment, best-of-k by
    ``best_of`` (:func:`parse_best_of`): the dict ``--json`` writes. ``announce`` prints the
    model loaded on stderr, so that a long evaluation says what it measures."""
    from tempering.build import build_generator, build_tasks
    from tempering.eval.greedy import build_metrics, close_metrics
    from tempering.eval.sampled import sampled_evaluate
    from tempering.policy import load_model

    tasks = build_tasks(config)
    rounds = _rounds(config, tasks)
    verifier, paths = best_of
    metrics = build_metrics(tasks, config.rewards.options)  # a bad option stops here, before any model work
    try:
        selectors = _selectors(paths, config.rewards.options)
        model, tokenizer, resolved = load_model(config, model_path or config.model.path, progress=progress)
        if announce:
            print(f"temper eval: model {resolved}", file=sys.stderr)
        generator = build_generator(config, model, tokenizer, config.eval.batch_size)
        try:
            result = sampled_evaluate(generator, tasks, config.eval.problems_per_task, config.eval.max_new_tokens,
                                      metrics, config.rewards.options, settings, selectors, verifier, progress,
                                      rounds=rounds, stop=config.rollout.stop,
                                      problems_per_length=config.eval.problems_per_length)
        finally:
            if hasattr(generator, "close"):  # a vLLM engine or a server it launched
                generator.close()
    finally:
        close_metrics(metrics)
    return {"model": resolved, "settings": _settings_record(config, settings, rounds), **result}


def _check_json_path(json_path: Optional[str]) -> None:
    """Refuse a ``--json`` file that could not be written, before the evaluation it would hold."""
    if json_path in (None, "-"):
        return
    if not Path(json_path).resolve().parent.is_dir():
        raise ConfigError(f"--json {json_path}: its folder does not exist")
    if Path(json_path).is_dir():
        raise ConfigError(f"--json {json_path}: is a folder; name a file in it")


def _rounds(config, tasks) -> dict[str, int]:
    """Task name -> its environment's ``max_turns``, for the tasks run in one (build_tasks keeps
    the config's order)."""
    return {task.name: spec.env.max_turns for spec, task in zip(config.tasks, tasks) if spec.env is not None}


def _settings_record(config, settings, rounds: dict[str, int]) -> dict:
    record = {"problems_per_task": config.eval.problems_per_task, "max_new_tokens": config.eval.max_new_tokens,
              "seed": config.seed, "ci": "95%: Wilson for greedy, percentile bootstrap over problems otherwise"}
    if rounds:
        record["max_turns"] = rounds
    if settings is not None:
        record.update(n=settings.n, k=list(settings.ks), temperature=settings.params.temperature,
                      top_p=settings.params.top_p)
    return record


def _report(result: dict, json_path: Optional[str]) -> None:
    """The table on stdout, or on stderr when the JSON takes stdout (``--json -``)."""
    from tempering.eval.sampled import metric_table

    text = json.dumps(result, indent=2)
    print(metric_table(result), file=sys.stderr if json_path == "-" else sys.stdout)
    if json_path == "-":
        print(text)
    elif json_path:
        try:
            Path(json_path).write_text(text + "\n")
        except OSError as exc:  # the table above still shows the numbers
            raise ConfigError(f"--json {json_path}: cannot write it ({exc.strerror or exc})") from None
