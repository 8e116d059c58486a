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
before any work. That check tokenizes at most ``longest_token * (limit + 1)`` characters of a
record: no token covers more characters than the vocabulary's longest entry, so a longer text
is over the limit whatever its tokens, and tokenizing it whole would cost memory for nothing
(about 450 bytes a character with the built-in model's fast tokenizer: 13 GB for a 30 MB
record). Generated problems (arithmetic, reasoning-gym, long context) are checked as they are
sampled (:func:`fit_prompt`), where ``skip`` cannot leave a problem out and
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


def _too_long(problem: Problem, length: int, limit: int, cut: int = 0) -> ConfigError:
    """The refusal of a prompt of ``length`` tokens (in its first ``cut`` characters when not 0)."""
    size = (f"over the limit of {limit} tokens (its first {cut} characters are {length} tokens)" if cut
            else f"{length} tokens, over the limit of {limit}")
    return ConfigError(f"task {problem.task}, record {problem.meta.get('record', problem.id)}: the prompt is "
                       f"{size} (rollout.max_prompt_tokens; 0 = the model's context minus "
                       f"rollout.max_new_tokens); {ADVICE}")


def fit_prompt(ids: list[int], problem: Problem, limit: int, mode: str) -> list[int]:
    """``ids`` when within ``limit`` (0 = none); its last ``limit`` tokens under ``truncate``."""
    if not limit or len(ids) <= limit:
        return ids
    if mode == "truncate":
        return ids[-limit:]
    raise _too_long(problem, len(ids), limit)


def longest_token(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its longest vocabulary entry
    (byte-level entries spell a byte as one character, so a character of several bytes only
    makes this larger, never smaller)."""
    return max(map(len, tokenizer.get_vocab()))


def _prefix(prompt: Prompt, chars: int) -> Prompt:
    """The prompt cut to its first ``chars`` characters of text (for messages, of their
    contents in turn); the prompt itself when it is no longer."""
    if isinstance(prompt, str):
        return prompt[:chars]
    kept: Messages = []
    for message in prompt:
        if chars <= 0:
            break
        kept.append({**message, "content": message["content"][:chars]})
        chars -= len(message["content"])
    return kept


def screen_datasets(tasks: list[Any], encode: Callable[[Any], list[int]], limit: int, mode: str,
                    chars_per_token: int) -> None:
    """Check every dataset record's prompt against ``limit`` before the run starts: refuse the
    first too long (``error``), or leave all such records out (``skip``, reported on stderr).

    ``chars_per_token`` (:func:`longest_token`) bounds what is tokenized: a record is counted in
    its first ``chars_per_token * (limit + 1)`` characters, which are over ``limit`` tokens when
    the record is longer. A file whose every record is over the limit is refused in both modes."""
    if not limit or mode == "truncate":
        return
    chars = chars_per_token * (limit + 1)

    def over(problem: Problem) -> bool:
        head = _prefix(problem.prompt, chars)
        length = len(encode(head))
        if length > limit and mode == "error":  # stop at the first: drop_records calls this in file order
            raise _too_long(problem, length, limit, chars if head != problem.prompt else 0)
        return length > limit

    for task in (t for t in tasks if hasattr(t, "drop_records")):  # tasks that hold records
        try:
            dropped = task.drop_records(over)
        except ConfigError:  # a ValueError too: the refusal of the first long prompt, as it is
            raise
        except ValueError as exc:  # skip would leave no record of a split
            raise ConfigError(f"task {task.name}: rollout.long_prompts=skip: {exc}: their prompts are all over the "
                              f"limit of {limit} tokens (rollout.max_prompt_tokens); shorten them, raise the limit, "
                              "or set rollout.long_prompts=truncate") from None
        if dropped:
            print(f"task {task.name}: left out {len(dropped)} records whose prompts are over {limit} tokens "
                  f"(first: {dropped[0].meta['record']})", file=sys.stderr)
