"""The model cache: where the built-in tiny model and converted GGUF models are kept between
runs, and how an entry is written so that no reader ever sees half of one.

``$TEMPERING_CACHE``, else ``$XDG_CACHE_HOME/tempering``, else ``~/.cache/tempering``. A GGUF
file is dequantized once into a safetensors folder here (:func:`ensure_converted`), since a
GGUF load dequantizes every time (30-60 s on a laptop CPU) and the folder loads in under a
second. Not here: the tiny model's pre-training (``tempering.pretrain`` writes its entry).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

from tempering.models import loading


def cache_root() -> Path:
    """``$TEMPERING_CACHE``, else ``$XDG_CACHE_HOME/tempering``, else ``~/.cache/tempering``."""
    if os.environ.get("TEMPERING_CACHE"):
        return Path(os.environ["TEMPERING_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tempering"


def cache_staging(target: Path) -> Path:
    """A new hidden folder beside the cache entry ``target``, to write it in and rename into
    place. A cache that cannot be written is a ModelLoadError naming it, and the variable that
    moves it, rather than a traceback from ``mkdir``."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        variable = f"TEMPERING_CACHE={os.environ['TEMPERING_CACHE']}" if os.environ.get("TEMPERING_CACHE") else (
            "TEMPERING_CACHE unset")
        where = f" ({exc.filename})" if exc.filename else ""
        raise loading.ModelLoadError(f"cannot write the model cache {target.parent} ({variable}): "
                                     f"{exc.strerror}{where}; set TEMPERING_CACHE to a folder you can write") from None


def write_entry(target: Path, write: Callable[[Path], None], replace: bool = False,
                complete: Callable[[Path], bool] = Path.exists) -> Path:
    """Make the cache entry ``target`` with ``write(folder)``: in a staging folder
    (:func:`cache_staging`) renamed into place once whole, so an interrupted write never leaves
    an entry that looks complete. Two processes making one entry at once both succeed: when
    the rename finds ``target`` already ``complete``, the other process's copy (made the same
    way) stands. ``replace`` puts the new entry in place of one already there."""
    staging = cache_staging(target)
    try:
        write(staging)
        if replace and target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(staging, target)
        except OSError:
            if not complete(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def converted_dir(gguf: Path) -> Path:
    """Where the safetensors copy of ``gguf`` lives: keyed by the file's name, size and mtime,
    so a reinstalled or changed package makes a new entry instead of reusing a stale one."""
    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"


def ensure_converted(gguf: Path, progress: bool = True) -> Path:
    """The cached safetensors folder of a GGUF model, dequantizing it on first use.

    Written as a cache entry (:func:`write_entry`), so an interrupted conversion never leaves a
    folder that looks complete; two processes converting at once both succeed.
    """
    target = converted_dir(gguf)
    if (target / "config.json").is_file():
        return target
    if progress:
        print(f"converting {gguf.name} to safetensors in {target} (once)", file=sys.stderr)

    def convert(folder: Path) -> None:
        model, tokenizer = loading.load_model(str(gguf), "float32")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    # the staging folder comes first: an unwritable cache stops before the minute of dequantizing
    return write_entry(target, convert, complete=lambda folder: (folder / "config.json").is_file())
