"""Training a process reward model on step labels (``temper prm train``).

The labels come from ``temper prm label`` (:mod:`tempering.prm_label`). The model is a causal
language model (``builtin:tiny``, a folder, a ``.gguf`` file or a hub id) with a new
one-output token-classification head; its output on each step's last token
(:func:`~tempering.rewards.process_model.step_tokens`) is trained with binary cross-entropy
towards the step's soft label (the share of continuations that reached a right answer) or
its hard label (any did). Solutions are split by problem, so no held-out problem is trained
on; held-out step accuracy (a step value of at least 0.5 against the hard label) and AUC are
measured before and after training. The saved folder loads with
``AutoModelForTokenClassification`` and as the ``process_model`` reward.

Not done here: LoRA, multi-GPU training, weighting steps by how many continuations backed
their label.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from tempering.config import ConfigError
from tempering.eval.stats import roc_auc
from tempering.learner.optim import shuffled_epochs
from tempering.rewards.model import load_reward_model
from tempering.rewards.process_model import step_logits, step_tokens

TARGETS = ("soft", "hard")


@dataclass(frozen=True)
class PRMSettings:
    base: str = "builtin:tiny"
    epochs: int = 3
    batch_size: int = 32
    """Solutions per optimizer step."""
    lr: float = 3e-4
    heldout: float = 0.2
    """Share of problems held out for step accuracy and AUC."""
    target: str = "soft"
    """``soft`` (share of continuations right) or ``hard`` (any right)."""
    max_length: int = 512
    """Tokens per solution; a longer one loses the start of its prompt."""
    max_steps: int = 0
    """Stop after this many optimizer steps; 0 = as many as the epochs take."""
    seed: int = 0

    def check(self) -> None:
        """A ConfigError naming the option that cannot be used."""
        if self.target not in TARGETS:
            raise ConfigError(f"--target {self.target!r}: expected soft or hard")
        if not 0 < self.heldout < 1:
            raise ConfigError(f"--heldout {self.heldout}: the held-out share must be between 0 and 1")
        for name in ("epochs", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.lr <= 0 or self.max_steps < 0:
            raise ConfigError(f"--lr must be positive and --max-steps at least 0, got {self.lr}, {self.max_steps}")


@dataclass(frozen=True)
class Example:
    """One labelled solution, tokenized: only the steps with a label have an end."""

    problem: str
    ids: list[int]
    ends: list[int]
    soft: list[float]
    hard: list[int]


def read_labels(path: Path) -> list[dict]:
    """The solution records of a labels file; a file that is not one is a ConfigError naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"labels file {path} does not exist (write one with temper prm label)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"labels file {path} cannot be read as UTF-8 text: {exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}, line {number}: not valid JSON ({exc.msg})") from None
        if number == 1 and isinstance(row, dict) and "prm_labels" in row:
            continue
        if not isinstance(row, dict) or not all(isinstance(row.get(k), list) for k in ("steps", "hard", "soft")) \
                or not len(row["steps"]) == len(row["hard"]) == len(row["soft"]):
            raise ConfigError(f"{path}, line {number}: expected a record with lists steps, hard and soft of one length")
        records.append(row)
    if not records:
        raise ConfigError(f"labels file {path} holds no labelled solution")
    return records


def examples(records: list[dict], tokenizer: Any, max_length: int) -> list[Example]:
    """The records with at least one labelled step, tokenized as the PRM reads them."""
    found = []
    for row in records:
        ids, ends = step_tokens(tokenizer, row.get("prompt", ""), row["steps"], max_length)
        ends = [None] * (len(row["steps"]) - len(ends)) + ends  # the steps cut off lose their ends
        kept = [i for i, (end, h) in enumerate(zip(ends, row["hard"])) if end is not None and h is not None]
        if kept:
            found.append(Example(f"{row.get('task')}:{row.get('index', row.get('prompt'))}", ids,
                                 [ends[i] for i in kept], [float(row["soft"][i]) for i in kept],
                                 [int(row["hard"][i]) for i in kept]))
    return found


def split(found: list[Example], heldout: float) -> tuple[list[Example], list[Example]]:
    """Train and held-out examples, by a stable hash of the problem (at least one problem each)."""
    def bucket(example: Example) -> float:
        return zlib.crc32(example.problem.encode()) / 2**32

    train = [e for e in found if bucket(e) >= heldout]
    test = [e for e in found if bucket(e) < heldout]
    if not train or not test:
        problems = sorted({e.problem for e in found})
        if len(problems) < 2:
            raise ConfigError("the labels hold one problem; training and held-out steps need at least two")
        held = set(problems[:max(1, int(len(problems) * heldout))])
        train, test = [e for e in found if e.problem not in held], [e for e in found if e.problem in held]
    return train, test


def step_metrics(model: Any, tokenizer: Any, found: list[Example], batch_size: int) -> dict:
    """Held-out ``step_accuracy`` (value >= 0.5 against the hard label), ``step_auc`` and the
    number of ``steps``."""
    model.eval()
    values: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(found), batch_size):
            chunk = found[start:start + batch_size]
            for logits in step_logits(model, tokenizer, [(e.ids, e.ends) for e in chunk]):
                values += torch.sigmoid(logits).tolist()
    hard = [h for e in found for h in e.hard]
    return {"steps": len(hard), "step_accuracy": sum((v >= 0.5) == bool(h) for v, h in zip(values, hard)) / len(hard),
            "step_auc": roc_auc(values, hard), "positive_share": sum(hard) / len(hard)}


def _loss(model: Any, tokenizer: Any, chunk: list[Example], target: str) -> torch.Tensor:
    logits = torch.cat(step_logits(model, tokenizer, [(e.ids, e.ends) for e in chunk]))
    labels = torch.tensor([y for e in chunk for y in (e.soft if target == "soft" else e.hard)],
                          dtype=torch.float32, device=logits.device)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)


def train_prm(records: list[dict], out: Path, settings: PRMSettings,
              progress: Optional[Callable[[int, float], None]] = None) -> dict:
    """Train on the records' step labels; save model, tokenizer and ``prm.json`` into ``out``."""
    from tempering.build import reward_model_path

    settings.check()
    begin = time.perf_counter()
    torch.manual_seed(settings.seed)
    model, tokenizer = load_reward_model(reward_model_path(settings.base), head="token")
    train, test = split(examples(records, tokenizer, settings.max_length), settings.heldout)
    before = step_metrics(model, tokenizer, test, settings.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    losses = shuffled_epochs(model, optimizer, train, lambda chunk: _loss(model, tokenizer, chunk, settings.target),
                             settings.epochs, settings.batch_size, settings.max_steps, settings.seed, progress)
    after = step_metrics(model, tokenizer, test, settings.batch_size)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    report = {"model_dir": str(out), "train_solutions": len(train), "heldout_solutions": len(test),
              "train_steps": sum(len(e.ends) for e in train), "optimizer_steps": len(losses),
              "heldout_before": before, "heldout": after,
              "final_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1),
              "wall_s": time.perf_counter() - begin, "settings": asdict(settings)}
    (out / "prm.json").write_text(json.dumps(report, indent=2))
    return report
