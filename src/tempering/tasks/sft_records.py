"""``temper sft``'s data: records into token ids with an answer mask, the held-out split, steps.

Two record forms, one per line of a ``.jsonl`` file (or row of a ``.parquet`` one):

- chat: ``{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}``;
  the loss is on the assistant turns only;
- prompt/completion: ``{"prompt": ..., "completion": ...}``; the loss is on the completion.

Records are rendered as the RL sampler renders prompts (``tempering.rollout.prompts``): with
the tokenizer's chat template when it has one (``model.chat_template``), so a prompt/completion
record is a user turn and an assistant turn; without one, a prompt/completion record is the
prompt as it is then the completion and end-of-sequence, and a chat record is each message on
its own line with every assistant turn followed by end-of-sequence. With a template, an
assistant turn's tokens are what rendering the conversation up to that turn adds after the
generation prompt (its end-of-turn marker included); a template that renders earlier turns
differently once a later one exists is refused, since no mask could be right for it.

A bad record (a missing field, an empty answer, a record over ``sft.max_length``) stops the
run before any work, naming the file and line. The held-out split is ``eval_fraction`` of the
records by a stable hash of the prompt part, or all of ``eval_path``.

Not done here: tool calls and other structured message content, per-turn loss weights.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from typing import Any, Optional

from jinja2 import TemplateError

from tempering.rollout.prompts import chat_ids
from tempering.tasks.records import DatasetError, read_records

FORMS = "a chat record {\"messages\": [...]} or a prompt/completion record {\"prompt\": ..., \"completion\": ...}"


@dataclass(frozen=True)
class Example:
    """One record's token ids and which of them are answer tokens (trained on)."""

    ids: list[int]
    answer_mask: list[int]
    where: str
    """File and line, for messages."""


def _messages(where: str, record: Any) -> list[dict[str, str]]:
    """The record as chat messages, checked; a prompt/completion record is a user and an
    assistant turn."""
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: a record must be a JSON object ({FORMS})")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DatasetError(f"{where}: field 'messages' must be a non-empty list of {{role, content}}")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise DatasetError(f"{where}: messages[{i}] needs a 'role' and a text 'content'")
            if message["role"] == "assistant" and not message["content"].strip():
                raise DatasetError(f"{where}: messages[{i}] is an empty assistant answer")
        if not any(m["role"] == "assistant" for m in messages):
            raise DatasetError(f"{where}: no assistant message, so nothing to learn from")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    missing = [field for field in ("prompt", "completion") if not isinstance(record.get(field), str)]
    if missing:
        raise DatasetError(f"{where}: field {missing[0]!r} is missing or not text (expected {FORMS})")
    if not record["completion"].strip():
        raise DatasetError(f"{where}: field 'completion' is an empty answer")
    return [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]


def _with_template(where: str, messages: list[dict[str, str]], tokenizer: Any) -> tuple[list[int], list[int]]:
    def render(count: int, generation_prompt: bool) -> list[int]:
        """The first ``count`` messages rendered; a conversation the template refuses (roles
        out of its order, a system turn it does not take, none at all) is the record's error."""
        try:
            return chat_ids(tokenizer, messages[:count], generation_prompt)
        except (TemplateError, ValueError) as exc:
            raise DatasetError(f"{where}: the chat template cannot render messages[:{count}] ({exc}); "
                               "fix the record or set model.chat_template=false") from None

    ids = render(len(messages), generation_prompt=False)
    mask = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(i, generation_prompt=True)
        through = render(i + 1, generation_prompt=False)
        if through[: len(before)] != before or ids[: len(through)] != through:
            raise DatasetError(f"{where}: the chat template renders earlier turns differently once messages[{i}] "
                               "follows, so its answer tokens cannot be told apart; set model.chat_template=false")
        mask[len(before): len(through)] = [1] * (len(through) - len(before))
    return ids, mask


def _without_template(record: dict, messages: list[dict[str, str]], tokenizer: Any) -> tuple[list[int], list[int]]:
    def text_ids(text: str, first: bool) -> list[int]:
        return tokenizer(text, add_special_tokens=first)["input_ids"]

    eos = [tokenizer.eos_token_id]
    if "messages" not in record:  # the prompt exactly as the sampler is given it
        prompt, answer = text_ids(record["prompt"], True), text_ids(record["completion"], False) + eos
        return prompt + answer, [0] * len(prompt) + [1] * len(answer)
    ids: list[int] = []
    mask: list[int] = []
    for message in messages:
        if message["role"] == "assistant":
            piece, trained = text_ids(message["content"], not ids) + eos, 1
        else:
            piece, trained = text_ids(message["content"] + "\n", not ids), 0
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


def encode_record(where: str, record: Any, tokenizer: Any, chat_template: bool) -> Example:
    """The record's token ids and answer mask (see the module docstring)."""
    messages = _messages(where, record)
    if chat_template:
        ids, mask = _with_template(where, messages, tokenizer)
    else:
        ids, mask = _without_template(record, messages, tokenizer)
    if not any(mask):
        raise DatasetError(f"{where}: the answer renders to no tokens")
    return Example(ids, mask, where)


def prompt_key(record: dict) -> str:
    """What the held-out split hashes: a checked record without its answers."""
    if "messages" in record:
        return json.dumps([m for m in record["messages"] if m["role"] != "assistant"], sort_keys=True)
    return json.dumps(record["prompt"])


def load_split(path: str, eval_path: Optional[str], eval_fraction: float
               ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """``(training records, held-out records)``, each checked: all of ``eval_path`` held out,
    or ``eval_fraction`` of ``path`` by a stable hash of each record's prompt."""
    records = read_records(path)
    check_records(records)
    if eval_path:
        train, held_out = records, read_records(eval_path)
        check_records(held_out)
    else:
        cut = int(eval_fraction * 2**32)
        out = [zlib.crc32(prompt_key(record).encode()) < cut for _, record in records]
        train = [r for r, o in zip(records, out) if not o]
        held_out = [r for r, o in zip(records, out) if o]
    if not train:
        raise DatasetError(f"{path}: no training records (after the held-out split)")
    if not held_out:
        raise DatasetError(f"{eval_path or path}: no held-out records; raise sft.eval_fraction or give sft.eval_path")
    return train, held_out


def check_records(records: list[tuple[str, Any]]) -> None:
    """Refuse the first malformed record (a missing field, an empty answer) without a tokenizer,
    so a bad file stops the run before the model is loaded."""
    for where, record in records:
        _messages(where, record)


def encode_all(records: list[tuple[str, Any]], tokenizer: Any, chat_template: bool, max_length: int,
               long_records: str) -> tuple[list[Example], int]:
    """Every record encoded, and how many were left out for being over ``max_length`` tokens
    (0 = no bound) under ``long_records="skip"``; under ``"error"`` the first is refused."""
    examples, skipped = [], 0
    for where, record in records:
        example = encode_record(where, record, tokenizer, chat_template)
        if max_length and len(example.ids) > max_length:
            if long_records == "error":
                raise DatasetError(f"{where}: the record is {len(example.ids)} tokens, over sft.max_length="
                                   f"{max_length} (0 = the model's context); shorten it, raise sft.max_length, "
                                   "or set sft.long_records=skip")
            skipped += 1
            continue
        examples.append(example)
    if not examples:
        raise DatasetError(f"every record is over sft.max_length={max_length} tokens")
    return examples, skipped


def plan_steps(lengths: list[int], batch_tokens: int, epochs: int, seed: int) -> list[list[int]]:
    """Example indices of every optimizer step: each epoch a fresh seeded order, cut into steps
    of at most ``batch_tokens`` tokens (a longer example alone). A pure function of its
    arguments, so a resumed run finds its place by the step number alone.

    >>> plan_steps([3, 5, 2, 4], 7, 2, seed=0)
    [[2, 0], [1], [3], [2, 3], [1], [0]]
    """
    steps: list[list[int]] = []
    for epoch in range(epochs):
        order = list(range(len(lengths)))
        random.Random(f"sft:{seed}:{epoch}").shuffle(order)
        current, tokens = [], 0
        for i in order:
            if current and tokens + lengths[i] > batch_tokens:
                steps.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += lengths[i]
        steps.append(current)
    return steps
