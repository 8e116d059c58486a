"""Training a reward model from preference pairs (``temper rm train``), and a procedural pair set.

A pairs file is JSONL, one object per line: ``{"prompt": ..., "chosen": ..., "rejected": ...}``
(``prompt`` is text or chat messages and may be omitted). The model learns a scalar score
with the Bradley–Terry loss ``-log sigmoid(score(chosen) - score(rejected))``; pairs are split
by prompt, so no held-out prompt is trained on, and the held-out pairwise accuracy (the share
of pairs whose chosen completion scores higher) is measured before and after training. The
saved directory loads with ``AutoModelForSequenceClassification`` and as the ``model`` reward.

:func:`arithmetic_pairs` writes a preference set from the built-in arithmetic tasks: a
correct worked solution against a flawed one (the classic dropped carry or borrow, a wrong
column, or right steps with a wrong final answer).

Not done here: margins or ties in the loss, multi-GPU training, LoRA.

The ``temper rm train|pairs`` commands (:func:`add_parser`) make one call here each; exit
status 2 is for a problem the user can fix (a bad pairs file or model path), with a message
naming the file, line and field.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from tempering.learner.optim import shuffled_epochs
from tempering.rewards.model import load_reward_model, reward_text, sequence_scores


class PairsError(ValueError):
    """A pairs file the user must fix (one to read: the message names the file, line and field; one
    to write: its path, count or operand sizes)."""


@dataclass(frozen=True)
class Pair:
    prompt: Any
    chosen: str
    rejected: str


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs in a JSONL file; a bad line is a PairsError naming file, line and field."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PairsError(f"pairs file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PairsError(f"pairs file {path} cannot be read as UTF-8 text: {exc}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PairsError(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise PairsError(f"{path}, line {number}: expected an object with 'chosen' and 'rejected'")
        for field in ("chosen", "rejected"):
            if not isinstance(row.get(field), str):
                raise PairsError(f"{path}, line {number}: field {field!r} must be a string")
        prompt = row.get("prompt", "")
        if not (isinstance(prompt, str) or (isinstance(prompt, list)
                                            and all(isinstance(m, dict) and "content" in m for m in prompt))):
            raise PairsError(f"{path}, line {number}: field 'prompt' must be text or a list of chat messages")
        pairs.append(Pair(prompt, row["chosen"], row["rejected"]))
    if len(pairs) < 2:
        raise PairsError(f"pairs file {path} holds {len(pairs)} pair(s); training needs at least 2")
    return pairs


def split_pairs(pairs: list[Pair], heldout: float) -> tuple[list[Pair], list[Pair]]:
    """Train and held-out pairs, split by a stable hash of the prompt (at least one held out)."""
    def bucket(pair: Pair) -> float:
        return zlib.crc32(json.dumps(pair.prompt, sort_keys=True).encode()) / 2**32

    train = [p for p in pairs if bucket(p) >= heldout]
    test = [p for p in pairs if bucket(p) < heldout]
    if not test or not train:
        test, train = pairs[: max(1, int(len(pairs) * heldout))], pairs[max(1, int(len(pairs) * heldout)):]
    return train, test


def _flaw(rng: random.Random, task: Any, problem: Any) -> str:
    """A worked solution with one kind of mistake, different from the correct one."""
    right = task.solution(problem)
    buggy = task.solution(problem, buggy=True)
    lines = right.splitlines()
    answer = int(problem.answer)
    kind = rng.choice(["procedure", "step", "answer"] if buggy != right else ["step", "answer"])
    if kind == "procedure":
        return buggy
    if kind == "answer":
        return "\n".join(lines[:-1] + [f"answer: {answer + rng.choice([-10, -1, 1, 10])}"])
    i = rng.randrange(len(lines) - 1)
    left, _, value = lines[i].rpartition("=")
    lines[i] = f"{left}={int(value) + rng.choice([-2, -1, 1, 2])}"
    return "\n".join(lines)


def arithmetic_pairs(count: int, seed: int = 0, digits: tuple[int, ...] = (2,)) -> list[dict]:
    """``count`` preference pairs over add/sub/mul training problems, as JSON-ready dicts."""
    from tempering.tasks import build_task

    tasks = [build_task(op, seed=seed, digits=list(digits)) for op in ("add", "sub", "mul")]
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        problem = task.train_problem(i // len(tasks))
        rows.append({"prompt": problem.prompt, "chosen": task.solution(problem),
                     "rejected": _flaw(rng, task, problem)})
    return rows


def pairwise_accuracy(model: Any, tokenizer: Any, pairs: list[Pair], batch_size: int, max_length: int) -> float:
    model.eval()
    wins = 0
    with torch.inference_mode():
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            chosen, rejected = _scores(model, tokenizer, chunk, max_length)
            wins += int((chosen > rejected).sum())
    return wins / len(pairs)


def _scores(model: Any, tokenizer: Any, pairs: list[Pair], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [reward_text(p.prompt, p.chosen, tokenizer) for p in pairs]
    texts += [reward_text(p.prompt, p.rejected, tokenizer) for p in pairs]
    scores = sequence_scores(model, tokenizer, texts, max_length)
    return scores[: len(pairs)], scores[len(pairs):]


@dataclass(frozen=True)
class RMSettings:
    base: str = "builtin:tiny"
    epochs: int = 2
    batch_size: int = 32
    lr: float = 3e-4
    heldout: float = 0.1
    max_length: int = 512
    max_steps: int = 0
    """0 = as many as the epochs take"""
    seed: int = 0


def train_reward_model(pairs: list[Pair], out: Path, settings: RMSettings,
                       progress: Optional[Any] = None) -> dict:
    """Bradley–Terry training; saves model, tokenizer and ``reward_model.json`` into ``out``."""
    from tempering.build import reward_model_path

    start = time.perf_counter()
    torch.manual_seed(settings.seed)
    train, test = split_pairs(pairs, settings.heldout)
    model, tokenizer = load_reward_model(reward_model_path(settings.base))
    before = pairwise_accuracy(model, tokenizer, test, settings.batch_size, settings.max_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)

    def loss_of(chunk: list[Pair]) -> torch.Tensor:
        chosen, rejected = _scores(model, tokenizer, chunk, settings.max_length)
        return -torch.nn.functional.logsigmoid(chosen - rejected).mean()

    losses = shuffled_epochs(model, optimizer, train, loss_of, settings.epochs, settings.batch_size,
                             settings.max_steps, settings.seed, progress)
    after = pairwise_accuracy(model, tokenizer, test, settings.batch_size, settings.max_length)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = {"model_dir": str(out), "train_pairs": len(train), "heldout_pairs": len(test), "steps": len(losses),
              "heldout_accuracy_before": before, "heldout_accuracy": after,
              "final_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1), "wall_s": time.perf_counter() - start,
              "settings": settings.__dict__}
    (out / "reward_model.json").write_text(json.dumps(report, indent=2))
    return report


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
