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
from tempering.faults import TrainingDiverged, WorkerLost  # noqa: E402
from tempering.rm import add_parser as add_rm_parser  # noqa: E402
from tempering.sandbox.cli import add_parser as add_sandbox_parser  # noqa: E402

USER_ERROR = 2


def _split_config_args(items: list[str]) -> tuple[Optional[str], list[str]]:
    """``[CONFIG] [key=value ...]``: the first item is a config file unless it holds '='."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _load(items: list[str], run_dir: Optional[str] = None):
    path, overrides = _split_config_args(items)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"expected key=value overrides after the config file, got {bad[0]!r}")
    if run_dir:
        # quoted, so that a folder named like 2024-06-01 or 'null' stays the string it is
        overrides.append(f"run_dir={json.dumps(run_dir)}")
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
        train(_load(args.config_and_overrides, args.run_dir), progress=not args.quiet)
        return
    train(_resumed_config(args, args.config_and_overrides, movable=MOVABLE), progress=not args.quiet, resume=True)


MOVABLE = ("rollout.server.url", "pipeline.ray_address")
"""What ``temper train --resume`` may be told beside the run folder: where the run's servers and
Ray cluster are now (restarted on other machines or ports). Nothing that changes what the run
computes; the run's config.yaml keeps the addresses it started with."""


def _resumed_config(args: argparse.Namespace, extra: list[str], movable: tuple[str, ...] = ()):
    """The saved config of the run ``--resume`` names, with ``extra`` overrides of ``movable``
    keys; any other argument beside it is refused."""
    run_dir = Path(args.resume)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"--resume {run_dir}: not a run folder (no config.yaml in it)")
    refused = [item for item in extra if item.partition("=")[0] not in movable or "=" not in item]
    if refused or args.run_dir:
        allowed = f" (only {', '.join(movable)} may be given, for servers that moved)" if movable else ""
        raise ConfigError(f"--resume continues a run with its own saved config; drop {refused[0] if refused else '--run-dir'}"
                          f"{allowed}")
    # read the saved config alone only when a server is named: a null section cannot take one
    if any(item.startswith("rollout.server.") for item in extra) and load_config(saved).rollout.server is None:
        raise ConfigError(f"--resume {run_dir}: this run sampled in its own process (its rollout.server is null); "
                          "a server would be another sampler, not the same run moved: start a new run with "
                          "rollout.server.url=... instead")
    return load_config(saved, [*extra, f"run_dir={json.dumps(str(run_dir))}"])


def cmd_sft(args: argparse.Namespace) -> int:
    from tempering.sft import sft

    if args.resume is not None:
        sft(_resumed_config(args, args.items), progress=not args.quiet, resume=True)
        return 0
    if not args.items or "=" in args.items[0]:
        raise ConfigError("temper sft needs the training records first: temper sft DATA.jsonl [CONFIG] [key=value ...]")
    sft(_load([*args.items[1:], f"sft.data={json.dumps(args.items[0])}"], args.run_dir), progress=not args.quiet)
    return 0


def cmd_dpo(args: argparse.Namespace) -> int:
    from tempering.dpo import dpo

    if args.resume is not None:
        dpo(_resumed_config(args, args.items), progress=not args.quiet, resume=True)
        return 0
    if not args.items or "=" in args.items[0]:
        raise ConfigError("temper dpo needs the preference records first: temper dpo PAIRS.jsonl [CONFIG] "
                          "[key=value ...] (or builtin:arithmetic)")
    dpo(_load([*args.items[1:], f"dpo.pairs={json.dumps(args.items[0])}"], args.run_dir), progress=not args.quiet)
    return 0


def cmd_pretrain(args: argparse.Namespace) -> int:
    from tempering.pretrain import builtin_pretrain, ensure_pretrained

    config = _load(args.config_and_overrides)
    recipe = builtin_pretrain(config.model.path, config.pretrain)
    path = ensure_pretrained(recipe, progress=not args.quiet, force=args.force, threads=config.threads)
    stats = json.loads((path / "pretrain.json").read_text())["stats"]
    print(json.dumps({"model_dir": str(path), **stats}, indent=2))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from tempering.explain import explain

    print(explain(_load(args.config_and_overrides), probe=args.probe))
    return 0


def _is_config(item: str) -> bool:
    """A YAML file, or the name of a config shipped with tempering (``quickstart``) when no
    file or folder of that name exists here."""
    from tempering.config import shipped_config

    return item.endswith((".yaml", ".yml")) or shipped_config(item) is not None


def _model_inputs(items: list[str], model: Optional[str] = None, config: Optional[str] = None
                  ) -> tuple[Optional[str], Optional[str], list[str]]:
    """``(model, config file, overrides)`` from ``[MODEL] [CONFIG] [key=value ...]`` in any
    order (an item holding '=' is an override, a ``.yaml`` or shipped config name is the
    config, anything else the model) and the ``--model`` and ``--config`` flags."""
    models, configs, overrides = [], [], []
    for item in items:
        (overrides if "=" in item else configs if _is_config(item) else models).append(item)
    models += [model] if model else []
    configs += [config] if config else []
    for kind, found in (("model", models), ("config", configs)):
        if len(found) > 1:
            raise ConfigError(f"more than one {kind} given ({', '.join(found)}); name one")
    return (models or [None])[0], (configs or [None])[0], overrides


def _eval_inputs(args: argparse.Namespace) -> tuple[Optional[str], Optional[str], list[str]]:
    """:func:`_model_inputs` of ``temper eval``, plus the flags that set a config key."""
    model, config, overrides = _model_inputs(args.inputs, args.model, args.config)
    for flag, key in (("problems", "eval.problems_per_task"), ("max_new_tokens", "eval.max_new_tokens"),
                      ("temperature", "rollout.temperature")):
        if getattr(args, flag) is not None:
            overrides.append(f"{key}={getattr(args, flag)}")
    return model, config, overrides


def cmd_eval(args: argparse.Namespace) -> int:
    from tempering.eval_model import evaluate_model

    return evaluate_model(args, *_eval_inputs(args))


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a model over HTTP until interrupted (``tempering.serve_model``)."""
    from tempering.serve_model import serve_model

    return serve_model(args, *_model_inputs(args.inputs))


def cmd_prm_label(args: argparse.Namespace) -> int:
    """Label step prefixes by sampled continuations (``tempering.prm_label``)."""
    from tempering.eval_model import select_tasks
    from tempering.prm_label import LabelSettings, label_from_config

    model, config_path, overrides = _model_inputs(args.inputs, args.model, args.config)
    config = select_tasks(load_config(config_path, overrides), args.tasks)
    settings = LabelSettings(problems=args.problems, solutions=args.solutions, continuations=args.continuations,
                             temperature=config.rollout.temperature if args.temperature is None else args.temperature,
                             top_p=config.rollout.top_p, max_new_tokens=args.max_new_tokens or config.rollout.max_new_tokens,
                             seed=config.seed)
    print(json.dumps(label_from_config(config, model, Path(args.out), settings, progress=not args.quiet), indent=2))
    return 0


def cmd_prm_train(args: argparse.Namespace) -> int:
    """Train a process reward model on a labels file (``tempering.prm``)."""
    from tempering.prm import PRMSettings, read_labels, train_prm
    from tempering.threads import auto_threads, set_torch_threads

    set_torch_threads(args.threads or auto_threads())
    settings = PRMSettings(base=args.base, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                           heldout=args.heldout, target=args.target, max_length=args.max_length,
                           max_steps=args.max_steps, seed=args.seed)
    settings.check()

    def progress(step: int, loss: float) -> None:
        if not args.quiet and step % 10 == 0:
            print(f"step {step}  loss {loss:.4f}", file=sys.stderr, flush=True)

    report = train_prm(read_labels(Path(args.labels)), Path(args.out), settings, progress)
    print(json.dumps({k: v for k, v in report.items() if k != "settings"}, indent=2))
    return 0


def _add_prm_parser(sub) -> None:
    """``temper prm label|train``: a process reward model from sampled step labels."""
    from tempering.prm import TARGETS, PRMSettings
    from tempering.prm_label import LabelSettings

    prm = sub.add_parser("prm", help="a process reward model: label steps by sampled continuations, train on them",
                         description="Label each step of sampled solutions by whether continuations from it reach "
                                     "a right answer, and train a process reward model on those labels.")
    commands = prm.add_subparsers(dest="prm_command", required=True, metavar="COMMAND")
    marks = LabelSettings()
    label = commands.add_parser("label", help="step labels from sampled continuations, graded by each task's metric")
    label.add_argument("inputs", nargs="*", metavar="[MODEL] [CONFIG] [key=value ...]",
                       help="the policy that samples (default: the config's model.path), a YAML config or shipped "
                            "config name (default: quickstart) and dotted overrides, in any order")
    label.add_argument("--model", help="the model, as MODEL")
    label.add_argument("--config", help="the config, as CONFIG")
    label.add_argument("--tasks", metavar="T1,T2", help="label these tasks, with the options the config gives them")
    label.add_argument("--out", default="runs/prm-labels.jsonl",
                       help="JSONL to write; an existing one written with the same settings is continued "
                            "(default runs/prm-labels.jsonl)")
    label.add_argument("--problems", type=int, default=marks.problems, help=f"training problems per task (default {marks.problems})")
    label.add_argument("--solutions", type=int, default=marks.solutions,
                       help=f"solutions sampled per problem (default {marks.solutions})")
    label.add_argument("--continuations", type=int, default=marks.continuations,
                       help=f"completions sampled after each step (default {marks.continuations})")
    label.add_argument("--temperature", type=float, help="sampling temperature (default: rollout.temperature)")
    label.add_argument("--max-new-tokens", type=int, help="longest solution or continuation (default: rollout.max_new_tokens)")
    label.add_argument("--quiet", action="store_true", help="no progress bar")
    label.set_defaults(func=cmd_prm_label, items_into="inputs")

    defaults = PRMSettings()
    train = commands.add_parser("train", help="train a process reward model on a labels file")
    train.add_argument("labels", help="the JSONL temper prm label wrote")
    train.add_argument("--out", default="runs/prm", help="output model directory (default runs/prm)")
    train.add_argument("--base", default=defaults.base,
                       help="base causal LM: builtin:tiny, a directory, a .gguf file or a hub id (default builtin:tiny)")
    train.add_argument("--target", choices=TARGETS, default=defaults.target,
                       help="train towards the soft label (share of continuations right) or the hard one (any right)")
    train.add_argument("--epochs", type=int, default=defaults.epochs, help=f"passes over the labels (default {defaults.epochs})")
    train.add_argument("--batch-size", type=int, default=defaults.batch_size, help="solutions per step")
    train.add_argument("--lr", type=float, default=defaults.lr, help="AdamW learning rate")
    train.add_argument("--heldout", type=float, default=defaults.heldout,
                       help=f"share of problems held out for step accuracy and AUC (default {defaults.heldout})")
    train.add_argument("--max-length", type=int, default=defaults.max_length, help="tokens per solution, the prompt's start cut beyond")
    train.add_argument("--max-steps", type=int, default=defaults.max_steps, help="stop after this many steps; 0 = no limit")
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = the free cores")
    train.add_argument("--quiet", action="store_true", help="no progress lines")
    train.set_defaults(func=cmd_prm_train)


def cmd_report(args: argparse.Namespace) -> int:
    from tempering.reporting.html import build_report

    out = Path(args.out) if args.out else Path(args.runs[0]) / "report.html"
    if not out.resolve().parent.is_dir():
        raise ConfigError(f"--out {out}: its folder does not exist")
    print(f"report: {build_report(args.runs, out)}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Arguments in any order around the flags: a ``nargs="*"`` positional takes only the run of
    items before the first flag, so ``temper train steps=1 --quiet seed=3`` would leave
    ``seed=3`` unrecognized; the items left over join the positional list that the command
    names in its ``items_into`` default, after the ones before the flag. Unknown flags, and
    items left over in a command without such a list, are still refused."""

    def parse_args(self, args=None, namespace=None):
        parsed, rest = self.parse_known_args(args, namespace)
        into = getattr(parsed, "items_into", None)
        if rest and (into is None or any(item.startswith("-") for item in rest)):
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        if rest:
            getattr(parsed, into).extend(rest)
        return parsed


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config_and_overrides", nargs="*", metavar="[CONFIG] [key=value ...]",
        help="a YAML config (default: the built-in quickstart) and dotted overrides, e.g. rollout.group_size=8",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    parser.set_defaults(items_into="config_and_overrides")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="temper", description="RL post-training with verifiable rewards")
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
    sft.set_defaults(func=cmd_sft, items_into="items")

    dpo = sub.add_parser("dpo", help="offline preference optimisation: DPO, IPO, SimPO or KTO on preference records")
    dpo.add_argument("items", nargs="*", metavar="PAIRS.jsonl [CONFIG] [key=value ...]",
                     help="preference records (.jsonl, .parquet, a saved dataset, or builtin:arithmetic), then a YAML "
                          "config and dotted overrides (dpo.loss=ipo)")
    dpo.add_argument("--quiet", action="store_true", help="no progress bars or tables")
    dpo.add_argument("--run-dir", help="output folder (default: a new folder under runs/)")
    dpo.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest complete checkpoint")
    dpo.set_defaults(func=cmd_dpo, items_into="items")

    pretrain = sub.add_parser("pretrain", help="pre-train the built-in tiny model into the cache (with "
                              "model.path=builtin:generalist or builtin:tiny-long: that model, by its recipe)")
    _add_config_args(pretrain)
    pretrain.add_argument("--force", action="store_true", help="pre-train again even if cached")
    pretrain.set_defaults(func=cmd_pretrain)

    explain = sub.add_parser("explain", help="what a config will do, before it runs: batch arithmetic, "
                             "off-policyness, memory and time estimates, known traps")
    explain.add_argument("config_and_overrides", nargs="*", metavar="[CONFIG] [key=value ...]",
                         help="a YAML config (default: the built-in quickstart) and dotted overrides")
    explain.add_argument("--probe", type=int, default=8, metavar="N",
                         help="greedy-answer N held-out problems per task to catch a task the model scores 0 on "
                              "and answers cut off (default 8; 0 = no probe)")
    explain.set_defaults(func=cmd_explain, items_into="config_and_overrides")

    evaluate = sub.add_parser(
        "eval", help="held-out accuracy of a model: greedy, and with --n samples per problem pass@k, maj@k, best-of-k")
    evaluate.add_argument(
        "inputs", nargs="*", metavar="[MODEL] [CONFIG] [key=value ...]",
        help="a model (builtin:tiny, builtin:generalist, builtin:tiny-long, builtin:smollm2, a folder, a .gguf, a hub id; default: the config's model.path), "
             "a YAML config or shipped config name (default: quickstart) and dotted overrides, in any order")
    evaluate.add_argument("--model", help="the model, as MODEL")
    evaluate.add_argument("--config", help="the config, as CONFIG")
    evaluate.add_argument("--tasks", metavar="T1,T2", help="evaluate these tasks (add, mul, rg:<type>, humaneval, ...), "
                          "with the options the config gives a task of that name")
    evaluate.add_argument("--n", type=int, help="samples per problem for pass@k, maj@k and best-of-k (default: greedy only)")
    evaluate.add_argument("--k", metavar="1,5", help="the k of each metric, at most --n (default: 1 and --n)")
    evaluate.add_argument("--temperature", type=float, help="sampling temperature (default: rollout.temperature)")
    evaluate.add_argument("--max-new-tokens", type=int, help="completion length limit (default: eval.max_new_tokens)")
    evaluate.add_argument("--problems", type=int, help="held-out problems per task (default: eval.problems_per_task)")
    evaluate.add_argument("--best-of", action="append", metavar="verifier|rm:PATH|prm:PATH",
                          help="also best-of-k picked by the task's grader (an oracle), by a reward model or by a "
                               "process reward model (aggregation: rewards.options.process_model); repeatable")
    evaluate.add_argument("--json", metavar="OUT", help="write the full result as JSON to OUT (- for stdout, "
                          "the table then going to stderr)")
    evaluate.add_argument("--quiet", action="store_true", help="no progress bars")
    evaluate.set_defaults(func=cmd_eval, items_into="inputs")

    report = sub.add_parser("report", help="one self-contained HTML page of plots, rollouts and config of one or more runs")
    report.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders; several are overlaid, one colour each")
    report.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html of the first run)")
    report.set_defaults(func=cmd_report)
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API with exact token ids, "
                                         "log-probs and weight reloads")
    serve.add_argument("inputs", nargs="*", metavar="MODEL [CONFIG] [key=value ...]",
                       help="the model (as for temper eval; default: the config's model.path), a YAML config "
                            "(its model and rollout sections) and dotted overrides, in any order")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1); "
                       "another than a loopback one needs --api-key")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 = any free port, printed)")
    serve.add_argument("--name", help="the model's name in the API (default: MODEL as given)")
    serve.add_argument("--api-key", help="bearer token every request must carry (default: $TEMPER_SERVE_API_KEY; "
                       "none on a loopback address)")
    serve.add_argument("--max-request-tokens", type=int, metavar="N",
                       help="token positions one request may ask for (prompts x n x (prompt + max_tokens)); "
                            "more is refused with 400 (default: 262144)")
    serve.add_argument("--max-queued-tokens", type=int, metavar="N",
                       help="token positions queued or sampling, all requests together; a request past it gets 429 "
                            "(default: 2097152)")
    serve.add_argument("--quiet", action="store_true", help="no progress bars")
    serve.set_defaults(func=cmd_serve, items_into="inputs")

    add_sandbox_parser(sub)
    add_rm_parser(sub)
    _add_prm_parser(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    from tempering.checkpoint import StorageError
    from tempering.models.loading import ModelLoadError
    from tempering.rollout.remote import ServerError

    try:
        status = args.func(args)
    except (ConfigError, ModelLoadError, StorageError, ServerError) as exc:
        print(f"temper {args.command}: {exc}", file=sys.stderr)
        status = USER_ERROR
    except (TrainingDiverged, WorkerLost) as exc:
        print(f"temper {args.command}: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print(f"temper {args.command}: interrupted", file=sys.stderr)
        status = 130
    sys.exit(status)


if __name__ == "__main__":
    main()
