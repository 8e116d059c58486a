"""CUDA-only torch extensions beside a CPU torch are hidden before transformers looks for them."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from tempering.torch_extensions import hide_cuda_extensions


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """``install(name, version)``: a package ``name`` whose version.py says ``version``, first
    on sys.path and not imported; whatever the test leaves in sys.modules for it is removed."""
    names = []

    def install(name: str, version: str):
        package = tmp_path / "site" / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "version.py").write_text(f"__version__ = '{version}'\ngit_version = 'abc'\n")
        monkeypatch.delitem(sys.modules, name, raising=False)
        names.append(name)

    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    yield install
    for name in names:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def torch_build(tmp_path, cuda: bool):
    lib = tmp_path / ("torch-cuda" if cuda else "torch-cpu") / "lib"
    lib.mkdir(parents=True)
    (lib / "libtorch_cpu.so").write_bytes(b"")
    if cuda:
        (lib / "libtorch_cuda.so").write_bytes(b"")
    return lib.parent


def test_cuda_builds_beside_a_cpu_torch_are_hidden_and_cpu_builds_kept(installed, tmp_path):
    installed("torchvision", "0.28.0+cu130")
    installed("torchaudio", "2.11.1+cu132")
    installed("torchcodec", "0.17.0")
    importlib.invalidate_caches()
    assert hide_cuda_extensions(torch_build(tmp_path, cuda=False)) == ["torchvision", "torchaudio"]
    assert importlib.util.find_spec("torchvision") is None, "transformers' way of looking finds nothing"
    with pytest.raises(ImportError):
        import torchvision  # noqa: F401
    assert importlib.util.find_spec("torchcodec") is not None


def test_beside_a_cuda_torch_nothing_is_hidden(installed, tmp_path):
    installed("torchvision", "0.28.0+cu130")
    importlib.invalidate_caches()
    assert hide_cuda_extensions(torch_build(tmp_path, cuda=True)) == []
    assert importlib.util.find_spec("torchvision") is not None


def test_transformers_imported_first_asks_again_whether_a_hidden_package_is_there(installed, tmp_path, monkeypatch):
    import functools
    import types

    installed("torchvision", "0.28.0+cu130")
    importlib.invalidate_caches()
    utils = types.ModuleType("transformers.utils.import_utils")  # its cache, as transformers keeps it
    utils.is_torchvision_available = functools.lru_cache(lambda: importlib.util.find_spec("torchvision") is not None)
    monkeypatch.setitem(sys.modules, "transformers.utils.import_utils", utils)
    assert utils.is_torchvision_available(), "asked before tempering was imported"
    assert hide_cuda_extensions(torch_build(tmp_path, cuda=False)) == ["torchvision"]
    assert not utils.is_torchvision_available()
