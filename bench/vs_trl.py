"""tempering against TRL's GRPOTrainer on the same model, task and settings; prints one JSON object.

    python bench/vs_trl.py [--models tiny,smollm2] [--bf16] [--no-savings] [--quick]
        [--steps-tiny N] [--steps-smollm2 N] [--seeds-tiny 0,1,2] [--seeds-smollm2 0] [--save DIR]

For each model both sides start from the same weights and train on the same problems (the
first ``steps x prompts`` training problems of tempering's ``add`` task, in order), with the
same prompts per step, group size, maximum completion length, learning rate (constant, no
warm-up), AdamW betas, gradient clipping, sampling temperature, seed, precision, PPO clip
range, token-mean loss, group-normalised advantages, exact-match reward and no KL term.
Both run single-threaded in this one process, TRL first. Seconds per step are the mean over
all steps of a full RL step (sampling, reward, update) and exclude evaluation. Accuracy is
the held-out greedy exact-match rate after training, measured for both by tempering's own
``evaluate`` on the same problems (and once before training, the same for both). Each seed
is a run of both sides (the seed picks the training problems, the start of the random streams
and TRL's seed; the held-out problems are the same for every seed); the top-level numbers
are means over seeds, ``per_seed`` has each run. The
tiny model reaches 99.5-100% here, where one problem is 0.5%, so a single run cannot tell
the sides apart: it is run with three seeds by default.

What cannot be matched exactly is listed under ``"unmatched"`` in the output. ``ratios`` holds
each model's TRL / tempering seconds per step and ``--save DIR`` writes the JSON for
``bench/report.py`` (its convention). Needs ``pip install -e '.[bench]'`` (TRL and datasets).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from report import measured, save

from tempering.config import PretrainConfig, load_config
from tempering.eval.greedy import evaluate
from tempering.policy import load_policy
from tempering.rewards.base import as_result, resolve_reward
from tempering.rollout.hf import HFGenerator
from tempering.tasks import build_task
from tempering.train import train

MODELS = {
    "tiny": {"path": "builtin:tiny", "style": "raw", "max_completion": 48, "steps": 20, "lr": 5e-5,
             "eval_problems": 200, "trl_micro_batch": 64, "token_budget": 0, "reward": "exact_match",
             "reward_options": {}, "seeds": "0,1,2"},
    # one padded forward of all 64 sequences would hold about 16 GB of fp32 activations:
    # both sides accumulate gradients over micro-batches of about 1.5k tokens instead
    # SmolLM2-135M rarely ends with the requested 'answer: N' line (0% exact match before and
    # after training): both sides grade it by the last number it writes instead
    "smollm2": {"path": "builtin:smollm2", "style": "chat", "max_completion": 128, "steps": 3, "lr": 1e-6,
                "eval_problems": 30, "trl_micro_batch": 8, "token_budget": 1536, "reward": "match",
                "reward_options": {"last_number": True}, "seeds": "0"},
}
SHARED = {"prompts_per_step": 8, "group_size": 8, "temperature": 1.0, "betas": (0.9, 0.99),
          "grad_clip": 1.0, "clip": 0.2}
UNMATCHED = [
    "random streams: the samplers draw different completions from the same distribution",
    "sampling loop: TRL calls transformers' generate (left-padded, KV cache); tempering its own KV-cached loop",
    "learner micro-batching: TRL padded micro-batches of trl_micro_batch sequences (gradient accumulation); "
    "tempering packed micro-batches of at most token_budget tokens (0: all sequences), chunked log-probs",
    "optimizer state: both AdamW(eps=1e-8, no weight decay), TRL's through transformers' Trainer",
    "a step of TRL also runs the Trainer's callbacks and metric logging",
    "work done, not settings (each the same numbers up to float summation order; --no-savings turns "
    "the first four off): tempering leaves rows whose advantages are all 0 out of the learner's passes "
    "(learner.skip_zero_advantage), computes identical rows once weighted by their count "
    "(learner.merge_duplicates), runs a prompt once for the rows that share it (learner.share_prompts), "
    "decodes samples with the same tokens so far as one row (rollout.share_decoding), and decodes Llama "
    "models with its own fused steps",
]
SAVINGS = ["learner.skip_zero_advantage", "learner.merge_duplicates", "learner.share_prompts",
           "rollout.share_decoding"]


def _task(spec: dict, seed: int):
    return build_task("add", seed=seed, digits=[2], style=spec["style"], metric=spec["reward"])


def _accuracy(model, tokenizer, spec: dict, seed: int, problems: int, max_new_tokens: int) -> float:
    generator = HFGenerator(model, tokenizer, None, batch_size=256)  # as tempering's eval.batch_size
    return evaluate(generator, [_task(spec, seed)], problems, max_new_tokens,
                    {spec["reward"]: spec["reward_options"]})["accuracy"]


def tempering_overrides(spec: dict, steps: int, bf16: bool, seed: int, savings: bool = True) -> list[str]:
    """``temper train`` overrides that set tempering's side to the settings both sides share."""
    return [
        f"model.path={spec['path']}", f"steps={steps}", f"seed={seed}", "threads=1",
        "tasks=[{name: add, options: {digits: [2], style: " + spec["style"] + ", metric: " + spec["reward"]
        + "}, rewards: {" + spec["reward"] + ": 1.0}}]",
        "rewards.options=" + json.dumps({spec["reward"]: spec["reward_options"]}),
        f"rollout.prompts_per_step={SHARED['prompts_per_step']}", f"rollout.group_size={SHARED['group_size']}",
        f"rollout.max_new_tokens={spec['max_completion']}", f"rollout.temperature={SHARED['temperature']}",
        f"learner.lr={spec['lr']}", "learner.warmup_steps=0", "learner.schedule=constant",
        f"learner.betas=[{SHARED['betas'][0]}, {SHARED['betas'][1]}]", f"learner.grad_clip={SHARED['grad_clip']}",
        f"learner.bf16={str(bf16).lower()}", f"rollout.bf16={str(bf16).lower()}", "learner.micro_batch_size=64",
        f"learner.token_budget={spec['token_budget']}",
        f"algorithm.clip_low={SHARED['clip']}", f"algorithm.clip_high={SHARED['clip']}",
        "algorithm.advantage=grpo", "algorithm.aggregation=token_mean", "algorithm.kl_coef=0",
        f"eval.problems_per_task={spec['eval_problems']}", f"eval.max_new_tokens={spec['max_completion']}",
    ] + ([] if savings else [f"{name}=false" for name in SAVINGS])


def train_tempering(overrides: list[str]) -> tuple[dict, list[dict]]:
    """One ``temper train`` run in a scratch folder: its summary and its step records."""
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(load_config(None, [*overrides, f"run_dir={run_dir}"]), progress=False)
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return summary, records


def run_tempering(spec: dict, steps: int, bf16: bool, seed: int, savings: bool = True) -> dict:
    summary, records = train_tempering(tempering_overrides(spec, steps, bf16, seed, savings))
    return {"s_per_step": statistics.fmean(r["step_s"] for r in records),
            "split": {key: statistics.fmean(r[key] for r in records) for key in ("generate_s", "reward_s", "learn_s")},
            "rows_left_out": {key: statistics.fmean(r[key] for r in records) for key in ("skipped_rows", "merged_rows")},
            "accuracy_before": summary["eval_before"]["accuracy"], "accuracy": summary["eval_after"]["accuracy"]}


def train_trl(spec: dict, steps: int, bf16: bool, seed: int, callbacks: list) -> tuple[object, object, float]:
    """TRL's GRPOTrainer run for ``steps`` steps on the problems and settings tempering's side
    gets, with ``callbacks``: the trained model, its tokenizer and the ``perf_counter`` time at
    which ``train()`` was called. The Trainer's own prints go to stderr: stdout carries the JSON."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    task = _task(spec, seed)
    problems = [task.train_problem(i) for i in range(steps * SHARED["prompts_per_step"])]
    dataset = Dataset.from_list([{"prompt": p.prompt, "index": i} for i, p in enumerate(problems)])
    grade = functools.partial(resolve_reward(spec["reward"]), **spec["reward_options"])

    def reward(prompts, completions, index, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [as_result(grade(problems[i], text)).score for i, text in zip(index, texts)]

    reward.__name__ = spec["reward"]  # TRL logs rewards under the function's name

    model, tokenizer, _ = load_policy(spec["path"], "float32", PretrainConfig(), progress=False)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=steps, seed=seed, use_cpu=True, bf16=bf16,
            per_device_train_batch_size=spec["trl_micro_batch"],
            gradient_accumulation_steps=SHARED["prompts_per_step"] * SHARED["group_size"] // spec["trl_micro_batch"],
            num_generations=SHARED["group_size"], max_completion_length=spec["max_completion"],
            temperature=SHARED["temperature"], top_p=1.0, top_k=0,
            learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
            adam_beta1=SHARED["betas"][0], adam_beta2=SHARED["betas"][1], weight_decay=0.0,
            max_grad_norm=SHARED["grad_clip"], epsilon=SHARED["clip"], beta=0.0, loss_type="dapo",
            scale_rewards="group", gradient_checkpointing=False, shuffle_dataset=False,
            report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=callbacks)
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            trainer.train()
    model.eval()
    return model, tokenizer, start


def run_trl(spec: dict, steps: int, bf16: bool, seed: int) -> dict:
    from transformers import TrainerCallback

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    model, tokenizer, start = train_trl(spec, steps, bf16, seed, [StepClock()])
    durations = [b - a for a, b in zip([start] + ends, ends)]
    return {"s_per_step": statistics.fmean(durations),
            "accuracy": _accuracy(model, tokenizer, spec, seed, spec["eval_problems"],
                                  spec["max_completion"])}


def trl_version() -> str:
    """TRL's version, once its trainer imports; else exit 2 with why, before any run.

    Any exception counts, not only ImportError: a module that shadows a package TRL probes
    for (a stray ``vllm.py``) made its import raise ``ValueError: Invalid version``."""
    try:
        import datasets  # noqa: F401
        import trl
        from trl import GRPOTrainer  # noqa: F401
    except Exception as err:
        print(f"bench/vs_trl.py: TRL cannot be imported ({type(err).__name__}: {err}); the peer side needs "
              "the bench extra: pip install -e '.[bench]'", file=sys.stderr)
        sys.exit(2)
    return trl.__version__


def seed_list(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]`` (argparse reports a ValueError as a bad value)."""
    return [int(seed) for seed in text.split(",")]


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 steps, few evaluation problems")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast on both sides (TRL's default)")
    parser.add_argument("--no-savings", action="store_true",
                        help="also time tempering with " + ", ".join(SAVINGS) + " off (tempering_no_savings_s_per_step)")
    parser.add_argument("--save", help="folder to save the JSON in for bench/report.py")
    for name, spec in MODELS.items():
        parser.add_argument(f"--steps-{name}", type=int, default=spec["steps"])
        parser.add_argument(f"--seeds-{name}", type=seed_list, default=seed_list(spec["seeds"]),
                            help="comma-separated integers")
    options = parser.parse_args(argv)
    version = trl_version()
    torch.set_num_threads(1)
    result: dict = {"trl_version": version, "threads": 1, "precision": "bf16 autocast" if options.bf16
                    else "fp32", "settings": {**SHARED, "betas": list(SHARED["betas"])}, "unmatched": UNMATCHED,
                    "ratios": [], "measured": measured("vs_trl", argv)}
    for name in options.models.split(","):
        spec = dict(MODELS[name])
        steps = getattr(options, f"steps_{name}")
        if options.quick:
            steps, spec["eval_problems"] = 2, 8
            setattr(options, f"seeds_{name}", getattr(options, f"seeds_{name}")[:1])
        seeds = getattr(options, f"seeds_{name}")
        runs = []
        for seed in seeds:
            trl_side = run_trl(spec, steps, options.bf16, seed)
            ours = run_tempering(spec, steps, options.bf16, seed)
            plain = run_tempering(spec, steps, options.bf16, seed, savings=False) if options.no_savings else None
            runs.append({
                "seed": seed, "tempering_s_per_step": ours["s_per_step"], "trl_s_per_step": trl_side["s_per_step"],
                "tempering_accuracy": ours["accuracy"], "trl_accuracy": trl_side["accuracy"],
                "accuracy_before": ours["accuracy_before"], "tempering_split_s": ours["split"],
                "tempering_rows_left_out_per_step": ours["rows_left_out"],
                **({"tempering_no_savings_s_per_step": plain["s_per_step"],
                    "tempering_no_savings_accuracy": plain["accuracy"]} if plain else {}),
            })

        def mean(key: str) -> float:
            return statistics.fmean(run[key] for run in runs)

        result[name] = {
            "tempering_s_per_step": mean("tempering_s_per_step"), "trl_s_per_step": mean("trl_s_per_step"),
            "ratio": mean("trl_s_per_step") / mean("tempering_s_per_step"),
            "tempering_accuracy": mean("tempering_accuracy"), "trl_accuracy": mean("trl_accuracy"),
            **({"tempering_no_savings_s_per_step": mean("tempering_no_savings_s_per_step"),
                "tempering_no_savings_accuracy": mean("tempering_no_savings_accuracy")} if options.no_savings else {}),
            "seeds": seeds, "per_seed": runs, "steps": steps, "max_completion_length": spec["max_completion"],
            "learning_rate": spec["lr"], "eval_problems": spec["eval_problems"], "reward": spec["reward"],
            "reward_options": spec["reward_options"],
            "trl_micro_batch": spec["trl_micro_batch"], "token_budget": spec["token_budget"],
        }
        result["ratios"].append({"what": f"seconds per RL step, {name} ({result['precision']}, {steps} steps, "
                                 f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}, one thread)",
                                 "ratio": result[name]["ratio"], "peer": "TRL"})
    if options.save:
        save(result, options.save, "-".join(options.models.split(",")) + ("-bf16" if options.bf16 else ""))
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=2))
