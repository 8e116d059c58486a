"""Every shipped config for the built-in tiny model (or the generalist, the same model
pre-trained otherwise) asks only for prompts its context holds: a prompt longer than the
model's positions less the tokens it may generate stops the run at the step that first draws
it (``rollout.prompts``), long after the command was typed."""

from __future__ import annotations

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
