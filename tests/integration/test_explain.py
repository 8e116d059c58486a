"""`temper explain`: the batch arithmetic it prints is what a real run then does, and it runs on
every shipped config (printing the arithmetic even where the model cannot be inspected)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tempering.config import load_config
from tempering.explain import explain

SHIPPED = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "src/tempering/configs").glob("*.yaml"))
RUN = ["steps=2", "threads=1", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16",
       "eval.problems_per_task=2", "eval.max_new_tokens=16", "learner.ppo_epochs=2", "learner.mini_batches=2",
       "learner.micro_batch_size=3", "learner.skip_zero_advantage=false", "learner.merge_duplicates=false"]


def number(text: str, pattern: str) -> int:
    return int(re.search(pattern, text).group(1))


def test_explained_updates_and_micro_batches_are_what_a_real_run_does(tmp_path: Path, tiny_model_dir: Path):
    overrides = [*RUN, f"model.path={tiny_model_dir}"]
    text = explain(load_config(None, overrides))
    assert "could not be inspected" not in text and "learner time: about" in text and "memory: about" in text
    updates, micro = number(text, r"updates per step: (\d+)"), number(text, r"micro-batches per update: at most (\d+)")
    assert (updates, micro) == (4, 3)  # 2 epochs x 2 mini-batches of 8 rollouts, 3 rows per micro-batch

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "tempering.cli", "train", "--quiet", *overrides, "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["updates"] == updates and record["micro_batches"] == micro


def test_a_token_budget_is_planned_as_the_learner_plans_it(tiny_model_dir: Path):
    text = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", "learner.token_budget=100"]))
    assert "token budget 100 tokens, learner.token_budget" in text
    assert number(text, r"micro-batches per update: at most (\d+)") > 1


def test_prompts_are_planned_as_shared_under_gradient_checkpointing_as_the_learner_shares_them(tiny_model_dir: Path):
    """Under checkpointing the learner shares a Llama's prompts layer by layer
    (can_share_prompts reads checkpointing off the model, which the learner, not the loader,
    sets up; explain passes it), and explain's plan says so."""
    from tempering.explain import inspect_model

    base = [*RUN, f"model.path={tiny_model_dir}"]
    assert inspect_model(load_config(None, base)).share_prompts
    assert inspect_model(load_config(None, [*base, "learner.gradient_checkpointing=true"])).share_prompts


def test_learner_time_counts_a_groups_prompt_once_where_the_learner_shares_it(tiny_model_dir: Path):
    """The learner-time estimate scales by the tokens the learner runs (learner_tokens): with
    shared prompts a group's prompt once, which the sentence names; without, every row's."""
    base = [*RUN, f"model.path={tiny_model_dir}"]
    shared = explain(load_config(None, base))
    assert "each group's prompt computed once" in shared
    assert "each group's prompt computed once" not in explain(load_config(None, [*base, "learner.share_prompts=false"]))


def test_a_learner_step_estimated_over_the_machines_memory_is_a_warning_naming_the_fix(tiny_model_dir: Path,
                                                                                     monkeypatch):
    """A learner step estimated over the machine's memory would be killed at the first
    update (smollm2-many without a memory budget reached 21.7 GB resident and was killed beside
    a 6 GB bench): explain says so, and what to set; under the memory it says nothing."""
    import tempering.explain as explain_module

    base = [*RUN, f"model.path={tiny_model_dir}"]
    estimate = float(re.search(r"memory: about ([\d.]+) GB", explain(load_config(None, base))).group(1))
    warning = "more than this machine's"
    monkeypatch.setattr(explain_module, "physical_memory_bytes", lambda: int(estimate * 1024**3 * 2))
    assert warning not in explain(load_config(None, base))
    monkeypatch.setattr(explain_module, "physical_memory_bytes", lambda: int(estimate * 1024**3 / 2))
    text = explain(load_config(None, base))
    assert warning in text and "learner.memory_budget_gb" in text


def test_prompts_are_planned_at_a_curriculums_last_level_and_not_from_evaluation_only_tasks(tiny_model_dir: Path):
    """A step reaches the curriculum's longest prompts; a weight-0 task is never drawn."""
    from tempering.explain import inspect_model

    tasks = ('tasks=[{"name": "long_context:c", "options": {"lengths": [96, 160], "chars_per_token": 1.0}},'
             ' {"name": "long_context:far", "weight": 0, "options": {"length_tokens": 240, "chars_per_token": 1.0}}]')
    tokens = inspect_model(load_config(None, [*RUN, f"model.path={tiny_model_dir}", tasks])).prompt_tokens
    assert 120 < tokens <= 162, tokens


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if "smollm2" in n else n for n in SHIPPED])
def test_explain_runs_on_every_shipped_config(name: str, tempering_cache):
    proc = subprocess.run([sys.executable, "-m", "tempering.cli", "explain", name, "threads=1"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"step: \d+ prompts x \d+ samples = \d+ rollouts", proc.stdout)
    assert re.search(r"updates per step: \d+", proc.stdout) and "micro-batches per update: at most" in proc.stdout
    assert "model: " in proc.stdout  # inspected, or saying why not


class OneTurn:
    """The smallest environment: the episode ends after the model's first turn."""

    def reset(self, problem):
        return problem.prompt

    def step(self, completion):
        from tempering.envs import Step

        return Step(done=True)


def test_known_traps_are_warned_about(tiny_model_dir: Path):
    env = f"{{name: '{__name__}:OneTurn', max_turns: 40}}"
    text = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", "eval.max_new_tokens=8",
                                      f"tasks=[{{name: add, env: {env}}}]"]))
    assert "warning: eval.max_new_tokens=8 is shorter than rollout.max_new_tokens=16" in text
    assert re.search(r"warning: task add: an episode may reach \d+ prompt \+ 640 tokens", text)


def test_the_probe_warns_of_a_task_scored_0_and_of_answers_cut_off(tiny_model_dir: Path):
    """Four new tokens hold no answer: every probe answer is cut off and scores 0."""
    text = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", "eval.max_new_tokens=4",
                                      "tasks=[{name: add}]"]), probe=6)
    assert "warning: task add: the model scores 0 on 6 held-out problems (greedy)" in text
    assert "warning: task add: 6 of 6 greedy answers reached eval.max_new_tokens=4" in text
    assert "by a probe of 6 held-out problems per task" in text
    quiet = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", "eval.max_new_tokens=4",
                                       "tasks=[{name: add}]"]), probe=0)
    assert "scores 0" not in quiet.replace("whether the model scores 0 on a task", "")


def test_the_sampler_line_says_which_products_it_uses_and_when_vllm_is_faster(tiny_model_dir: Path):
    for onednn, products in [("false", "MKL's, as the learner's"), ("true", "oneDNN's (rollout.onednn=true)"),
                             ("auto", "oneDNN's for models at least 512 wide, else MKL's")]:
        text = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", f"rollout.onednn={onednn}"]))
        line = next(line for line in text.splitlines() if "sampler:" in line)
        assert f"the built-in sampler, float32 products {products}" in line
        assert "1.1-1.3x faster with oneDNN's products than vLLM in-process" in line


def test_the_numbers_line_says_what_the_run_computes_in_and_what_precision_chose(tiny_model_dir: Path):
    def line(*overrides: str) -> str:
        text = explain(load_config(None, [*RUN, f"model.path={tiny_model_dir}", *overrides]), probe=0)
        return next(line for line in text.splitlines() if line.startswith("numbers:"))

    assert line() == ("numbers: learner float32, sampler float32 (learner.bf16, rollout.bf16; "
                      "precision=auto chooses for this CPU)")
    assert "learner bf16 autocast, sampler float32" in line("learner.bf16=true")
    assert line("precision=fp32").startswith("numbers: learner and sampler in float32")
    bf16 = line("precision=bf16")
    assert bf16.startswith("numbers: learner and sampler in bf16 autocast (")
