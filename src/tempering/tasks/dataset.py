"""User datasets from JSONL or parquet: math, code and free-form tasks.

``name: dataset`` with ``options: {path: data/train.jsonl, kind: math}``. One record per line
(JSONL) or row (parquet); the fields each kind needs:

- ``math``: ``question`` and ``answer`` (text or a number), graded by the ``math`` reward;
- ``code``: ``prompt`` and ``tests`` in the sandbox's JSON form (``{"kind": "stdio", "cases":
  [{"stdin": "1 2\\n", "stdout": "3\\n"}]}`` or ``{"kind": "call", "entry_point": "f",
  "cases": [{"args": [1], "expected": 2}]}``), optionally ``language`` and ``code_prefix``;
  graded by the ``code`` reward in the sandbox;
- ``text``: ``prompt`` and ``answer``, graded by the reward named in the ``reward`` option
  (default ``match``; a ``module:function`` of your own works too).

Any other fields are kept in ``problem.meta`` for a custom reward. A malformed record is a
:class:`DatasetError` naming the file, the line (JSONL) or row (parquet), and the field, so the
fix is one edit away; the whole file is checked when the task is built, not mid-run.

The held-out split is ``eval_fraction`` of the records chosen by a stable hash of the
prompt text (records with the same prompt land on the same side, so no training prompt is
ever evaluated), or all of ``eval_path`` when given. The training stream walks the
training records in a fresh seeded order each epoch.

Not done here: streaming files larger than memory, remote (hub) datasets, multi-turn records.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from typing import Any, Callable

from tempering.sandbox.spec import SpecError, TestSpec
from tempering.tasks.base import StreamState, register_task
from tempering.types import Problem, domain_of

KINDS = {
    "math": (("question", "answer"), {"math": 1.0}, "math"),
    "code": (("prompt", "tests"), {"code": 1.0}, "code"),
    "text": (("prompt", "answer"), None, None),
}
"""kind -> (required fields, default rewards, metric); ``text`` takes both from the options."""


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file, record and field."""


def _read_jsonl(path: Path) -> list[tuple[str, Any]]:
    records = []
    with path.open("rb") as f:  # bytes, so that a line that is not UTF-8 can be named
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                   f"{exc.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                records.append((where, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    return records


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install 'pyarrow>=14'") from None
    rows = pq.read_table(path).to_pylist()
    return [(f"{path}: row {i}", row) for i, row in enumerate(rows)]


def read_records(path: str | Path) -> list[tuple[str, Any]]:
    """(location, record) pairs of a ``.jsonl``/``.json`` or ``.parquet`` file."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    raise DatasetError(f"{path}: unknown format {path.suffix!r}; use .jsonl or .parquet")


def _check(where: str, record: Any, kind: str) -> None:
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    for field in KINDS[kind][0]:
        if field not in record or record[field] is None:
            raise DatasetError(f"{where}: field {field!r} is missing (a {kind} record needs "
                               f"{', '.join(KINDS[kind][0])})")
    text_field = "question" if kind == "math" else "prompt"
    if not isinstance(record[text_field], str) or not record[text_field].strip():
        raise DatasetError(f"{where}: field {text_field!r} must be non-empty text")
    if kind != "code" and not isinstance(record["answer"], (str, int, float)):
        raise DatasetError(f"{where}: field 'answer' must be text or a number, got {type(record['answer']).__name__}")
    if kind == "code":
        try:
            TestSpec.from_dict({"code": "", "tests": record["tests"]})
        except SpecError as exc:
            raise DatasetError(f"{where}: field 'tests': {exc}") from None


class DatasetTask(StreamState):
    """Records from a user file; see the module docstring for the fields and the split."""

    def __init__(self, name: str, seed: int, path: str = "", kind: str = "math", reward: str = "match",
                 eval_fraction: float = 0.1, eval_path: str | None = None, style: str = "chat",
                 domain: str = "", rewards: dict[str, float] | None = None):
        if not path:
            raise ValueError("a dataset task needs options.path (a .jsonl or .parquet file)")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if not 0 <= eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        if style not in ("raw", "chat"):
            raise ValueError(f"style must be 'raw' or 'chat', got {style!r}")
        self.name, self.seed, self.kind, self.style = name, seed, kind, style
        self.domain = domain_of(name, domain)
        _, default_rewards, metric = KINDS[kind]
        self.rewards = dict(rewards or default_rewards or {reward: 1.0})
        self.metric = metric or reward
        records = self._load(path)
        if eval_path:
            self._train, self._eval = records, self._load(eval_path)
        else:
            cut = int(eval_fraction * 2**32)
            held_out = [zlib.crc32(self._text(r).encode()) < cut for _, r in records]
            self._train = [rec for rec, out in zip(records, held_out) if not out]
            self._eval = [rec for rec, out in zip(records, held_out) if out]
        if not self._train:
            raise DatasetError(f"{path}: no training records left after the held-out split "
                               f"(eval_fraction={eval_fraction})")
        self.size = len(self._train)
        self._order: tuple[int, list[int]] = (-1, [])

    def _load(self, path: str) -> list[tuple[str, dict]]:
        records = read_records(path)
        if not records:
            raise DatasetError(f"{path}: the file has no records")
        for where, record in records:
            _check(where, record, self.kind)
        return records

    def _text(self, record: dict) -> str:
        return record["question"] if self.kind == "math" else record["prompt"]

    def _problem(self, where: str, record: dict) -> Problem:
        text = self._text(record)
        prompt: Any = f"{text}\n" if self.style == "raw" else [{"role": "user", "content": text}]
        meta = {k: v for k, v in record.items() if k not in ("question", "prompt", "answer")}
        meta["source"] = where
        return Problem(task=self.name, id=where.rsplit("/", 1)[-1], prompt=prompt,
                       answer=str(record.get("answer", "")), domain=self.domain, meta=meta)

    def train_problem(self, index: int) -> Problem:
        epoch, position = divmod(index, self.size)
        self._served(index)
        if self._order[0] != epoch:
            order = list(range(self.size))
            random.Random(f"{self.seed}:{self.name}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._problem(*self._train[self._order[1][position]])

    def eval_problems(self, n: int) -> list[Problem]:
        return [self._problem(*record) for record in self._eval[:n]]

    def drop_records(self, drop: Callable[[Problem], bool]) -> list[Problem]:
        """Leave out the records whose problems ``drop`` picks (prompts too long for the model);
        return those problems. Refused, naming the first record, when it would leave no training
        or held-out record."""
        split = {}
        for name, records in (("training", self._train), ("held-out", self._eval)):
            split[name] = [(rec, drop(self._problem(*rec))) for rec in records]
            if records and all(out for _, out in split[name]):
                raise DatasetError(f"every {name} record would be left out ({len(records)}, from {records[0][0]})")
        self._train = [rec for rec, out in split["training"] if not out]
        self._eval = [rec for rec, out in split["held-out"] if not out]
        self.size = len(self._train)
        return [self._problem(*rec) for records in split.values() for rec, out in records if out]

    def _extra_state(self) -> dict[str, Any]:
        return {"size": self.size}

    def _load_extra(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:  # each epoch's order is a shuffle of this many records
            raise ValueError(f"{self.name}: the saved stream walked {state['size']} training records, the file now "
                             f"has {self.size}; the stream cannot continue where it stopped")


register_task("dataset")(DatasetTask)
