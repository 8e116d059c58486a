"""The model cache: where the built-in tiny model and converted GGUF models are kept between runs.

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
    from tempering.models.loading import ModelLoadError

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        variable = f"TEMPERING_CACHE={os.environ['TEMPERING_CACHE']}" if os.environ.get("TEMPERING_CACHE") else (
            "TEMPERING_CACHE unset")
        where = f" ({exc.filename})" if exc.filename else ""
        raise ModelLoadError(f"cannot write the model cache {target.parent} ({variable}): {exc.strerror}{where}; "
                             "set TEMPERING_CACHE to a folder you can write") from None


def converted_dir(gguf: Path) -> Path:
    """Where the safetensors copy of ``gguf`` lives: keyed by the file's name, size and mtime,
    so a reinstalled or changed package makes a new entry instead of reusing a stale one."""
    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"


def ensure_converted(gguf: Path, progress: bool = True) -> Path:
    """The cached safetensors folder of a GGUF model, dequantizing it on first use.

    Written to a temporary sibling and renamed into place, so an interrupted conversion never
    leaves a folder that looks complete; two processes converting at once both succeed.
    """
    target = converted_dir(gguf)
    if (target / "config.json").is_file():
        return target
    if progress:
        print(f"converting {gguf.name} to safetensors in {target} (once)", file=sys.stderr)
    staging = cache_staging(target)  # before the minute of dequantizing, so that an unwritable cache stops at once
    try:
        model, tokenizer = loading.load_model(str(gguf), "float32")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first; its copy is the same
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
