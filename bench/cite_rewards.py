"""Outcome reward alone against the ``consistency`` reward, on long-context retrieval whose policy
sometimes cites the stale statement and answers right anyway; prints one JSON object.

    python bench/cite_rewards.py [--model DIR] [--steps 100] [--seeds 0,1,2] [--arms outcome,consistency]
                                 [--stale-share 0.5] [--sft-records 4000] [--length 384] [--cite line]
                                 [--combine mix] [--weight 0.5] [--out DIR] [key=value ...] [sft.key=value ...]

The policy: the built-in long model (``builtin:tiny-long``, unless ``--model``) fine-tuned by
``temper sft`` on ``--sft-records`` training problems of ``long_context`` retrieval at
``--length`` characters (a code changed later in the document, its sentences numbered one a
line, ``cite: line``), each answered with the latest value after one ``cite:`` line that names
the stale statement with probability ``--stale-share``, else the latest one
(:func:`cite_records`; ``--cite quote`` quotes the statement instead of naming its line). So it reaches the right answer
as often through a wrong cite as through the right one, and an outcome reward pays both alike.

Arms, ``configs/long.yaml`` otherwise (with :data:`SETTINGS`: 72 new tokens, 128 held-out
problems), one length, the cite task alone (same seed, steps, batch, evaluation):

- ``outcome``: ``exact_match`` 1, the answer alone;
- ``consistency``: the ``consistency`` reward 1 (``combine`` and ``weight`` as given: by
  default half the outcome, half the grounding F1 of the cites).

The task's metric is ``cited_match``, so each evaluation reports held-out accuracy and
``cites_right``, the share of answers right and citing exactly the statement they rest on. Per
arm the JSON gives both after training (the mean over seeds and the half-width of its 95%
t-interval), their change from before, and per seed; under ``checks``, the ``consistency`` arm's
``cites_right`` margin over ``outcome``, the seed spread (the larger of the two arms' ranges over
seeds), whether the margin exceeds it, and the accuracy difference. Runs stay under ``--out``
(the consistency arm under another ``--combine`` or ``--weight`` in its own folder) and a
finished run of the same config is read back (as ``bench/joint.py`` does), so a stopped bench
continues where it stopped and a sweep trains only its consistency runs. ``--weight 0`` is the
control: the consistency reward paying the outcome alone, its runs the outcome arm's.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from joint import earlier_run
from process_rewards import compared
from stages import fine_tuned_once

from tempering.config import load_config
from tempering.policy import resolve_model_path
from tempering.tasks.long_context import LongContextTask
from tempering.train import train

ARMS = {"outcome": {"exact_match": 1.0}, "consistency": {"consistency": 1.0}}
"""Each arm's rewards for the cite task."""
SETTINGS = ["rollout.max_new_tokens=72", "eval.max_new_tokens=72", "eval.problems_per_task=128",
            "eval.problems_per_length=0"]
"""Every run's settings besides the long config's, before the command line's own: room for a
quote and the answer, and 128 held-out problems (at 48 one problem is 2 points)."""
TASK = "long_context"


def task_options(length: int, cite: str) -> dict:
    """The cite task's options: retrieval of a code changed once, at one length, one token a character."""
    return {"kind": "retrieval", "updates": 1, "length_tokens": length, "chars_per_token": 1.0, "cite": cite}


def cite_records(share: float, count: int, length: int, cite: str, path: Path) -> None:
    """``count`` training problems of the cite task for ``temper sft``, each answered with the
    latest value after a cite of the stale statement (probability ``share``) or of the latest one."""
    task = LongContextTask(TASK, 0, **task_options(length, cite))
    rng = random.Random(0)
    with path.open("w") as f:
        for index in range(count):
            problem = task.train_problem(index)
            meta = problem.meta
            cited = meta["decoys"][0] if rng.random() < share else meta["evidence"][0]
            named = f'"{meta["sentences"][cited]}"' if cite == "quote" else cited + 1
            completion = f"cite: {named}\nanswer: {problem.answer}"
            f.write(json.dumps({"prompt": problem.prompt, "completion": completion}) + "\n")


def citing_policy(base: str, share: float, records: int, length: int, cite: str, out: Path,
                  overrides: list[str]) -> str:
    """``base`` fine-tuned on :func:`cite_records` into ``out/cite-sft`` (lr 1e-3, 3 epochs, then
    ``overrides``), unless it finished there on the same records (on others: refused, as
    :func:`earlier_run` refuses another config)."""
    return fine_tuned_once(out / "cite-sft", lambda path: cite_records(share, records, length, cite, path),
                           "another --stale-share, --sft-records, --length or --cite", "long", f"model.path={base}",
                           "sft.lr=1e-3", "sft.epochs=3", "sft.warmup_steps=3", "checkpoint.every=0", *overrides)


def arm_overrides(arm: str, length: int, cite: str, combine: str, weight: float) -> list[str]:
    """The cite task alone, with the arm's rewards.

    >>> arm_overrides("consistency", 384, "line", "mix", 0.5)[0]
    'tasks=[{name: "long_context", options: {kind: retrieval, updates: 1, length_tokens: 384, chars_per_token: 1.0, cite: line}, rewards: {consistency: 1.0}}]'
    """
    options = ", ".join(f"{key}: {value}" for key, value in task_options(length, cite).items())
    rewards = ", ".join(f"{name}: {value}" for name, value in ARMS[arm].items())
    extra = [f"rewards.options.consistency.combine={combine}", f"rewards.options.consistency.weight={weight}"]
    return [f'tasks=[{{name: "{TASK}", options: {{{options}}}, rewards: {{{rewards}}}}}]',
            *(extra if arm == "consistency" else [])]


def run_name(arm: str, seed: int, combine: str, weight: float) -> str:
    """A run's folder under ``--out``: the consistency arm under another ``combine`` or weight than
    the default has its own, so that a sweep reads back the outcome runs it has.

    >>> run_name("outcome", 1, "gate", 0.2), run_name("consistency", 1, "mix", 0.5), run_name("consistency", 1, "mix", 0)
    ('outcome-s1', 'consistency-s1', 'consistency-mix-w0-s1')
    """
    if arm == "outcome" or (combine, weight) == ("mix", 0.5):
        return f"{arm}-s{seed}"
    return f"{arm}-{combine}-w{weight:g}-s{seed}"


def one_run(overrides: list[str], run_dir: Path) -> dict:
    """Accuracy and ``cites_right`` before and after, a run read back where it finished under the same config."""
    config = load_config("long", [*overrides, f"run_dir={run_dir}"])
    summary = earlier_run(config, run_dir) or train(config, progress=False)

    def read(result: dict) -> dict:
        return {"accuracy": result["accuracy"], "cites_right": result["components"][TASK]["cites_right"]}

    return {"before": read(summary["eval_before"]), "after": read(summary["eval_after"]), "wall_s": summary["wall_s"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="the model fine-tuned into the citing policy; default: builtin:tiny-long")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default="outcome,consistency")
    parser.add_argument("--stale-share", type=float, default=0.5,
                        help="share of the fine-tuning answers that cite the stale statement (and answer right)")
    parser.add_argument("--sft-records", type=int, default=4000)
    parser.add_argument("--length", type=int, default=384, help="document length in characters (the model's tokens)")
    parser.add_argument("--cite", default="line", choices=("line", "quote"), help="how an answer names its statements")
    parser.add_argument("--combine", default="mix", choices=("mix", "gate", "grounding"), help="the consistency reward's combine")
    parser.add_argument("--weight", type=float, default=0.5, help="the consistency reward's weight under mix")
    parser.add_argument("--out", default="runs/cite-rewards")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every run (threads=1, eval sizes); "
                        "sft.* ones for the fine-tuning alone")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    if unknown := sorted(set(arms) - set(ARMS)):
        raise SystemExit(f"--arms: unknown arm {unknown[0]!r}; the arms are {', '.join(ARMS)}")
    if not 0 <= args.stale_share <= 1:
        raise SystemExit(f"--stale-share: a share between 0 and 1, got {args.stale_share}")
    if args.sft_records < 1:
        raise SystemExit(f"--sft-records: at least 1, got {args.sft_records}")
    try:  # a length too short for the question and its statements, refused before any pre-training
        LongContextTask(TASK, 0, **task_options(args.length, args.cite))
    except ValueError as error:
        raise SystemExit(f"--length {args.length}: {error}") from None
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = next((o for o in args.overrides if o.startswith("threads=")), "threads=1")
    base = args.model or str(resolve_model_path("builtin:tiny-long", load_config("long", [threads]).pretrain,
                                                progress=True))
    tuning = [o for o in args.overrides if o.startswith("sft.")]
    training = [o for o in args.overrides if o not in tuning]
    model = citing_policy(base, args.stale_share, args.sft_records, args.length, args.cite, out, [threads, *tuning])
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            overrides = [*SETTINGS, *training, f"model.path={model}", f"steps={args.steps}", f"seed={seed}",
                         *arm_overrides(arm, args.length, args.cite, args.combine, args.weight)]
            runs[arm].append(one_run(overrides, out / run_name(arm, seed, args.combine, args.weight)))
    report = {"model": model, "base": base, "stale_share": args.stale_share, "length": args.length, "cite": args.cite,
              "steps": args.steps, "seeds": seeds, "combine": args.combine, "weight": args.weight,
              **compared(runs, "cites_right"), "out": str(out)}
    (out / "cite_rewards.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
