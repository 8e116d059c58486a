"""Dataset records as users have them: files, folders, and the columns other trainers use.

:func:`read_records` turns a path into ``(location, record)`` pairs, the location being what
an error names (``data.jsonl:12``, ``data.parquet: row 3``):

- a ``.jsonl`` file (one JSON object a line), a ``.json`` file (JSON lines, or one array of
  objects), a ``.parquet`` file;
- a folder written by Hugging Face ``datasets``' ``save_to_disk`` (a ``Dataset``, or a
  ``DatasetDict`` whose ``split`` is read), read with ``datasets.load_from_disk``;
- any other folder: the data files of the split, those whose names begin with it
  (``train.jsonl``, ``data/train-00000-of-00002.parquet``: a hub dataset's files as
  downloaded), read in name order.

The rest finds a record's fields under the names people give them: :func:`find` follows a
dotted column path (``reward_model.ground_truth``, verl's layout), :func:`chat_messages`
checks a prompt given as chat messages, :func:`final_answer` cuts a GSM8K-style worked
answer down to what follows its last ``####``.

Not done here: streaming (every record is read into memory), remote datasets (download first),
CSV.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from tempering.types import Messages

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
MISSING = object()


TOO_DEEP = "nested too deeply to read (lists or objects thousands of levels deep); no record needs that"
"""Python's JSON reader recurses once a level, and stops with a RecursionError."""


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
            except RecursionError:
                raise DatasetError(f"{where}: {TOO_DEEP}") from None
    return records


def _read_json(path: Path) -> list[tuple[str, Any]]:
    """A ``.json`` file: one array of records (``[{...}, {...}]``), else JSON lines."""
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if not head.startswith(b"["):
        return _read_jsonl(path)
    try:
        records = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a valid JSON array of records ({exc}); or write one record a line") from None
    except RecursionError:
        raise DatasetError(f"{path}: {TOO_DEEP}") from None
    return [(f"{path}: record {i}", record) for i, record in enumerate(records)]


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path}: reading parquet needs pyarrow: pip install 'pyarrow>=14'") from None
    rows = pq.read_table(path).to_pylist()
    return [(f"{path}: row {i}", row) for i, row in enumerate(rows)]


def _read_saved(path: Path, split: str) -> list[tuple[str, Any]]:
    """A ``save_to_disk`` folder: its ``Dataset``, or the ``split`` of its ``DatasetDict``."""
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{path}: a folder saved by Hugging Face datasets needs it to be read: "
                           "pip install 'tempering[tasks]'") from None
    try:
        loaded, label, splits = datasets.load_from_disk(str(path)), str(path), None
        if isinstance(loaded, datasets.DatasetDict):
            loaded, label, splits = loaded.get(split), f"{path} ({split})", list(loaded)
        rows = [] if loaded is None else list(loaded)
    except (OSError, ValueError) as exc:  # not such a folder (FileNotFoundError), a damaged file (ArrowInvalid)
        raise _unreadable(path, exc) from None
    if loaded is None:
        raise DatasetError(f"{path}: no split {split!r}; its splits: {', '.join(splits)} (options.split)")
    return [(f"{label}: row {i}", row) for i, row in enumerate(rows)]


def _unreadable(path: Path, exc: Exception) -> DatasetError:
    """What is wrong with a ``save_to_disk`` folder that ``datasets`` cannot load: the damaged
    ``.arrow`` file named when there is one."""
    damaged = _damaged_arrow(path)
    if damaged is not None:
        return DatasetError(f"{damaged}: not a readable Arrow file ({exc}); save the dataset again")
    return DatasetError(f"{path}: not a folder datasets' save_to_disk wrote ({exc}); save it again, or give "
                        "a folder of .jsonl/.json/.parquet files")


def _damaged_arrow(path: Path) -> Optional[Path]:
    """The first ``.arrow`` file under ``path`` that Arrow cannot open, to name it."""
    import pyarrow as pa

    for file in sorted(path.rglob("*.arrow")):
        try:
            with pa.memory_map(str(file)) as source:
                pa.ipc.open_stream(source).read_all()
        except (OSError, ValueError):
            return file
    return None


def _split_files(path: Path, split: str) -> list[Path]:
    found = sorted(p for p in path.rglob(f"{split}*") if p.is_file() and p.suffix in FILE_SUFFIXES)
    if not found:
        present = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.suffix in FILE_SUFFIXES)
        raise DatasetError(f"{path}: no {'/'.join(FILE_SUFFIXES)} file whose name begins with the split {split!r} "
                           f"(options.split); data files here: {', '.join(present[:8]) or 'none'}")
    return found


def _read_file(path: Path) -> list[tuple[str, Any]]:
    if path.suffix == ".parquet":
        return _read_parquet(path)
    if path.suffix == ".json":
        return _read_json(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    raise DatasetError(f"{path}: unknown format {path.suffix!r}; use .jsonl, .json, .parquet or a dataset folder")


def read_records(path: str | Path, split: str = "train") -> list[tuple[str, Any]]:
    """(location, record) pairs of a file or folder; see the module docstring for the forms."""
    path = Path(path)
    if path.is_dir():
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return _read_saved(path, split)
        return [pair for file in _split_files(path, split) for pair in _read_file(file)]
    if not path.is_file():
        raise DatasetError(f"{path}: no such file or folder")
    return _read_file(path)


def find(record: dict, column: str) -> Any:
    """The value at ``column`` (dots go into nested records), or :data:`MISSING`.

    >>> find({"reward_model": {"ground_truth": "7"}}, "reward_model.ground_truth")
    '7'
    >>> find({"answer": None}, "answer") is MISSING
    True
    """
    value: Any = record
    for part in column.split("."):
        if not isinstance(value, dict) or value.get(part) is None:
            return MISSING
        value = value[part]
    return value


def first_column(record: dict, mapped: Optional[str], candidates: tuple[str, ...]) -> Optional[str]:
    """The column a field is read from: the one ``options.fields`` maps it to, else the first
    of ``candidates`` the record has; None when there is none."""
    if mapped:
        return mapped
    return next((c for c in candidates if find(record, c) is not MISSING), None)


def chat_messages(where: str, column: str, value: Any) -> Messages:
    """``value`` as a prompt's chat messages: a list of ``{role, content}`` (extra keys are
    dropped), that does not end with the assistant's answer."""
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}: field {column!r} must be text or a non-empty list of {{role, content}} messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) \
                or not isinstance(message.get("content"), str):
            raise DatasetError(f"{where}: field {column!r}: message {i} needs a 'role' and a text 'content'")
    if value[-1]["role"] == "assistant":
        raise DatasetError(f"{where}: field {column!r} ends with an assistant message; an RL prompt ends where "
                           "the model is to answer (drop that message, or give the answer its own column)")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_text(prompt: Any) -> str:
    """A prompt's text (chat messages' contents one per line), for hashing and lengths."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def final_answer(answer: str) -> str:
    """The answer a GSM8K-style worked solution ends with (after its last ``####``, thousands
    separators dropped); any other text unchanged.

    >>> final_answer("Natalia sold 48/2 = 24 clips in May.\\n#### 1,072")
    '1072'
    >>> final_answer("Paris")
    'Paris'
    """
    if "####" not in answer:
        return answer
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", answer.rsplit("####", 1)[1].strip())

