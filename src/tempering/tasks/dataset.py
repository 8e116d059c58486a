"""User datasets (JSONL, JSON, parquet, Hugging Face ``datasets`` folders): math, code and free-form tasks.

``name: dataset`` with ``options: {path: data/train.jsonl, kind: math}``. One record per line
(JSONL) or row (parquet, datasets); the files and folders read are
:func:`tempering.tasks.records.read_records`'. The fields each kind needs:

- ``math``: a prompt and ``answer`` (text or a number), graded by the ``math`` reward;
- ``code``: a prompt and ``tests`` in the sandbox's JSON form (``{"kind": "stdio", "cases":
  [{"stdin": "1 2\\n", "stdout": "3\\n"}]}`` or ``{"kind": "call", "entry_point": "f",
  "cases": [{"args": [1], "expected": 2}]}``), optionally ``language`` (a sandbox language,
  installed here or not: a sandbox service may run it) and ``code_prefix`` (text);
  graded by the ``code`` reward in the sandbox;
- ``text``: a prompt and ``answer``, graded by the reward named in the ``reward`` option
  (default ``match``). With a reward of your own (``module:function``, ``trl:module:function``,
  ``verl:module:function``) the answer is optional: your reward reads what columns it needs.

A field is read from the column ``options.fields`` maps it to (``fields: {prompt: problem,
answer: solution}``; a dotted name goes into nested records), else from the usual names:
the prompt from ``prompt``, ``question`` or ``messages``, as text or as chat messages; the
answer from ``answer``, ``reward_model.ground_truth`` (verl's parquet layout) or
``ground_truth``. An answer ending in ``#### 42`` (GSM8K's worked solutions) is graded
against ``42`` (one ending in ``####`` alone is refused). So verl's and TRL's datasets are
read as they are.

Every column but the prompt's is kept in ``problem.meta`` under its own name, for your
reward: ``problem.meta["extra_info"]``, ``problem.meta["solution"]``; ``problem.meta["record"]``
is the record's location (it replaces a column of that name). A malformed record is a
:class:`DatasetError` naming the file, the line (JSONL) or row (parquet, datasets), and the
field, so the fix is one edit away; every record is checked when the task is built, not mid-run.

The held-out split is ``eval_fraction`` of the records chosen by a stable hash of the
prompt text (records with the same prompt land on the same side, so no training prompt is
ever evaluated), or all of ``eval_path`` or of ``eval_split`` when given. The training
stream walks the training records in a fresh seeded order each epoch.

Not done here: streaming files larger than memory, remote (hub) datasets, multi-turn records,
a task per verl ``data_source`` (the column reaches rewards in ``problem.meta``).
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Callable, Optional

from tempering.sandbox.languages import LANGUAGES, is_known
from tempering.sandbox.spec import SpecError, TestSpec
from tempering.tasks.base import StreamState, register_task
from tempering.tasks.records import (MISSING, DatasetError, chat_messages, final_answer, find, first_column,
                                     prompt_text, read_records)
from tempering.types import Problem, Prompt, domain_of

__all__ = ["DatasetError", "DatasetTask", "read_records"]

KINDS = {
    "math": (("prompt", "answer"), {"math": 1.0}, "math"),
    "code": (("prompt", "tests"), {"code": 1.0}, "code"),
    "text": (("prompt", "answer"), None, None),
}
"""kind -> (fields it needs, default rewards, metric); ``text`` takes both from the options."""

COLUMNS = {"prompt": ("prompt", "question", "messages"),
           "answer": ("answer", "reward_model.ground_truth", "ground_truth"),
           "tests": ("tests",), "language": ("language",), "code_prefix": ("code_prefix",)}
"""field -> the columns it is looked for in, in order, when ``options.fields`` does not name one."""


def _check_fields(fields: dict[str, str]) -> None:
    for field, column in fields.items():
        if field not in COLUMNS:
            raise ValueError(f"fields.{field}: not a field a dataset record has; the fields: {', '.join(COLUMNS)}")
        if not isinstance(column, str) or not column:
            raise ValueError(f"fields.{field}: must name a column, got {column!r}")


class DatasetTask(StreamState):
    """Records from a user file or folder; see the module docstring for the fields and the split."""

    def __init__(self, name: str, seed: int, path: str = "", kind: str = "math", reward: str = "match",
                 eval_fraction: float = 0.1, eval_path: Optional[str] = None, style: str = "chat",
                 domain: str = "", rewards: Optional[dict[str, float]] = None,
                 fields: Optional[dict[str, str]] = None, split: str = "train", eval_split: Optional[str] = None):
        if not path:
            raise ValueError("a dataset task needs options.path (a .jsonl, .json or .parquet file, or a dataset folder)")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not 0 <= eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        self.fields = dict(fields or {})
        _check_fields(self.fields)
        self.name, self.seed, self.kind, self.style = name, seed, kind, style
        self.domain = domain_of(name, domain)
        _, default_rewards, metric = KINDS[kind]
        self.rewards = dict(rewards or default_rewards or {reward: 1.0})
        self.metric = metric or reward
        # the built-in rewards compare with the answer; a user's own (module:function) may not need one
        self._needs_answer = kind != "code" and any(":" not in reward_name for reward_name in self.rewards)
        records = self._load(path, split)
        if eval_path or eval_split:
            self._train, self._eval = records, self._load(eval_path or path, eval_split or split)
        else:
            cut = int(eval_fraction * 2**32)
            held_out = [zlib.crc32(prompt_text(p.prompt).encode()) < cut for p in records]
            self._train = [p for p, out in zip(records, held_out) if not out]
            self._eval = [p for p, out in zip(records, held_out) if out]
        if not self._train:
            raise DatasetError(f"{path}: no training records left after the held-out split "
                               f"(eval_fraction={eval_fraction})")
        self.size = len(self._train)
        self._order: tuple[int, list[int]] = (-1, [])

    def _load(self, path: str, split: str) -> list[Problem]:
        records = read_records(path, split)
        if not records:
            raise DatasetError(f"{path}: no records in it")
        return [self._problem(where, record) for where, record in records]

    def _column(self, where: str, record: dict, field: str, required: bool) -> tuple[Optional[str], Any]:
        """(column, value) of ``field`` in ``record``; (None, MISSING) when absent and not required."""
        column = first_column(record, self.fields.get(field), COLUMNS[field])
        value = find(record, column) if column else MISSING
        if value is MISSING and required:
            named = f"field {column!r}" if column else f"field {field!r}"
            mapped = (f" (options.fields.{field})" if field in self.fields
                      else f" (looked for {', '.join(COLUMNS[field])}; options.fields.{field} names another column)")
            raise DatasetError(f"{where}: {named} is missing; a {self.kind} record needs "
                               f"{' and '.join(KINDS[self.kind][0])}{mapped}")
        return column, value

    def _prompt(self, where: str, column: str, value: Any) -> Prompt:
        if isinstance(value, str):
            if not value.strip():
                raise DatasetError(f"{where}: field {column!r} must be non-empty text")
            return f"{value}\n" if self.style == "raw" else [{"role": "user", "content": value}]
        return chat_messages(where, column, value)

    def _answer(self, where: str, column: Optional[str], value: Any) -> str:
        if value is MISSING:
            return ""
        if not isinstance(value, (str, int, float)):
            if self._needs_answer:
                raise DatasetError(f"{where}: field {column!r} must be text or a number, got {type(value).__name__}")
            return ""
        if isinstance(value, str) and "####" in value and not final_answer(value) and self._needs_answer:
            raise DatasetError(f"{where}: field {column!r} ends with '####' and nothing after it; a worked answer "
                               "ends '#### <answer>' (GSM8K's form), or give the answer alone")
        return final_answer(value) if isinstance(value, str) else str(value)

    def _problem(self, where: str, record: Any) -> Problem:
        """The record as a problem, checked field by field (a DatasetError names the first fault)."""
        if not isinstance(record, dict):
            raise DatasetError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
        prompt_column, prompt = self._column(where, record, "prompt", required=True)
        answer_column, answer = self._column(where, record, "answer", required=self._needs_answer)
        meta = {k: v for k, v in record.items() if k != prompt_column}
        for field in ("tests", "language", "code_prefix"):
            column, value = self._column(where, record, field, required=field == "tests" and self.kind == "code")
            if value is not MISSING:
                meta[field] = value
        if self.kind == "code":
            self._check_code(where, record, meta)
        meta["record"] = where
        return Problem(task=self.name, id=where.rsplit("/", 1)[-1], prompt=self._prompt(where, prompt_column, prompt),
                       answer=self._answer(where, answer_column, answer), domain=self.domain, meta=meta)

    def _check_code(self, where: str, record: dict, meta: dict) -> None:
        """A code record's tests, language and code prefix as the code reward will use them."""
        try:
            TestSpec.from_dict({"code": "", "tests": meta["tests"]})
        except SpecError as exc:
            raise DatasetError(f"{where}: field 'tests': {exc}") from None
        column = first_column(record, self.fields.get("language"), COLUMNS["language"])
        if "language" in meta and not (isinstance(meta["language"], str) and is_known(meta["language"])):
            raise DatasetError(f"{where}: field {column!r} must name a language of the sandbox "
                               f"({', '.join(LANGUAGES)}), got {meta['language']!r}")
        column = first_column(record, self.fields.get("code_prefix"), COLUMNS["code_prefix"])
        if "code_prefix" in meta and not isinstance(meta["code_prefix"], str):
            raise DatasetError(f"{where}: field {column!r} must be text (the code the answer continues), "
                               f"got {type(meta['code_prefix']).__name__}")

    def train_problem(self, index: int) -> Problem:
        epoch, position = divmod(index, self.size)
        self._served(index)
        if self._order[0] != epoch:
            order = list(range(self.size))
            random.Random(f"{self.seed}:{self.name}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._train[self._order[1][position]]

    def eval_problems(self, n: int) -> list[Problem]:
        return self._eval[:n]

    def drop_records(self, drop: Callable[[Problem], bool]) -> list[Problem]:
        """Leave out the records whose problems ``drop`` picks (prompts too long for the model);
        return those problems. Refused, naming the first record, when it would leave no training
        or held-out record."""
        split = {}
        for name, problems in (("training", self._train), ("held-out", self._eval)):
            split[name] = [(problem, drop(problem)) for problem in problems]
            if problems and all(out for _, out in split[name]):
                raise DatasetError(f"every {name} record would be left out ({len(problems)}, from {problems[0].meta['record']})")
        self._train = [problem for problem, out in split["training"] if not out]
        self._eval = [problem for problem, out in split["held-out"] if not out]
        self.size = len(self._train)
        return [problem for pairs in split.values() for problem, out in pairs if out]

    def _extra_state(self) -> dict[str, Any]:
        return {"size": self.size}

    def _load_extra(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:  # each epoch's order is a shuffle of this many records
            raise ValueError(f"{self.name}: the saved stream walked {state['size']} training records, the file now "
                             f"has {self.size}; the stream cannot continue where it stopped")


register_task("dataset")(DatasetTask)
