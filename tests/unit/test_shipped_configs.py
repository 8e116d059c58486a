"""Every shipped config for the built-in tiny model (or the generalist, the same model
pre-trained otherwise) asks only for prompts its context holds: a prompt longer than the
model's positions less the tokens it may generate stops the run at the step that first draws
it (``rollout.prompts``), long after the command was typed."""

from __future__ import annotations

import random

import pytest

from tempering.build import build_tasks
from tempering.config import builtin_config, load_config
from tempering.models.tiny import build_tokenizer
from tempering.pretrain import PRETRAINED_BUILTINS, builtin_pretrain
from tempering.rollout.prompts import prompt_limit

DRAWS = 2000
"""Training problems drawn per task (every held-out problem the config evaluates is checked)."""

CONFIGS = sorted(p.stem for p in builtin_config("quickstart").parent.glob("*.yaml"))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_shipped_config_for_the_tiny_model_never_draws_a_prompt_over_its_context(name):
    config = load_config(builtin_config(name))
    if config.model.path not in PRETRAINED_BUILTINS:
        pytest.skip(f"{name} does not train the built-in tiny model or the generalist")
    tokenizer = build_tokenizer()
    pretrain = builtin_pretrain(config.model.path, config.pretrain)
    context = type("Context", (), {"max_position_embeddings": pretrain.max_positions})
    longest: dict[str, tuple[int, int]] = {}
    for task in build_tasks(config):
        for stage, max_new, problems in [
                ("train", config.rollout.max_new_tokens, (task.train_problem(i) for i in range(DRAWS))),
                ("eval", config.eval.max_new_tokens, task.eval_problems(config.eval.problems_per_task))]:
            limit = prompt_limit(context, config.rollout.max_prompt_tokens, max_new)
            length = max(len(tokenizer(p.prompt)["input_ids"]) for p in problems)
            if length > limit:
                longest[f"{task.name} ({stage})"] = (length, limit)
    assert longest == {}, f"prompt tokens over the limit (length, limit): {longest}"


def _transcript_turns(task, draws: int) -> dict[str, str]:
    """The longest model turn (a tool call) of ``task``'s pre-training transcripts, by kind of
    instance, over ``draws`` training problems and with and without each mistake."""
    from tempering.tasks.repo_corpus import Mistakes, episode_calls

    longest: dict[str, str] = {}
    for index in range(draws):
        problem = task.train_problem(index)
        kind = problem.id.rsplit("-", 1)[0]
        for naive, wrong_span in ((0, 0), (1, 0), (0, 1)):
            for call in episode_calls(problem, random.Random(index), Mistakes(naive, 0, wrong_span)):
                longest[kind] = max(longest.get(kind, ""), call, key=len)
    return longest


@pytest.mark.parametrize("name", [n for n in CONFIGS if "corpus_env" in builtin_config(n).read_text()])
def test_a_shipped_config_lets_a_turn_write_every_tool_call_its_pre_training_transcripts_hold(name):
    """A turn is cut at ``max_new_tokens``: a config whose budget is below the longest call its
    model was pre-trained to write makes the right answer to some instances impossible (the
    repo config's 200 cut the right fix of three defects, so RL could never reward it)."""
    config = load_config(builtin_config(name))
    tokenizer = build_tokenizer()
    corpus_tasks = {t.name for t in config.pretrain.tasks if "corpus_env" in t.options}
    over = {}
    for task in build_tasks(config):
        if task.name not in corpus_tasks:
            continue
        for kind, call in _transcript_turns(task, 300).items():
            tokens = len(tokenizer(call, add_special_tokens=False)["input_ids"])
            for stage, budget in (("rollout", config.rollout.max_new_tokens), ("eval", config.eval.max_new_tokens)):
                if tokens > budget:
                    over[f"{kind} ({stage})"] = (tokens, budget)
    assert over == {}, f"tool calls longer than a turn's budget (tokens, max_new_tokens): {over}"
