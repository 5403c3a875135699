"""The llamacpp generation backend without llama.cpp: the clear errors for anything but a .gguf file, and the
decoding loop (parallel sequences, refill, compaction, eos, seeds) against a fake ``llama_cpp`` module whose
"model" is a fixed function of each sequence's own token history. The real model: test_llamacpp_replay_slow.py."""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import types

import numpy as np
import pytest
import torch

from sift.corpus.config import HFCorpusConfig
from sift.errors import SiftError
from sift.lm.generation import RowSampler, make_backend, trace_seed

V, EOS = 40, 3


def _gguf(tmp_path, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 24)  # version 3, no tensors or metadata, padded
    return p


# ---- the path must be a .gguf file (no llama_cpp needed: the error comes first) ----

def test_a_folder_or_hub_name_fails_at_once_naming_the_path(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # never reached
    folder = tmp_path / "qwen-folder"
    folder.mkdir()
    with pytest.raises(SiftError, match=rf"backend=llamacpp reads a \.gguf file; {folder} is a model folder; pass"):
        make_backend("llamacpp", str(folder), batch_size=4)
    conv = tmp_path / "converted"
    conv.mkdir()
    (conv / "sift_gguf.json").write_text(json.dumps({"source": "/models/m-q4_k_m.gguf"}))
    with pytest.raises(SiftError, match=r"is a model folder \(converted from /models/m-q4_k_m\.gguf: pass that file\)"):
        make_backend("llamacpp", str(conv))
    with pytest.raises(SiftError, match=r"Qwen/Qwen2\.5-0\.5B-Instruct is not a local file \(a hub name"):
        make_backend("llamacpp", "Qwen/Qwen2.5-0.5B-Instruct")
    (tmp_path / "notes.bin").write_bytes(b"PK\x03\x04")
    with pytest.raises(SiftError, match=r"notes\.bin is not one \(no GGUF magic bytes\)"):
        make_backend("llamacpp", str(tmp_path / "notes.bin"))
    with pytest.raises(SiftError, match="needs the path of the .gguf file"):
        make_backend("llamacpp", None)


def test_without_llama_cpp_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(SiftError, match=r"needs llama-cpp-python: pip install 'sift\[llamacpp\]'"):
        make_backend("llamacpp", str(_gguf(tmp_path)))


def test_the_corpus_config_refuses_a_folder_before_any_work(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    cfg = HFCorpusConfig(models=[str(_gguf(tmp_path)), str(folder)], backend="llamacpp")
    with pytest.raises(SiftError, match=rf"models\[1\]: source.backend=llamacpp reads a \.gguf file; {folder}"):
        cfg.validate()
    with pytest.raises(SiftError, match="backend must be 'hf', 'vllm' or 'llamacpp', got 'tgi'"):
        HFCorpusConfig(models=[str(folder)], backend="tgi").validate()


# ---- the decoding loop, on a fake llama_cpp ----

def _logits(history: list[int]) -> np.ndarray:
    """The fake model: fixed pseudo-random logits of the sequence's whole history."""
    seed = int.from_bytes(hashlib.sha256(np.asarray(history, dtype=np.int64).tobytes()).digest()[:4], "little")
    return np.random.default_rng(seed).normal(0, 2, V).astype(np.float32)


class _Ctx:
    def __init__(self, params):
        self.params, self.kv, self.out, self.calls, self.freed = params, {}, {}, [], False


def fake_llama_cpp():
    made: dict = {"ctx": [], "llama": [], "cp": []}

    class llama_context_params:  # noqa: N801 - the C struct's name
        _fields_ = [("n_ctx", None), ("n_batch", None), ("n_ubatch", None), ("n_seq_max", None),
                    ("n_threads", None), ("n_threads_batch", None), ("kv_unified", None), ("no_perf", None)]

    class Llama:
        def __init__(self, model_path, **kw):
            self.model_path, self.kw, self.model, self.closed = model_path, kw, object(), False
            made["llama"].append(self)

        def n_vocab(self):
            return V

        def token_eos(self):
            return EOS

        def close(self):
            self.closed = True

    def llama_init_from_model(model, params):
        ctx = _Ctx(params)
        made["ctx"].append(ctx)
        return ctx

    def llama_batch_init(n, embd, n_seq):
        return types.SimpleNamespace(n_tokens=0, token=[0] * n, pos=[0] * n, n_seq_id=[0] * n,
                                     seq_id=[[0] for _ in range(n)], logits=[0] * n)

    def llama_decode(ctx, b):
        seqs, outputs = [], set()
        ctx.out = {}
        for j in range(b.n_tokens):
            seq = b.seq_id[j][0]
            assert 0 <= seq < ctx.params.n_seq_max and b.n_seq_id[j] == 1
            hist = ctx.kv.setdefault(seq, [])
            assert b.pos[j] == len(hist), "positions continue the sequence"
            assert len(hist) < ctx.params.n_ctx // ctx.params.n_seq_max, "room in the sequence's context"
            hist.append(b.token[j])
            if b.logits[j]:
                assert seq not in outputs, "one output per sequence per call"
                outputs.add(seq)
                ctx.out[j] = _logits(hist)
            if not seqs or seqs[-1] != seq:
                seqs.append(seq)
        ctx.calls.append((seqs, b.n_tokens))
        return 0

    def llama_get_logits_ith(ctx, j):
        return ctx.out[j].ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    def seq_rm(mem, seq, p0, p1):
        assert (p0, p1) == (-1, -1)
        mem.kv.pop(seq, None)
        return True

    def seq_cp(mem, src, dst, p0, p1):
        assert (p0, p1) == (-1, -1)
        made["cp"].append((src, dst))
        mem.kv[dst] = list(mem.kv.get(src, []))

    mod = types.SimpleNamespace(
        __version__="0.0-fake", llama_context_params=llama_context_params, Llama=Llama,
        llama_max_parallel_sequences=lambda: 256,
        llama_context_default_params=lambda: types.SimpleNamespace(),
        llama_init_from_model=llama_init_from_model, llama_n_ctx_seq=lambda c: c.params.n_ctx // c.params.n_seq_max,
        llama_get_memory=lambda c: c, llama_memory_clear=lambda m, data: m.kv.clear(),
        llama_memory_seq_rm=seq_rm, llama_memory_seq_cp=seq_cp, llama_batch_init=llama_batch_init,
        llama_batch_free=lambda b: None, llama_decode=llama_decode, llama_get_logits_ith=llama_get_logits_ith,
        llama_free=lambda c: setattr(c, "freed", True))
    return mod, made


def _alone(prompt, max_new, sampler=None, row=0):
    """One prompt decoded by itself on the fake model: the reference."""
    hist, out = list(prompt), []
    while len(out) < max_new:
        scores = _logits(hist)
        if sampler is None:
            t = int(scores.argmax())
        else:
            t = int(sampler.choose(torch.from_numpy(scores)[None], [row])[0])
        if t == EOS:
            break
        out.append(t)
        hist.append(t)
    return out


PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14], [15, 16], [17, 18, 19, 20], [21, 22, 23], [24] * 7, [25, 26],
           [27, 28, 29, 30, 31]]


@pytest.fixture
def fake(monkeypatch, tmp_path):
    mod, made = fake_llama_cpp()
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    return _gguf(tmp_path), made


def test_greedy_ids_equal_each_prompt_decoded_alone(fake):
    path, made = fake
    backend = make_backend("llamacpp", str(path), batch_size=3, n_batch=8)
    (llm,) = made["llama"]
    assert llm.model_path == str(path) and llm.kw["verbose"] is False and llm.kw["logits_all"] is False
    assert llm.kw["n_threads"] == 3 == backend.n_threads  # torch's thread count (OMP_NUM_THREADS, workers)
    want = [_alone(p, 12) for p in PROMPTS]
    assert any(len(w) < 12 for w in want) and any(len(w) == 12 for w in want)  # some end at the eos, some at the cap
    got = backend.generate(PROMPTS, max_new_tokens=12)
    assert got == want and all(EOS not in g for g in got)
    (ctx,) = made["ctx"]
    p = ctx.params
    assert p.n_seq_max == 3 and p.kv_unified is False and p.n_threads == p.n_threads_batch == 3
    assert p.n_ctx // p.n_seq_max >= max(map(len, PROMPTS)) + 12 and p.n_batch == 8
    # every call feeds consecutive sequence ids (llama.cpp batches only those together), ≤ 3 in flight; a call of
    # one token per row (no prompt admitted) starts at sequence 0: finished rows leave no gaps
    assert len(ctx.calls) > 12
    for seqs, n_tokens in ctx.calls:
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and max(seqs) < 3
        if n_tokens == len(seqs):
            assert seqs[0] == 0
    assert made["cp"] and all(src > dst for src, dst in made["cp"])  # rows moved down when a lower one ended
    # the same context serves the next call (emptied); a larger one is made only when needed
    assert backend.generate(PROMPTS[::-1], max_new_tokens=12) == want[::-1] and len(made["ctx"]) == 1
    backend.generate([[1] * 300], max_new_tokens=4)
    assert len(made["ctx"]) == 2 and made["ctx"][0].freed
    backend.close()
    assert llm.closed and made["ctx"][1].freed


def test_sampling_uses_each_prompts_own_seeded_stream(fake):
    path, _ = fake
    backend = make_backend("llamacpp", str(path), batch_size=4)
    seeds = [trace_seed(f"p{i}", 5) for i in range(len(PROMPTS))]
    kw = dict(max_new_tokens=10, do_sample=True, temperature=0.9, top_p=0.95)
    got = backend.generate(PROMPTS, seeds=seeds, **kw)
    want = [_alone(p, 10, RowSampler([s], temperature=0.9, top_p=0.95)) for p, s in zip(PROMPTS, seeds)]
    assert got == want  # a prompt's sample does not depend on its batch (same streams as the hf backend)
    assert got != backend.generate(PROMPTS, max_new_tokens=10)
    other = backend.generate(PROMPTS, seeds=[trace_seed(f"p{i}", 6) for i in range(len(PROMPTS))], **kw)
    assert other != got
    with pytest.raises(SiftError, match="one seed per prompt"):
        backend.generate(PROMPTS, max_new_tokens=4, do_sample=True)


def test_eos_from_the_tokenizer_and_bad_prompts(fake):
    path, _ = fake
    first = _alone(PROMPTS[0], 1)[0]  # prompt 0's first greedy token, made the eos: its reply is empty
    tok = types.SimpleNamespace(eos_token_id=first)
    backend = make_backend("llamacpp", str(path), None, tok, batch_size=2)
    assert backend.eos == [first] and backend.generate(PROMPTS[:2], max_new_tokens=5)[0] == []
    assert backend.generate([], max_new_tokens=5) == []
    with pytest.raises(SiftError, match="prompt 1 is empty"):
        backend.generate([[5], []], max_new_tokens=3)
    with pytest.raises(SiftError, match=f"outside the model's vocabulary of {V}"):
        backend.generate([[5, V]], max_new_tokens=3)


def test_a_too_old_llama_cpp_python_is_named(fake, monkeypatch):
    path, _ = fake
    old = sys.modules["llama_cpp"]
    del old.llama_memory_seq_cp
    with pytest.raises(SiftError, match=r"llama-cpp-python 0\.0-fake is too old .*no llama_memory_seq_cp"):
        make_backend("llamacpp", str(path))
