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
    with pytest.raises(SiftError, match=r"broken.gguf: truncated GGUF file \(15 bytes"):
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


# ------------------------------------------------------------------------------ bad inputs before any work

def _tiny_gguf(tmp_path):
    tok = make_tokenizer(chat=True)
    path = tmp_path / "Tiny-Llama.F32.gguf"
    write_tiny_llama_gguf(path, make_model("llama", tok, seed=1), tok)
    return path


def test_truncated_gguf_is_named_with_its_size_before_loading(tmp_path):
    from sift.errors import PermanentError
    from sift.lm.loading import check_model, gguf_header

    path = _tiny_gguf(tmp_path)
    head = gguf_header(path)
    assert head["data_end"] == path.stat().st_size and head["metadata"]["general.name"] == "tiny-llama"
    check_model(str(path))  # complete: fine
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(PermanentError, match=rf"cut.gguf: truncated GGUF file: {cut.stat().st_size:,} bytes, its "
                                             rf"header needs {head['data_end']:,}"):
        check_model(str(cut))
    with pytest.raises(PermanentError, match="truncated GGUF file .* end inside its header"):
        cut.write_bytes(path.read_bytes()[:100])
        check_model(str(cut))
    with pytest.raises(PermanentError, match="truncated GGUF file"):  # load_causal_lm checks first
        load_causal_lm(str(cut))


def test_check_model_refuses_bad_inputs_by_name(tmp_path, monkeypatch):
    from sift.errors import PermanentError
    from sift.lm.loading import check_model

    p = tmp_path / "model.gguf"
    p.write_bytes(b"not a gguf at all")
    with pytest.raises(PermanentError, match=rf"{p}: not a GGUF file"):
        check_model(str(p))
    with pytest.raises(PermanentError, match="model path does not exist: /nope/m.gguf"):
        check_model("/nope/m.gguf")
    with pytest.raises(PermanentError, match="no config.json"):
        check_model(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(PermanentError, match="neither a local path nor in the local Hugging Face cache"):
        check_model("sift-tests/not-a-cached-model")


def test_model_names_not_paths(tmp_path, tiny_dirs):
    import json

    from sift.lm.loading import RECORD, model_name

    gguf = tmp_path / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    assert model_name(str(gguf)) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    converted = tmp_path / "qwen-0123456789abcdef"
    converted.mkdir()
    (converted / RECORD).write_text(json.dumps({"source": str(gguf)}))
    assert model_name(str(converted)) == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    folder = tmp_path / "local-copy"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}))
    assert model_name(str(folder) + "/") == "Qwen/Qwen2.5-7B-Instruct"
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "/home/me/models/x"}))
    assert model_name(str(folder)) == "local-copy"
    assert model_name("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"


def test_corpus_fails_before_any_chunk_job(tmp_path, tiny_dirs, monkeypatch):
    import sift.corpus.sources.hf as rc
    from sift.corpus.config import HFCorpusConfig
    from sift.errors import PermanentError

    monkeypatch.setattr(rc, "run_chunks", lambda *a, **k: pytest.fail("a chunk job started"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    for models, match in (([str(tiny_dirs["gpt2"]), "/nope/model.gguf"], "model path does not exist"),
                          ([str(bad)], "broken.gguf: truncated GGUF file")):
        t0 = time.time()
        with pytest.raises(PermanentError, match=match):
            rc.build_hf_corpus(HFCorpusConfig(models=models, n_items=2), tmp_path / "out", progress=False)
        assert time.time() - t0 < 5


@pytest.mark.parametrize("workers", [1, 2])
def test_a_permanent_failure_is_not_retried(tmp_path, capsys, workers):
    from omegaconf import OmegaConf

    from sift.errors import PermanentError
    from sift.execution import run_jobs

    cfg = OmegaConf.create({"workers": workers, "train_overrides": [], "executor": {"kind": "local", "retries": 3}})
    with pytest.raises(PermanentError, match="cannot load"):
        run_jobs(cfg, tmp_path, [_Spec("0")], _failing_job, lambda spec, res: None)
    out = capsys.readouterr().out
    assert "failed (attempt 1/4, not retried" in out and "attempt 2/4" not in out


class _Spec:
    def __init__(self, key):
        self.key = key


def _failing_job(cfg_yaml, out, spec, gpus, cfg=None):
    from sift.errors import PermanentError

    raise PermanentError("/m/model.gguf: cannot load")
