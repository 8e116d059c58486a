"""Does a model of builtin:tiny-long's shape learn to copy a value out of a document? Prints one JSON object.

    python bench/tiny_long_copy.py [--length 256] [--steps 600] [--every 100] [--problems 64]
        [--layers 2] [--hidden 128] [--heads 4] [--answer-weight 1] [--other-weight 1]
        [--wrong-share 0.5] [--batch-tokens 1100] [--lr 3e-3] [--schedule cosine] [--kinds retrieval,multihop] [--copy-rows 0]
        [--threads 1]

A fresh model pre-trained from scratch on the recipe's corpus (``tempering.tiny_long``) at one
length, the shortest of the curriculum by default, where the lookup should be learned first and
cheapest; every ``every`` steps it is read teacher-forced on ``problems`` held-out retrieval
problems at that length, answered right: the share of answer digits it predicts (chance 10%),
of whole values, and of first digits that match either value the document states (the latest
or the stale one: a model that copies, whichever reading it took, scores near 100% here; one
that guesses, about 20%). Teacher-forced rather than sampled, so a half-learned copy shows
before whole answers come out right. This is the cheap check to run before the recipe's full
pre-training, which takes tens of minutes.

The loss weighs the answer's value and end by ``answer-weight`` and the rest of the document by
``other-weight`` (the recipe itself weighs all alike: 1 and 1), so that a denser signal for the
copy can be tried; ``copy-rows`` adds that many rows to every step that repeat a random
string (4 to 16 digits and capitals A to J) after a few filler words, the repeat weighed as
an answer is: dense practice at copying, which the recipe's corpus, four answer values in a few hundred
characters, does not give. Not measured here: lengths past the first, sampling, RL.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import time

import torch

from report import measured

from tempering import tiny_long
from tempering.pretrain import document_batches, fresh_model, optimizer_and_schedule
from tempering.tasks import build_task
from tempering.tasks.long_context import WORDS

STATED = re.compile(r"(?:is|changed to) (\d{4})\.")
"""A retrieval document's stated values, the latest and the stale one."""
COPIED = string.digits + string.ascii_uppercase[:10]
"""The characters of a copy row's string."""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiny_long_copy.py", description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=tiny_long.LENGTHS[0], help="document length in characters")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps")
    parser.add_argument("--every", type=int, default=100, help="steps between readings")
    parser.add_argument("--problems", type=int, default=64, help="held-out retrieval problems read")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--answer-weight", type=float, default=1.0, help="loss weight of the answer's value and end")
    parser.add_argument("--other-weight", type=float, default=1.0, help="loss weight of the other tokens (0 = answer only)")
    parser.add_argument("--wrong-share", type=float, default=tiny_long.WRONG_SHARE, help="documents answered with the stale value")
    parser.add_argument("--batch-tokens", type=int, default=tiny_long.BATCH_TOKENS, help="tokens of a step, padded")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate, after 30 warm-up steps")
    parser.add_argument("--schedule", default="cosine", choices=["cosine", "constant"],
                        help="the rate after warm-up: cosine to a tenth (the recipe's) or constant")
    parser.add_argument("--kinds", default=",".join(tiny_long.CORPUS), help="corpus kinds, of tempering.tiny_long.CORPUS")
    parser.add_argument("--copy-rows", type=int, default=0, help="rows a step that repeat a random string")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser.parse_args(argv)


def recipe(args: argparse.Namespace):
    """The recipe at one length with the bench's shape and steps: its corpus kinds, their weights."""
    kinds = args.kinds.split(",")
    unknown = [kind for kind in kinds if kind not in tiny_long.CORPUS]
    if unknown:
        sys.exit(f"--kinds: {', '.join(unknown)} not in tempering.tiny_long.CORPUS ({', '.join(tiny_long.CORPUS)})")
    tasks = [spec.model_copy(update={"options": {**spec.options, "lengths": [args.length], "corpus_docs": [10 ** 7]}})
             for spec in tiny_long.corpus_tasks() if spec.name.split(":")[1] in kinds]
    return tiny_long.recipe().model_copy(update={
        "tasks": tasks, "wrong_share": args.wrong_share, "hidden_size": args.hidden, "layers": args.layers,
        "heads": args.heads, "max_positions": args.length + tiny_long.ANSWER_ROOM, "steps": args.steps,
        "batch_tokens": args.batch_tokens, "lr": args.lr})


def copy_row(rng: random.Random) -> str:
    """A string, filler words, and the string again.

    >>> copy_row(random.Random(0)).split(" ")[-1] == copy_row(random.Random(0)).split(".")[0]
    True
    """
    copied = "".join(rng.choice(COPIED) for _ in range(rng.randint(4, 16)))
    filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))
    return f"{copied}. {filler}. {copied}"


def with_copy_rows(input_ids_BT: torch.Tensor, labels_BT: torch.Tensor, rows: list[list[int]], pad_id: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's documents and ``rows`` below them, all padded to the longest."""
    width = max([input_ids_BT.shape[1], *map(len, rows)])
    grow = width - input_ids_BT.shape[1]
    input_ids = torch.nn.functional.pad(input_ids_BT, (0, grow), value=pad_id).tolist()
    labels = torch.nn.functional.pad(labels_BT, (0, grow), value=-100).tolist()
    input_ids += [r + [pad_id] * (width - len(r)) for r in rows]
    labels += [r + [-100] * (width - len(r)) for r in rows]
    return torch.tensor(input_ids), torch.tensor(labels)


def weights(input_ids_BT: torch.Tensor, labels_BT: torch.Tensor, breaks: list[int], answer: float, other: float
            ) -> torch.Tensor:
    """Each target token's loss weight: ``answer`` after the last space or line break (``breaks``:
    the answer's value and the end, or a copy row's repeat), ``other`` up to it, 0 on padding.

    >>> weights(torch.tensor([[5, 9, 5, 7, 7]]), torch.tensor([[5, 9, 5, 7, -100]]), [9], 4.0, 1.0).tolist()
    [[1.0, 1.0, 4.0, 4.0, 0.0]]
    """
    positions_BT = torch.arange(input_ids_BT.shape[1]).expand_as(input_ids_BT)
    is_break_BT = torch.isin(input_ids_BT, torch.tensor(breaks))
    last_break_B = torch.where(is_break_BT, positions_BT, -1).max(dim=1, keepdim=True).values
    weights_BT = torch.where(positions_BT > last_break_B, answer, other)
    return weights_BT * (labels_BT != -100)


def read(model, problems: list, token_ids) -> dict:
    """Teacher-forced answer digits on ``problems``: shares of digits, whole values, and first
    digits that are either stated value's."""
    digits = whole = either = 0
    model.eval()
    with torch.no_grad():
        for problem in problems:
            ids = token_ids(problem.prompt + "answer: " + problem.answer)[:-1]
            logits_TV = model(input_ids=torch.tensor([ids])).logits[0]
            predicted = logits_TV[-5:-1].argmax(-1).tolist()
            right = sum(p == g for p, g in zip(predicted, ids[-4:]))
            digits, whole = digits + right, whole + (right == 4)
            either += predicted[0] in {token_ids(value)[1] for value in STATED.findall(problem.prompt)}
    model.train()
    n = len(problems)
    return {"digit_accuracy": digits / (4 * n), "whole_accuracy": whole / n, "first_digit_either": either / n}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    config = recipe(args)
    model, tokenizer, token_ids = fresh_model(config)
    vocab = tokenizer.get_vocab()
    retrieval = next(spec for spec in tiny_long.domains() if spec.name == "long_context:retrieval")
    problems = build_task(retrieval.name, seed=0, **{**retrieval.options, "lengths": [args.length]}
                          ).eval_problems_at(args.problems, args.length)
    optimizer, schedule = optimizer_and_schedule(model, config, args.schedule)
    batches = document_batches(config, token_ids, tokenizer.pad_token_id)
    curve, losses, start = [{"step": 0, "wall_s": 0.0, **read(model, problems, token_ids)}], [], time.perf_counter()
    rng = random.Random(config.seed)
    for step, (input_ids_BT, labels_BT) in zip(range(1, config.steps + 1), batches):
        if args.copy_rows:
            rows = [token_ids(copy_row(rng)) for _ in range(args.copy_rows)]
            input_ids_BT, labels_BT = with_copy_rows(input_ids_BT, labels_BT, rows, tokenizer.pad_token_id)
        logits_BTV = model(input_ids=input_ids_BT).logits[:, :-1]
        nll_BT = torch.nn.functional.cross_entropy(logits_BTV.transpose(1, 2), input_ids_BT[:, 1:], reduction="none")
        weights_BT = weights(input_ids_BT, labels_BT, [vocab["\n"], vocab[" "]], args.answer_weight, args.other_weight)[:, 1:]
        loss = (nll_BT * weights_BT).sum() / weights_BT.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        losses.append(loss.item())
        if step % args.every == 0 or step == config.steps:
            curve.append({"step": step, "wall_s": round(time.perf_counter() - start, 1),
                          "loss": sum(losses[-20:]) / len(losses[-20:]), **read(model, problems, token_ids)})
    return {"length": args.length, "settings": {k: v for k, v in vars(args).items() if k != "threads"},
            "chance": {"digit_accuracy": 0.1, "first_digit_either": 0.2}, "curve": curve, "final": curve[-1]}


def main(argv: list[str]) -> None:
    args = parse(argv)
    print(json.dumps({**run(args), "measured": measured("tiny_long_copy", argv)}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
