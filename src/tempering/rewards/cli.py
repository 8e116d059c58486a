"""``temper rm train|pairs``: argument parsing, and one call into :mod:`tempering.rewards.rm` each.

Exit status: 0 on success; 2 for a problem the user can fix (a bad pairs file or model
path), with a message naming the file, line and field.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tempering.rewards.rm import PairsError, RMSettings, arithmetic_pairs, read_pairs, train_reward_model


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from tempering.models.loading import ModelLoadError

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    settings = RMSettings(base=args.base, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                          heldout=args.heldout, max_length=args.max_length, max_steps=args.max_steps,
                          seed=args.seed)

    def progress(step: int, loss: float) -> None:
        if not args.quiet and step % 10 == 0:
            print(f"step {step}  loss {loss:.4f}", file=sys.stderr, flush=True)

    try:
        report = train_reward_model(read_pairs(args.pairs), Path(args.out), settings, progress)
    except (PairsError, ModelLoadError) as exc:
        print(f"temper rm train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in report.items() if k != "settings"}, indent=2))
    return 0


def cmd_pairs(args: argparse.Namespace) -> int:
    try:
        written = _write_pairs(args)
    except PairsError as exc:
        print(f"temper rm pairs: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"pairs": written, "file": args.out}))
    return 0


def _write_pairs(args: argparse.Namespace) -> int:
    """Write the pairs file ``temper rm pairs`` asks for; return how many pairs it holds. A
    count, operand size or path it cannot have is a PairsError."""
    if args.count < 1:
        raise PairsError(f"--count {args.count}: write at least 1 pair")
    try:
        rows = arithmetic_pairs(args.count, seed=args.seed, digits=tuple(args.digits))
    except ValueError as exc:
        raise PairsError(f"--digits {' '.join(map(str, args.digits))}: {exc}") from None
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    except OSError as exc:
        raise PairsError(f"cannot write {args.out}: {exc.strerror}") from None
    return len(rows)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``rm`` with its ``train`` and ``pairs`` subcommands."""
    parser = subparsers.add_parser("rm", help="train a reward model from preference pairs",
                                   description="Train a reward model from preference pairs, or write a procedural pair set.")
    commands = parser.add_subparsers(dest="rm_command", required=True, metavar="COMMAND")
    defaults = RMSettings()

    train = commands.add_parser("train", help="Bradley-Terry training on chosen/rejected pairs")
    train.add_argument("pairs", help="JSONL, one {prompt, chosen, rejected} object per line")
    train.add_argument("--out", default="runs/reward-model", help="output model directory (default runs/reward-model)")
    train.add_argument("--base", default=defaults.base,
                       help="base model: builtin:tiny, a directory, a .gguf file or a hub id (default builtin:tiny)")
    train.add_argument("--epochs", type=int, default=defaults.epochs, help=f"passes over the pairs (default {defaults.epochs})")
    train.add_argument("--batch-size", type=int, default=defaults.batch_size, help="pairs per step")
    train.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate")
    train.add_argument("--heldout", type=float, default=defaults.heldout,
                       help="share of prompts held out for pairwise accuracy (default 0.1)")
    train.add_argument("--max-length", type=int, default=defaults.max_length, help="tokens per text, truncated beyond")
    train.add_argument("--max-steps", type=int, default=defaults.max_steps, help="stop after this many steps; 0 = no limit")
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = all cores")
    train.add_argument("--quiet", action="store_true", help="no progress lines")
    train.set_defaults(func=cmd_train)

    pairs = commands.add_parser("pairs", help="write a procedural preference set from the arithmetic tasks")
    pairs.add_argument("out", help="JSONL file to write")
    pairs.add_argument("--count", type=int, default=3000, help="pairs (default 3000)")
    pairs.add_argument("--digits", type=int, nargs="+", default=[2], help="operand sizes (default 2)")
    pairs.add_argument("--seed", type=int, default=0)
    pairs.set_defaults(func=cmd_pairs)
    return parser
