"""A bound on prompt length: a prompt longer than the model can attend to is refused, cut or
left out before it reaches the sampler, where it would cost memory quadratic in its length.

The bound is ``rollout.max_prompt_tokens`` tokens, or when that is 0 the model's context
(``max_position_embeddings``) minus ``rollout.max_new_tokens``. ``rollout.long_prompts`` says
what happens to a longer prompt:

- ``error``: the run stops with a message naming the task and record;
- ``truncate``: the prompt keeps its last tokens (the question and the chat template's turn
  marker are at the end; a document's beginning is what goes);
- ``skip``: dataset records over the bound are left out when the run starts (and counted).

Dataset records are all checked at start-up (:func:`screen_datasets`), so a bad file fails
before any work; generated problems (arithmetic, reasoning-gym, long context) are checked as
they are sampled (:func:`fit_prompt`), where ``skip`` cannot leave a problem out and
refuses it like ``error``. Evaluation truncates: a held-out prompt never stops a run.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from tempering.config import ConfigError
from tempering.types import Messages, Problem, Prompt

ADVICE = "shorten it, raise rollout.max_prompt_tokens, or set rollout.long_prompts to truncate or skip"


def use_chat_template(tokenizer: Any, setting: Optional[bool]) -> bool:
    """Whether prompts are rendered with the tokenizer's chat template: ``model.chat_template``,
    or when that is None whether the tokenizer has one; true without one is a ConfigError."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if setting and not has_template:
        raise ConfigError("model.chat_template is true but this model's tokenizer has no chat "
                          "template; set model.chat_template=false (or null) for it")
    return has_template if setting is None else setting


def chat_ids(tokenizer: Any, messages: Messages, generation_prompt: bool, tools: Optional[list] = None) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, ending with the
    assistant's turn marker when ``generation_prompt``; ``tools`` (JSON-schema definitions)
    go to templates that describe tools to the model."""
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True, **extra)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def encode_prompt(tokenizer: Any, prompt: Prompt, chat_template: bool, tools: Optional[list] = None) -> list[int]:
    """The token ids a prompt is sampled after: text as it is, or chat messages rendered with
    the chat template; without one, the messages' contents one per line (``temper sft``
    renders its records this same way, so a fine-tuned model sees the prompts RL gives it)."""
    if isinstance(prompt, str) and not chat_template:
        return tokenizer(prompt)["input_ids"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not chat_template:
        return tokenizer("\n".join(m["content"] for m in messages) + "\n")["input_ids"]
    return chat_ids(tokenizer, messages, generation_prompt=True, tools=tools)


def prompt_limit(model_config: Any, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """The longest prompt allowed, in tokens; 0 = no bound (a model that states no context)."""
    if max_prompt_tokens:
        return max_prompt_tokens
    context = getattr(model_config, "max_position_embeddings", None) or 0
    return max(1, context - max_new_tokens) if context else 0


def _too_long(problem: Problem, length: int, limit: int) -> ConfigError:
    return ConfigError(f"task {problem.task}, record {problem.meta.get('record', problem.id)}: the prompt is "
                       f"{length} tokens, over the limit of {limit} (rollout.max_prompt_tokens; 0 = the model's "
                       f"context minus rollout.max_new_tokens); {ADVICE}")


def fit_prompt(ids: list[int], problem: Problem, limit: int, mode: str) -> list[int]:
    """``ids`` when within ``limit`` (0 = none); its last ``limit`` tokens under ``truncate``."""
    if not limit or len(ids) <= limit:
        return ids
    if mode == "truncate":
        return ids[-limit:]
    raise _too_long(problem, len(ids), limit)


def screen_datasets(tasks: list[Any], encode: Callable[[Any], list[int]], limit: int, mode: str) -> None:
    """Check every dataset record's prompt against ``limit`` before the run starts: refuse the
    first too long (``error``), or leave all such records out (``skip``, reported on stderr)."""
    if not limit or mode == "truncate":
        return
    for task in (t for t in tasks if hasattr(t, "drop_records")):  # tasks that hold records
        dropped = task.drop_records(lambda problem: len(encode(problem.prompt)) > limit)
        if dropped and mode == "error":
            first = dropped[0]
            raise _too_long(first, len(encode(first.prompt)), limit)
        if dropped:
            print(f"task {task.name}: left out {len(dropped)} records whose prompts are over {limit} tokens "
                  f"(first: {dropped[0].meta['record']})", file=sys.stderr)
