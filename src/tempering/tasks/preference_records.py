"""``temper dpo``'s data: preference records in the layouts users have them, and pairs made from the arithmetic tasks.

One record per line of a ``.jsonl`` file (or row of a ``.parquet`` file, or a saved dataset
folder), in any of these layouts:

- paired, explicit prompt (``temper rm``'s pairs, TRL's preference layout):
  ``{"prompt": ..., "chosen": ..., "rejected": ...}``; the prompt is text or chat messages, each
  completion text or a list of (assistant) messages;
- paired, implicit prompt (TRL's implicit layout, OpenRLHF's default keys ``chosen`` and
  ``rejected`` without a prompt key): ``{"chosen": ..., "rejected": ...}``, each the whole
  text or conversation; the prompt is their longest common prefix (whole messages; or
  characters, less a space it ends on, as TRL's ``extract_prompt`` takes it);
- unpaired (TRL's KTO layout, or OpenRLHF's ``input``/``output``/``label`` keys):
  ``{"prompt": ..., "completion": ..., "label": true}``, ``label`` saying whether the
  completion is desirable. A paired record given to an unpaired loss (KTO) is two unpaired
  examples, its chosen completion desirable and its rejected one not, as TRL unpairs them.

A bad record stops the command before the model loads, naming the file, line and field.
The held-out split is ``eval_fraction`` of the records by a stable hash of the prompt, or all
of ``eval_path``. ``builtin:arithmetic`` makes pairs from the arithmetic tasks
(:func:`arithmetic_mistake_pairs`).

Records become the chat or prompt/completion records of ``tempering.tasks.sft_records``, so
prompts are rendered as ``temper sft`` and the RL sampler render them.

Not done here: margins or scores in the records (OpenRLHF's ``margin``), images.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Optional, Union

from tempering.tasks.records import DatasetError, read_records

BUILTIN_ARITHMETIC = "builtin:arithmetic"
Messages = list[dict[str, str]]
Text = Union[str, Messages]
LAYOUTS = ("{prompt, chosen, rejected}, {chosen, rejected} with the prompt their shared beginning, "
           "or {prompt, completion, label} (also input/output/label)")


@dataclass(frozen=True)
class PreferenceRecord:
    """A preference pair (``rejected`` set) or an unpaired example (``desirable`` set)."""

    where: str
    """File and line, for messages."""
    prompt: Text
    chosen: Text
    """A pair's chosen completion, or an unpaired example's completion."""
    rejected: Optional[Text] = None
    desirable: Optional[bool] = None

    @property
    def paired(self) -> bool:
        return self.rejected is not None


def _text(where: str, field: str, value: Any, allow_empty: bool = False) -> Text:
    """``value`` checked as text or chat messages (each a text ``role`` and ``content``)."""
    if isinstance(value, str):
        if not allow_empty and not value.strip():
            raise DatasetError(f"{where}: field {field!r} is empty")
        return value
    if isinstance(value, list) and (value or allow_empty):
        for i, message in enumerate(value):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                    or not isinstance(message.get("content"), str):
                raise DatasetError(f"{where}: {field}[{i}] needs a text 'role' and 'content'")
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise DatasetError(f"{where}: field {field!r} must be text or a non-empty list of chat messages")


def shared_prefix(chosen: Text, rejected: Text) -> tuple[Text, Text, Text]:
    """``(prompt, chosen, rejected)`` of an implicit-prompt pair: the longest common beginning,
    in whole messages, or in characters less a space it ends on (as TRL's ``extract_prompt``).

    >>> shared_prefix("Q: 2+2? A: 4", "Q: 2+2? A: 5")
    ('Q: 2+2? A:', ' 4', ' 5')
    """
    same = 0
    while same < min(len(chosen), len(rejected)) and chosen[same] == rejected[same]:
        same += 1
    if isinstance(chosen, str) and same and chosen[same - 1] == " ":
        same -= 1
    return chosen[:same], chosen[same:], rejected[same:]


def parse_record(where: str, record: Any) -> PreferenceRecord:
    """One record in any of the module docstring's layouts, checked."""
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: a record must be a JSON object ({LAYOUTS})")
    if "label" in record:
        return _unpaired(where, record)
    missing = [field for field in ("chosen", "rejected") if record.get(field) is None]
    if missing:
        raise DatasetError(f"{where}: field {missing[0]!r} is missing (expected {LAYOUTS})")
    chosen, rejected = _text(where, "chosen", record["chosen"]), _text(where, "rejected", record["rejected"])
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise DatasetError(f"{where}: 'chosen' and 'rejected' must both be text or both be chat messages")
    if record.get("prompt") is not None:
        return PreferenceRecord(where, _text(where, "prompt", record["prompt"], allow_empty=True), chosen, rejected)
    prompt, chosen, rejected = shared_prefix(chosen, rejected)
    if not chosen or not rejected:
        raise DatasetError(f"{where}: with no 'prompt' field, 'chosen' and 'rejected' must differ after "
                           "their shared beginning (the prompt); one of them is all prompt")
    return PreferenceRecord(where, prompt, chosen, rejected)


def _unpaired(where: str, record: dict) -> PreferenceRecord:
    if not isinstance(record["label"], bool):
        raise DatasetError(f"{where}: field 'label' must be true (desirable) or false, not {record['label']!r}")
    completion = next((key for key in ("completion", "output") if record.get(key) is not None), None)
    if completion is None:
        raise DatasetError(f"{where}: field 'completion' is missing (an unpaired record is "
                           "{prompt, completion, label} or {input, output, label})")
    prompt = record.get("prompt", record.get("input", ""))
    return PreferenceRecord(where, _text(where, "prompt", prompt, allow_empty=True),
                            _text(where, completion, record[completion]), desirable=record["label"])


def unpair(records: list[PreferenceRecord]) -> list[PreferenceRecord]:
    """Unpaired examples: a pair's chosen completion desirable, its rejected one not."""
    out = []
    for r in records:
        if r.paired:
            out += [PreferenceRecord(r.where, r.prompt, r.chosen, desirable=True),
                    PreferenceRecord(r.where, r.prompt, r.rejected, desirable=False)]
        else:
            out.append(r)
    return out


def read_preferences(path: str) -> list[PreferenceRecord]:
    """Every record of a file or saved dataset, checked (a bad one is a DatasetError naming it)."""
    records = [parse_record(where, record) for where, record in read_records(path)]
    if not records:
        raise DatasetError(f"{path}: no records")
    return records


def split(records: list[PreferenceRecord], heldout: Optional[list[PreferenceRecord]], fraction: float
          ) -> tuple[list[PreferenceRecord], list[PreferenceRecord]]:
    """``(train, held out)``: ``heldout`` when given, else ``fraction`` of the records by a stable
    hash of the prompt (so no held-out prompt is trained on)."""
    if heldout is None:
        cut = int(fraction * 2**32)
        out = [zlib.crc32(json.dumps(r.prompt, sort_keys=True).encode()) < cut for r in records]
        heldout = [r for r, o in zip(records, out) if o]
        records = [r for r, o in zip(records, out) if not o]
    if not records:
        raise DatasetError("no training records after the held-out split; lower dpo.eval_fraction")
    if not heldout:
        raise DatasetError("no held-out records; raise dpo.eval_fraction or give dpo.eval_path")
    return records, heldout


def sft_record(prompt: Text, completion: Text) -> dict:
    """The ``tempering.tasks.sft_records`` record of a prompt and one completion."""
    if isinstance(prompt, str) and isinstance(completion, str):
        return {"prompt": prompt, "completion": completion}
    prompt_messages = prompt if isinstance(prompt, list) else ([{"role": "user", "content": prompt}] if prompt else [])
    completion_messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    return {"messages": prompt_messages + completion_messages}


def completion_turns(completion: Text) -> int:
    """How many assistant turns the completion adds (the trained ones)."""
    return sum(m["role"] == "assistant" for m in completion) if isinstance(completion, list) else 1


def arithmetic_mistake_pairs(tasks: list[Any], count: int) -> list[PreferenceRecord]:
    """``count`` pairs over the tasks' training problems in turn: the right worked solution over
    the one with the task's classic mistake (the dropped carry, smaller-from-larger), the
    mistake the built-in model's corpus teaches. Problems where the mistake changes nothing
    (no carry or borrow) are passed over; tasks without worked solutions are refused."""
    plain = [t for t in tasks if hasattr(t, "solution") and getattr(t, "style", "raw") != "program"]
    if len(plain) != len(tasks) or not tasks:
        raise DatasetError(f"{BUILTIN_ARITHMETIC}: every task must be an arithmetic task (add, sub, mul) "
                           "written as worked solutions")
    records: list[PreferenceRecord] = []
    index = 0
    while len(records) < count:
        task = tasks[index % len(tasks)]
        problem = task.train_problem(index // len(tasks))
        index += 1
        right, wrong = task.solution(problem), task.solution(problem, buggy=True)
        if right != wrong:
            records.append(PreferenceRecord(f"{BUILTIN_ARITHMETIC}:{task.name}:{problem.id}", problem.prompt,
                                            right, wrong))
        if index > 100 * count + 1000:
            raise DatasetError(f"{BUILTIN_ARITHMETIC}: too few problems where the classic mistake shows; "
                               "use operands of 2 or more digits")
    return records
