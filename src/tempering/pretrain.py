"""``temper pretrain``: train the built-in tiny model from scratch on the procedural corpus.

The result is cached in the user cache directory under a key derived from the
pre-training config as this machine runs it (:func:`as_run_here`), so only the first run pays
for it; a changed config is a new entry.
Writing is atomic (a temporary folder renamed into place), so a killed pre-training never
leaves a half-written model that a later run would pick up.

Not done here: resuming an interrupted pre-training (it restarts; it takes minutes).
"""

from __future__ import annotations

import hashlib
import json
import random
import string
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from tqdm import tqdm

from tempering import generalist, tiny_long
from tempering.config import PretrainConfig
from tempering.learner.optim import guarded_step, lr_factor
from tempering.models.cache import cache_root, write_entry
from tempering.models.device import slow_bf16
from tempering.models.tiny import build_model, build_tokenizer, drop_positions
from tempering.tasks import build_task
from tempering.tasks.long_context import WORDS
from tempering.threads import ThreadGovernor

CORPUS_VERSION = 1
"""Bump when the corpus or the model code changes, so stale cache entries are not reused."""
KEYLESS_DEFAULTS: dict[str, Any] = {"tool_share": 0, "batch_tokens": 0, "schedule": "cosine", "hold_steps": 0,
                                    "copy_rows": 0, "context_weight": 1.0, "nope_layers": [], "nope_from_step": 0}
"""Fields left out of the cache key at these values (what pre-training did before they existed),
so that models cached before them keep their keys."""
COPIED = string.digits + string.ascii_uppercase[:10]
"""The characters of a copy row's string."""


def cache_key(config: PretrainConfig) -> str:
    """A hash of what makes the model: the config, less what cannot change the corpus (a
    corpus task's ``env``) and the fields at their :data:`KEYLESS_DEFAULTS`, and the
    ``corpus_version`` of each corpus task that has moved past 1 (a task's documents changed
    under an unchanged config)."""
    exclude: dict = {"tasks": {"__all__": {"env"}}}
    for field, default in KEYLESS_DEFAULTS.items():
        if getattr(config, field) == default:
            exclude[field] = True
    fields = config.model_dump(mode="json", exclude=exclude)
    tasks = {spec.name: getattr(build_task(spec.name, seed=config.seed, **spec.options), "corpus_version", 1)
             for spec in config.tasks}
    if moved := {name: version for name, version in tasks.items() if version != 1}:
        fields["corpus_versions"] = moved
    payload = json.dumps({"v": CORPUS_VERSION, **fields}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


RECIPES: dict[str, Callable[[], PretrainConfig]] = {"builtin:generalist": generalist.recipe,
                                                    "builtin:tiny-long": tiny_long.recipe}
"""The built-in models pre-trained by a fixed recipe, whatever the config's ``pretrain`` says."""
PRETRAINED_BUILTINS = ("builtin:tiny", *RECIPES)
"""The built-in models made by pre-training here (the rest are converted or loaded)."""


def builtin_pretrain(path: str, pretrain: PretrainConfig) -> PretrainConfig:
    """The pre-training behind a built-in model: the config's ``pretrain`` section for
    builtin:tiny, the fixed recipe of the others (``tempering.generalist``, ``tempering.tiny_long``)."""
    return RECIPES[path]() if path in RECIPES else pretrain


def as_run_here(config: PretrainConfig, cpuinfo: Optional[str] = None, machine: Optional[str] = None
                ) -> PretrainConfig:
    """``config`` as this CPU pre-trains it: ``bf16`` autocast only where the CPU computes bf16
    natively. Elsewhere bf16 is emulated: on an AMD EPYC with AVX2 alone a step of the default
    model took 27 s under autocast against 2.5 s in float32, so the default job's pre-training
    would take hours instead of minutes. The model made in float32 is another model, so it is
    keyed (and recorded in its ``pretrain.json``) as ``bf16: false``. ``cpuinfo`` and
    ``machine`` default to this machine's."""
    if config.bf16 and slow_bf16(torch.device("cpu"), ["pretrain.bf16"], cpuinfo, machine):
        return config.model_copy(update={"bf16": False})
    return config


def cached_model_dir(config: PretrainConfig) -> Path:
    return cache_root() / f"tiny-{cache_key(as_run_here(config))}"


def corpus(config: PretrainConfig) -> Iterator[str]:
    """Documents from the corpus tasks, interleaved by their weights (a smooth weighted round
    robin: with equal weights, task i % n, its training problem i // n), each task's training
    problems in order."""
    tasks = [build_task(spec.name, seed=config.seed, **spec.options) for spec in config.tasks]
    for task in tasks:
        if not hasattr(task, "corpus_document"):
            raise ValueError(f"task {task.name!r} cannot write pre-training documents")
    weights = [spec.weight for spec in config.tasks]
    total = sum(weights)
    if not total > 0:
        raise ValueError("pretrain.tasks: every weight is 0, so the corpus has no documents")
    credit, written = [0.0] * len(tasks), [0] * len(tasks)
    while True:
        credit = [c + w for c, w in zip(credit, weights)]
        pick = max(range(len(tasks)), key=credit.__getitem__)  # the first of equals
        credit[pick] -= total
        yield tasks[pick].corpus_document(written[pick], config.wrong_share, config.tool_share)
        written[pick] += 1


def document_batches(config: PretrainConfig, token_ids: Callable[[str], list[int]], pad_id: int
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(input_ids_BT, labels_BT)`` of ``batch_docs`` documents each (or as many as
    ``batch_tokens`` holds), right-padded.

    One document per row, rather than documents packed back to back, so that attention
    never reaches into an unrelated problem: that matters for a model this small, whose
    whole job is to copy digits from the right places.
    """
    documents = (token_ids(text)[: config.max_positions] for text in corpus(config))
    for rows in step_rows(documents, config.batch_docs, config.batch_tokens):
        yield padded(rows, pad_id)


def padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids_BT, labels_BT)`` of ``rows`` right-padded to the longest, padding out of the loss."""
    width = max(len(r) for r in rows)
    return (torch.tensor([r + [pad_id] * (width - len(r)) for r in rows]),
            torch.tensor([r + [-100] * (width - len(r)) for r in rows]))


def copy_row(rng: random.Random) -> str:
    """A string, filler words, and the string again: copying by what came before, which a
    document's answer needs, in every row rather than in four digits of a few hundred characters.

    >>> copy_row(random.Random(0)).split(" ")[-1] == copy_row(random.Random(0)).split(".")[0]
    True
    """
    copied = "".join(rng.choice(COPIED) for _ in range(rng.randint(4, 16)))
    filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))
    return f"{copied}. {filler}. {copied}"


def copy_batches(config: PretrainConfig, token_ids: Callable[[str], list[int]], pad_id: int
                 ) -> Iterator[Optional[tuple[torch.Tensor, torch.Tensor]]]:
    """Each step's ``copy_rows`` copy rows as a batch of their own (so that a step of one long
    document is not padded by them), seeded by the config's seed; None at ``copy_rows`` 0."""
    rng = random.Random(f"copy:{config.seed}")
    while True:
        yield padded([token_ids(copy_row(rng)) for _ in range(config.copy_rows)], pad_id) if config.copy_rows else None


def answer_weights(input_ids_BT: torch.Tensor, labels_BT: torch.Tensor, breaks: list[int], context_weight: float
                   ) -> torch.Tensor:
    """Each target token's loss weight: 1 after the row's last space or line break (``breaks``:
    a document's answer value and end, a copy row's repeat), ``context_weight`` up to it, 0 on
    padding. ``answer: `` is context: with it weighed 1 (the whole answer line, a copy row's
    repeat on a line of its own), builtin:tiny-long's lookup did not form in its 3,000 steps at
    256 characters, where it had at 2,000 steps so (one run each; AMD EPYC, one thread).

    >>> answer_weights(torch.tensor([[5, 9, 5, 7, 7]]), torch.tensor([[5, 9, 5, 7, -100]]), [9], 0.25).tolist()
    [[0.25, 0.25, 1.0, 1.0, 0.0]]
    """
    positions_BT = torch.arange(input_ids_BT.shape[1]).expand_as(input_ids_BT)
    is_break_BT = torch.isin(input_ids_BT, torch.tensor(breaks))
    last_break_B = torch.where(is_break_BT, positions_BT, -1).max(dim=1, keepdim=True).values
    weights_BT = torch.where(positions_BT > last_break_B, 1.0, context_weight)
    return weights_BT * (labels_BT != -100)


def step_loss(model: Any, config: PretrainConfig, batches: list[Optional[tuple[torch.Tensor, torch.Tensor]]],
              breaks: list[int]) -> torch.Tensor:
    """A step's loss over its documents' batch and its copy rows' (None when there are none):
    the model's own mean over target tokens where every token weighs alike and there are no
    copy rows, else the :func:`answer_weights`-weighted mean over both batches together."""
    batches = [batch for batch in batches if batch is not None]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        if config.context_weight == 1 and len(batches) == 1:
            return model(input_ids=batches[0][0], labels=batches[0][1]).loss
        total = weight = 0.0
        for input_ids_BT, labels_BT in batches:
            logits_BTV = model(input_ids=input_ids_BT).logits[:, :-1].float()
            nll_BT = torch.nn.functional.cross_entropy(logits_BTV.transpose(1, 2), labels_BT[:, 1:], reduction="none")
            weights_BT = answer_weights(input_ids_BT, labels_BT, breaks, config.context_weight)[:, 1:]
            total, weight = total + (nll_BT * weights_BT).sum(), weight + weights_BT.sum()
        return total / weight


def step_rows(documents: Iterator[list[int]], batch_docs: int, batch_tokens: int) -> Iterator[list[list[int]]]:
    """The documents of each step: ``batch_docs`` of them, or with ``batch_tokens`` the next
    ones while they fit it once padded to the longest, at least one.

    >>> [len(rows) for _, rows in zip(range(3), step_rows(iter([[0]] * 4 + [[0] * 3] * 9), 8, 6))]
    [4, 2, 2]
    """
    if not batch_tokens:
        while True:
            yield [next(documents) for _ in range(batch_docs)]
    rows = [next(documents)]
    for row in documents:
        if (len(rows) + 1) * max(len(row), *map(len, rows)) > batch_tokens:
            yield rows
            rows = []
        rows.append(row)


def document_ids(text: str, vocab: dict[str, int], tokenizer) -> list[int]:
    """A document's ids for the character-level tiny tokenizer: begin, one id per character,
    end. The end token's text inside a document (where a model turn ends in a reflection
    transcript) becomes the end-of-sequence id, the one the sampler draws to end a turn."""
    unk, eos = tokenizer.unk_token_id, tokenizer.eos_token_id
    parts = [[vocab.get(c, unk) for c in part] for part in text.split(tokenizer.eos_token)]
    return [tokenizer.bos_token_id] + [i for part in parts for i in (*part, eos)]


def fresh_model(config: PretrainConfig) -> tuple[Any, Any, Callable[[str], list[int]]]:
    """An untrained tiny model of ``config``'s shape, its tokenizer, and a document's token ids."""
    tokenizer = build_tokenizer()
    tokenizer.model_max_length = max(tokenizer.model_max_length, config.max_positions)
    model = build_model(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, layers=config.layers,
        heads=config.heads, max_positions=config.max_positions, seed=config.seed,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, nope_layers=config.nope_layers,
    )
    drop_positions_due(model, config, 0)
    vocab = tokenizer.get_vocab()
    return model, tokenizer, lambda text: document_ids(text, vocab, tokenizer)


def drop_positions_due(model: Any, config: PretrainConfig, step: int) -> None:
    """Drop the rotary positions of ``config.nope_layers`` if ``step`` (counted from 0, before
    its update) is ``nope_from_step``: the one place pre-training, and a bench that runs its
    steps, decide it."""
    if config.nope_layers and step == config.nope_from_step:
        drop_positions(model, config.nope_layers)


def optimizer_and_schedule(model: Any, config: PretrainConfig) -> tuple[Any, Any]:
    """Pre-training's AdamW and its learning rate: ``warmup_steps`` up to ``lr``, ``hold_steps``
    at it, then the config's ``schedule`` (``lr_factor``'s, cosine to a tenth) over the rest."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(
        s - min(config.hold_steps, max(0, s - config.warmup_steps)), config.warmup_steps,
        config.steps - config.hold_steps, config.schedule, 0.1))


def train_step(model: Any, optimizer: Any, schedule: Any, config: PretrainConfig,
               batches: list[Optional[tuple[torch.Tensor, torch.Tensor]]], breaks: list[int]) -> float:
    """One optimizer step on :func:`step_loss` (gradients clipped to norm 1); its loss."""
    loss = step_loss(model, config, batches, breaks)
    loss.backward()
    value = loss.item()
    guarded_step(optimizer, value, grad_clip=1.0)
    schedule.step()
    return value


def breaks_of(tokenizer: Any) -> list[int]:
    """The ids after whose last one a row's answer starts (:func:`answer_weights`): space, line break."""
    vocab = tokenizer.get_vocab()
    return [vocab["\n"], vocab[" "]]


def pretrain(config: PretrainConfig, out_dir: Path, progress: bool = True, threads: Optional[int] = None) -> dict:
    """Train a fresh tiny model; save model and tokenizer to ``out_dir``; return statistics.

    ``threads`` as the config key (0 = the free cores, re-counted as it goes); None keeps
    torch's current setting, which a caller such as ``train`` has chosen already.
    """
    governor = ThreadGovernor(threads) if threads is not None else None
    model, tokenizer, token_ids = fresh_model(config)
    optimizer, schedule = optimizer_and_schedule(model, config)
    model.train()
    start, losses = time.perf_counter(), []
    bar = tqdm(total=config.steps, desc="pretrain", disable=not progress, dynamic_ncols=True)
    batches = zip(document_batches(config, token_ids, tokenizer.pad_token_id),
                  copy_batches(config, token_ids, tokenizer.pad_token_id))
    breaks, tokens, copy_tokens = breaks_of(tokenizer), 0, 0
    for step, (documents, copies) in zip(range(config.steps), batches):
        if step:  # step 0's are dropped by fresh_model
            drop_positions_due(model, config, step)
        losses.append(train_step(model, optimizer, schedule, config, [documents, copies], breaks))
        tokens += int((documents[1] != -100).sum())
        copy_tokens += int((copies[1] != -100).sum()) if copies else 0
        if governor:
            governor.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        bar.update()
    bar.close()
    stats = {
        "steps": config.steps,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]),
        "wall_s": time.perf_counter() - start,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens": tokens,
        "copy_tokens": copy_tokens,
    }
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "pretrain.json").write_text(json.dumps(
        {"config": config.model_dump(mode="json"), "stats": stats}, indent=2))
    return stats


def ensure_pretrained(config: PretrainConfig, progress: bool = True, force: bool = False,
                      threads: Optional[int] = None) -> Path:
    """The cached model directory for ``config``, pre-training it first if it is missing
    (with ``threads`` as for :func:`pretrain`), as this CPU runs it (:func:`as_run_here`)."""
    config = as_run_here(config)
    target = cached_model_dir(config)
    if target.exists() and not force:
        return target
    return write_entry(target, lambda folder: pretrain(config, folder, progress=progress, threads=threads),
                       replace=force)
