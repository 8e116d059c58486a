"""Model paths that cannot be loaded are ModelLoadErrors that say why, not deep tracebacks."""

import pytest

from tempering.config import PretrainConfig
from tempering.models.loading import ModelLoadError, load_model, resolve_model_path


@pytest.mark.parametrize("path", ["/nonexistent/model", "./no-model-here", "~/no-model-here"])
def test_a_missing_local_path_is_named_as_missing(path):
    with pytest.raises(ModelLoadError, match=f"model path {path} does not exist"):
        load_model(path)


def test_a_folder_without_a_model_cannot_be_loaded(tmp_path):
    with pytest.raises(ModelLoadError, match=f"model folder {tmp_path} is missing config.json, weights"):
        load_model(str(tmp_path))


def test_an_unknown_builtin_model_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match="known built-in models are builtin:tiny and builtin:smollm2"):
        resolve_model_path("builtin:huge", PretrainConfig())
