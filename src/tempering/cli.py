"""``temper``: argument parsing only; each command calls one function.

Errors a user can fix (bad config key or value, missing model, bad data) print one short
message and exit with status 2; they never show a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path
from typing import Optional

from tempering.threads import passive_waits

passive_waits()  # before anything imports torch: OpenMP reads its wait policy once, when loaded

from tempering.config import ConfigError, load_config  # noqa: E402
from tempering.faults import TrainingDiverged  # noqa: E402
from tempering.rewards.cli import add_parser as add_rm_parser  # noqa: E402
from tempering.sandbox.cli import add_parser as add_sandbox_parser  # noqa: E402

USER_ERROR = 2


def _split_config_args(items: list[str]) -> tuple[Optional[str], list[str]]:
    """``[CONFIG] [key=value ...]``: the first item is a config file unless it holds '='."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _load(args: argparse.Namespace):
    path, overrides = _split_config_args(args.config_and_overrides)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"expected key=value overrides after the config file, got {bad[0]!r}")
    if getattr(args, "run_dir", None):
        # quoted, so that a folder named like 2024-06-01 or 'null' stays the string it is
        overrides.append(f"run_dir={json.dumps(args.run_dir)}")
    return load_config(path, overrides)


def cmd_train(args: argparse.Namespace) -> int:
    try:
        _train(args)
    except OSError as exc:  # a run-folder file (config, metrics, summary); checkpoints say so themselves
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        from tempering.checkpoint import StorageError

        raise StorageError(f"cannot write {exc.filename or 'the run folder'}: no space left on device (the disk "
                           "is full). Free space, then continue with `temper train --resume RUN_DIR`") from None
    return 0


def _train(args: argparse.Namespace) -> None:
    from tempering.train import train

    if args.resume is None:
        train(_load(args), progress=not args.quiet)
        return
    train(_resumed_config(args, args.config_and_overrides), progress=not args.quiet, resume=True)


def _resumed_config(args: argparse.Namespace, extra: list[str]):
    """The saved config of the run ``--resume`` names; ``extra`` arguments beside it are refused."""
    run_dir = Path(args.resume)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no config.yaml in it)")
    if extra or args.run_dir:
        raise ConfigError("--resume continues a run with its own saved config; drop the config file and overrides")
    return load_config(saved, [f"run_dir={json.dumps(str(run_dir))}"])


def cmd_sft(args: argparse.Namespace) -> int:
    from tempering.sft import sft

    if args.resume is not None:
        sft(_resumed_config(args, args.items), progress=not args.quiet, resume=True)
        return 0
    if not args.items or "=" in args.items[0]:
        raise ConfigError("temper sft needs the training records first: temper sft DATA.jsonl [CONFIG] [key=value ...]")
    args.config_and_overrides = [*args.items[1:], f"sft.data={json.dumps(args.items[0])}"]
    sft(_load(args), progress=not args.quiet)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from tempering.pretrain import ensure_pretrained

    config = _load(args)
    path = ensure_pretrained(config.pretrain, progress=not args.quiet, force=args.force, threads=config.threads)
    stats = json.loads((path / "pretrain.json").read_text())["stats"]
    print(json.dumps({"model_dir": str(path), **stats}, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from tempering.build import build_tasks, load_model
    from tempering.evaluate import build_metrics, close_metrics, evaluate
    from tempering.rollout.hf import HFGenerator

    config = _load(args)
    tasks = build_tasks(config)
    metrics = build_metrics(tasks, config.rewards.options)  # a bad option stops here, before any model work
    try:
        model, tokenizer, _ = load_model(config, args.model or config.model.path, progress=not args.quiet)
        generator = HFGenerator(model, tokenizer, config.model.chat_template, config.eval.batch_size)
        result = evaluate(generator, tasks, config.eval.problems_per_task, config.eval.max_new_tokens, metrics=metrics)
    finally:
        close_metrics(metrics)
    print(json.dumps(result, indent=2))
    return 0


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config_and_overrides", nargs="*", metavar="[CONFIG] [key=value ...]",
        help="a YAML config (default: the built-in quickstart) and dotted overrides, e.g. rollout.group_size=8",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or tables")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temper", description="RL post-training with verifiable rewards")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser("train", help="RL-train a model (default: the quickstart job)")
    _add_config_args(train)
    train.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    train.add_argument("--resume", metavar="RUN_DIR",
                       help="continue a run from its newest complete checkpoint (with its saved config)")
    train.set_defaults(func=cmd_train)

    sft = sub.add_parser("sft", help="supervised fine-tuning on answer tokens (chat or prompt/completion records)")
    sft.add_argument("items", nargs="*", metavar="DATA.jsonl [CONFIG] [key=value ...]",
                     help="training records (.jsonl or .parquet), then a YAML config and dotted overrides (sft.epochs=2)")
    sft.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    sft.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    sft.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest complete checkpoint")
    sft.set_defaults(func=cmd_sft)

    pretrain = sub.add_parser("pretrain", help="pre-train the built-in tiny model into the cache")
    _add_config_args(pretrain)
    pretrain.add_argument("--force", action="store_true", help="pre-train again even if cached")
    pretrain.set_defaults(func=cmd_pretrain)

    evaluate = sub.add_parser("eval", help="greedy held-out accuracy of a model on the config's tasks")
    _add_config_args(evaluate)
    evaluate.add_argument("--model", help="model path (default: the config's model.path)")
    evaluate.set_defaults(func=cmd_eval)

    add_sandbox_parser(sub)
    add_rm_parser(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    from tempering.checkpoint import StorageError
    from tempering.models.loading import ModelLoadError

    try:
        status = args.func(args)
    except (ConfigError, ModelLoadError, StorageError) as exc:
        print(f"temper {args.command}: {exc}", file=sys.stderr)
        status = USER_ERROR
    except TrainingDiverged as exc:
        print(f"temper {args.command}: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print(f"temper {args.command}: interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)


if __name__ == "__main__":
    main()
