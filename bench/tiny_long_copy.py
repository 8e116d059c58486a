"""Does a model of builtin:tiny-long's shape learn to copy a value out of a document? Prints one JSON object.

    python bench/tiny_long_copy.py [--length 256] [--steps 600] [--every 100] [--problems 64]
        [--layers 2] [--hidden 128] [--heads 4] [--context-weight W] [--wrong-share S] [--batch-tokens 1100]
        [--lr 3e-3] [--schedule constant|cosine] [--kinds retrieval] [--copy-rows N] [--threads 1]

A fresh model pre-trained from scratch by the recipe (``tempering.tiny_long``: its corpus,
loss and copy rows, each of which a flag can change; the defaults are the recipe's) at one
length, the shortest of the curriculum by default, where the lookup should be learned first and
cheapest; every ``every`` steps it is read teacher-forced on ``problems`` held-out retrieval
problems at that length, answered right: the share of answer digits it predicts (chance 10%),
of whole values, and of first digits that match either value the document states (the latest
or the stale one: a model that copies, whichever reading it took, scores near 100% here; one
that guesses, about 20%); then on the same problems with another name's change stated last in
the document (:func:`decoy_last`): whole values still right, and first digits that are the
decoy's, which tell a model that takes the latest change by position (near 100%) from one that
looks the asked name up (near 0). Past the recipe's ``nope_from_step`` (``--steps`` over
3,000) the last layer drops its positions, as in the recipe.
Teacher-forced rather than sampled, so a half-learned copy shows
before whole answers come out right. This is the cheap check to run before the recipe's full
pre-training, which takes tens of minutes.

The loss weighs the answer's value and end by 1 and the rest of a row by ``context-weight``
(``pretrain.context_weight``); ``copy-rows`` (``pretrain.copy_rows``) adds that many rows to
every step that repeat a random string after a few filler words, the repeat weighed as an
answer is: dense practice at copying, which a corpus of four answer values in a few hundred
characters does not give. Not measured here: lengths past the first, sampling, RL.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time

import torch

from report import measured

from tempering import tiny_long
from tempering.pretrain import (breaks_of, copy_batches, document_batches, drop_positions_due, fresh_model,
                                optimizer_and_schedule, train_step)
from tempering.tasks import build_task
from tempering.tasks.long_context_facts import fresh, name

STATED = re.compile(r"(?:is|changed to) (\d{4})\.")
"""A retrieval document's stated values, the latest and the stale one."""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tiny_long_copy.py", description=__doc__.split("\n")[0])
    parser.add_argument("--length", type=int, default=tiny_long.LENGTHS[0], help="document length in characters")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps")
    parser.add_argument("--every", type=int, default=100, help="steps between readings")
    parser.add_argument("--problems", type=int, default=64, help="held-out retrieval problems read")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context-weight", type=float, default=tiny_long.CONTEXT_WEIGHT,
                        help="loss weight of a row's tokens before its answer, against 1 (0 = answer only)")
    parser.add_argument("--wrong-share", type=float, default=tiny_long.WRONG_SHARE, help="documents answered with the stale value")
    parser.add_argument("--batch-tokens", type=int, default=tiny_long.BATCH_TOKENS, help="tokens of a step, padded")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate, after 30 warm-up steps")
    parser.add_argument("--schedule", default=tiny_long.recipe().schedule, choices=["cosine", "constant"],
                        help="the rate after warm-up and the recipe's hold_steps: cosine to a tenth or constant")
    parser.add_argument("--kinds", default=",".join(tiny_long.CORPUS), help="corpus kinds, of tempering.tiny_long.CORPUS")
    parser.add_argument("--copy-rows", type=int, default=tiny_long.COPY_ROWS, help="rows a step that repeat a random string")
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
        "batch_tokens": args.batch_tokens, "lr": args.lr, "schedule": args.schedule, "copy_rows": args.copy_rows,
        "context_weight": args.context_weight, "nope_layers": [args.layers - 1]})


def decoy_last(problem, rng: random.Random) -> tuple[str, str]:
    """``problem``'s prompt with another name's change stated last in its document (just before
    the first line break, where the framing starts), and that change's value, whose first digit
    is neither stated value's: a reader that takes the latest change whatever its name answers
    with it; one that looks the asked name up does not.

    >>> class P: prompt = "The code of AB-123 is 1111. The code of AB-123 was changed to 2222.\\nQuestion: ?"
    >>> prompt, value = decoy_last(P, random.Random(0))
    >>> prompt.split("\\n")[0].endswith(f"2222. The code of {prompt.split()[-7]} was changed to {value}.") and value[0] not in "12"
    True
    >>> prompt.split()[-7] != "AB-123" and prompt.endswith(".\\nQuestion: ?")
    True
    """
    other = fresh(rng, name, {re.search(r"code of (\S+) ", problem.prompt).group(1)})
    taken = {value[0] for value in STATED.findall(problem.prompt)}
    value = str(rng.randint(1000, 9999))
    while value[0] in taken:
        value = str(rng.randint(1000, 9999))
    end = problem.prompt.index("\n")
    return f"{problem.prompt[:end]} The code of {other} was changed to {value}.{problem.prompt[end:]}", value


def answer_digits(model, text: str, token_ids) -> tuple[list[int], list[int]]:
    """The ids of ``text``'s last four characters (the answer's digits, before the end token that
    ``token_ids`` appends) and the model's teacher-forced predictions of them."""
    ids = token_ids(text)[:-1]
    return model(input_ids=torch.tensor([ids])).logits[0][-5:-1].argmax(-1).tolist(), ids[-4:]


def read(model, problems: list, token_ids) -> dict:
    """Teacher-forced answer digits on ``problems``: shares of digits, whole values, and first
    digits that are either stated value's; then on the same problems with a decoy's change
    stated last (:func:`decoy_last`): whole values still right, and first digits that are the
    decoy's (about 100% for a model that reads the latest change by position, 0 for one that
    reads by name, 10% for a guess)."""
    digits = whole = either = decoy_whole = decoy_first = 0
    rng = random.Random(0)
    model.eval()
    with torch.no_grad():
        for problem in problems:
            predicted, answer = answer_digits(model, problem.prompt + "answer: " + problem.answer, token_ids)
            right = sum(p == g for p, g in zip(predicted, answer))
            digits, whole = digits + right, whole + (right == 4)
            either += predicted[0] in {token_ids(value)[1] for value in STATED.findall(problem.prompt)}
            prompt, value = decoy_last(problem, rng)
            predicted, answer = answer_digits(model, prompt + "answer: " + problem.answer, token_ids)
            decoy_whole += predicted == answer
            decoy_first += predicted[0] == token_ids(value)[1]
    model.train()
    n = len(problems)
    return {"digit_accuracy": digits / (4 * n), "whole_accuracy": whole / n, "first_digit_either": either / n,
            "decoy_last_whole": decoy_whole / n, "decoy_last_first_digit": decoy_first / n}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    config = recipe(args)
    model, tokenizer, token_ids = fresh_model(config)
    retrieval = next(spec for spec in tiny_long.domains() if spec.name == "long_context:retrieval")
    problems = build_task(retrieval.name, seed=0, **{**retrieval.options, "lengths": [args.length]}
                          ).eval_problems_at(args.problems, args.length)
    optimizer, schedule = optimizer_and_schedule(model, config)
    batches = zip(document_batches(config, token_ids, tokenizer.pad_token_id),
                  copy_batches(config, token_ids, tokenizer.pad_token_id))
    curve, losses, start = [{"step": 0, "wall_s": 0.0, **read(model, problems, token_ids)}], [], time.perf_counter()
    for step, (documents, copies) in zip(range(1, config.steps + 1), batches):
        if step > 1:  # the first step's are dropped by fresh_model
            drop_positions_due(model, config, step - 1)
        losses.append(train_step(model, optimizer, schedule, config, [documents, copies], breaks_of(tokenizer)))
        if step % args.every == 0 or step == config.steps:
            curve.append({"step": step, "wall_s": round(time.perf_counter() - start, 1),
                          "loss": sum(losses[-20:]) / len(losses[-20:]), **read(model, problems, token_ids)})
    return {"length": args.length, "settings": {k: v for k, v in vars(args).items() if k != "threads"},
            "chance": {"digit_accuracy": 0.1, "first_digit_either": 0.2, "decoy_last_first_digit": 0.1}, "curve": curve, "final": curve[-1]}


def main(argv: list[str]) -> None:
    args = parse(argv)
    print(json.dumps({**run(args), "measured": measured("tiny_long_copy", argv)}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
