"""load_causal_lm: local folders, a tiny writer-made GGUF, and fast clear failures (never a download)."""

import time

import numpy as np
import pytest
import torch
from tinylm import make_model, make_tokenizer, write_tiny_llama_gguf

from sift.errors import SiftError
from sift.lm.loading import load_causal_lm


def test_local_folder(tiny_dirs):
    model, tok = load_causal_lm(str(tiny_dirs["gpt2"]))
    assert model.config.n_layer == 2 and tok.pad_token_id is not None and not model.training


def test_tiny_gguf_loads_with_the_same_logits_and_tokenizer(tmp_path):
    pytest.importorskip("accelerate")  # transformers loads GGUF files only with accelerate installed
    tok = make_tokenizer(chat=True)
    model = make_model("llama", tok, seed=1)
    path = tmp_path / "tiny-llama.F32.gguf"
    write_tiny_llama_gguf(path, model, tok)
    m2, t2 = load_causal_lm(str(path))
    assert type(m2).__name__ == "LlamaForCausalLM"
    text = "Step 1: 3 + 4 = 7\nAnswer: 7"
    assert t2(text, add_special_tokens=False)["input_ids"] == tok(text)["input_ids"]
    assert t2.chat_template == tok.chat_template and t2.eos_token == "<|endoftext|>"
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        np.testing.assert_allclose(m2(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)


def test_non_gguf_file_with_gguf_name(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"not a gguf at all")
    with pytest.raises(SiftError, match="not a GGUF file"):
        load_causal_lm(str(p))


def test_truncated_gguf_gives_a_clear_error(tmp_path):
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(SiftError, match="could not load GGUF model"):
        load_causal_lm(str(p))


def test_missing_path():
    with pytest.raises(SiftError, match="model path does not exist"):
        load_causal_lm("/nonexistent/dir/model.gguf")
    with pytest.raises(SiftError, match="model path does not exist"):
        load_causal_lm("./no-such-model-folder")


def test_folder_without_config(tmp_path):
    with pytest.raises(SiftError, match="no config.json"):
        load_causal_lm(str(tmp_path))


def test_uncached_hub_name_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    t0 = time.time()
    with pytest.raises(SiftError, match="neither a local path nor in the local Hugging Face cache"):
        load_causal_lm("sift-tests/not-a-cached-model")
    assert time.time() - t0 < 10


@pytest.mark.parametrize("amx,avx512_bf16,expected", [(True, False, "bfloat16"), (False, True, "bfloat16"),
                                                       (False, False, "float32")])
def test_auto_dtype_is_bfloat16_only_on_cpus_that_compute_it(monkeypatch, amx, avx512_bf16, expected):
    from sift.lm.loading import resolve_dtype

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    assert resolve_dtype("auto", "cpu") == expected
    assert resolve_dtype("float16", "cpu") == "float16" and resolve_dtype(None, "cpu") is None


def test_auto_dtype_on_cuda_without_a_gpu_is_float32(monkeypatch):
    from sift.lm.loading import resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto", "cuda:0") == "float32"


def test_unknown_dtype_is_refused_by_name():
    from sift.lm.loading import resolve_dtype

    with pytest.raises(SiftError, match="dtype: expected one of auto, float32, bfloat16, float16 or null, got 'fp8'"):
        resolve_dtype("fp8", "cpu")


def test_auto_dtype_loads_the_weights_in_the_resolved_dtype(monkeypatch, tiny_dirs):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    model, _ = load_causal_lm(str(tiny_dirs["gpt2"]), dtype="auto")
    assert next(model.parameters()).dtype == torch.bfloat16
