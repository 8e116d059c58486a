"""Model paths that cannot be loaded are ModelLoadErrors that say why, not deep tracebacks."""

import importlib.util
import socket

import huggingface_hub
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

from tempering.config import PretrainConfig
from tempering.models.loading import ModelLoadError, load_model
from tempering.models.tiny import build_tokenizer
from tempering.policy import resolve_model_path


@pytest.mark.parametrize("path", ["/nonexistent/model", "./no-model-here", "~/no-model-here"])
def test_a_missing_local_path_is_named_as_missing(path):
    with pytest.raises(ModelLoadError, match=f"model path {path} does not exist"):
        load_model(path)


def test_a_folder_without_a_model_cannot_be_loaded(tmp_path):
    with pytest.raises(ModelLoadError, match=f"model folder {tmp_path} is missing config.json, weights"):
        load_model(str(tmp_path))


def test_an_unknown_builtin_model_lists_the_known_ones():
    with pytest.raises(ModelLoadError, match="known built-in models are builtin:tiny, builtin:generalist, builtin:tiny-long, builtin:smollm2"):
        resolve_model_path("builtin:huge", PretrainConfig())


def _save(folder, model):
    """``model`` and the built-in tokenizer saved as a model folder."""
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def _tiny_llama(**changes):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(build_tokenizer()), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, **changes))


def test_a_bert_folder_is_named_as_not_a_causal_language_model(tmp_path):
    bert = BertForMaskedLM(BertConfig(vocab_size=len(build_tokenizer()), hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64))
    with pytest.raises(ModelLoadError, match=f"model folder {tmp_path} holds a BertForMaskedLM, not a causal language model"):
        load_model(str(_save(tmp_path, bert)))


def test_an_encoder_decoder_folder_is_named_as_not_a_causal_language_model(tmp_path):
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=len(build_tokenizer()), d_model=32, d_kv=8, d_ff=64,
                                             num_layers=1, num_heads=2))
    with pytest.raises(ModelLoadError, match=f"model folder {tmp_path} holds a T5ForConditionalGeneration"):
        load_model(str(_save(tmp_path, t5)))


def test_a_sharded_checkpoint_missing_a_shard_names_the_index_and_the_shard(tmp_path):
    _save(tmp_path, _tiny_llama()).joinpath("model.safetensors").unlink()
    _tiny_llama().save_pretrained(tmp_path, max_shard_size="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    with pytest.raises(ModelLoadError, match=f"model folder {tmp_path}: model.safetensors.index.json names "
                                             f"{shards[1].name}, which is missing"):
        load_model(str(tmp_path))


def test_a_missing_gguf_file_is_named_as_missing(tmp_path):
    with pytest.raises(ModelLoadError, match=f"model path {tmp_path}/model.gguf does not exist"):
        load_model(str(tmp_path / "model.gguf"))


def test_a_gguf_file_without_the_gguf_package_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ModelLoadError, match=r"model.gguf is a GGUF file; loading it needs: pip install 'tempering\[gguf\]'"):
        load_model(str(tmp_path / "model.gguf"))


def test_a_hub_id_offline_and_not_cached_says_to_give_a_local_model(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="model.path 'someone/some-model' is not a local folder or file, and it "
                                             "is not in the Hugging Face cache; the hub is off .HF_HUB_OFFLINE."):
        load_model("someone/some-model")


def test_a_hub_id_with_the_hub_unreachable_fails_at_once_saying_so(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache; .* cannot be reached .no network.: "
                                             "give a local model folder or a .gguf file"):
        load_model("someone/some-model")


def _closed_port() -> int:
    """A local port nothing listens on (bound then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_run_folder_without_a_checkpoint_says_so(tmp_path):
    (tmp_path / "config.yaml").write_text("steps: 3\n")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ModelLoadError, match=f"run folder {tmp_path} holds no complete checkpoint yet"):
        resolve_model_path(str(tmp_path), PretrainConfig())
