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
"""

from __future__ import annotations

import json
import random
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

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
    start = time.perf_counter()
    torch.manual_seed(settings.seed)
    train, test = split_pairs(pairs, settings.heldout)
    model, tokenizer = load_reward_model(settings.base)
    before = pairwise_accuracy(model, tokenizer, test, settings.batch_size, settings.max_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    rng = random.Random(settings.seed)
    step, losses = 0, []
    for _ in range(settings.epochs):
        order = list(train)
        rng.shuffle(order)
        for begin in range(0, len(order), settings.batch_size):
            if settings.max_steps and step >= settings.max_steps:
                break
            model.train()
            chosen, rejected = _scores(model, tokenizer, order[begin:begin + settings.batch_size], settings.max_length)
            loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if progress is not None:
                progress(step, loss.item())
    after = pairwise_accuracy(model, tokenizer, test, settings.batch_size, settings.max_length)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = {"model_dir": str(out), "train_pairs": len(train), "heldout_pairs": len(test), "steps": step,
              "heldout_accuracy_before": before, "heldout_accuracy": after,
              "final_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1), "wall_s": time.perf_counter() - start,
              "settings": settings.__dict__}
    (out / "reward_model.json").write_text(json.dumps(report, indent=2))
    return report
