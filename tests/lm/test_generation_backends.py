"""Per-trace seeded sampling, the generation backends (hf; vllm through a fake module) and the GGUF folder cache."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import types

import numpy as np
import pytest
import torch
from tinylm import make_model, make_tokenizer, write_tiny_llama_gguf

import sift.lm.loading as loading
from sift.errors import SiftError
from sift.lm.generation import HFBackend, RowSampler, generate_ids, left_padded, make_backend, trace_seed
from sift.lm.loading import gguf_cache_folder, load_causal_lm, resolve_model_path

TEXTS = ["Calculate 5 - 3 - 6.", "Tom has 3 apples and gets 4 more. How many apples does he have?",
         "Answer: 42", "Options:\n(A) red\n(B) blue\nStep 1: 3 + 4 = 7"]
SAMPLE = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_p=0.95)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request, tiny_dirs):
    model, tok = load_causal_lm(str(tiny_dirs[request.param]))
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # different lengths: left padding matters
    return model, tok, prompts


def _gen(model, tok, prompts, seeds, eos_id=None, **kw):
    eos = tok.eos_token_id if eos_id is None else eos_id
    return [g.new_ids for g in generate_ids(model, prompts, pad_id=tok.pad_token_id, eos_id=eos, seeds=seeds,
                                            batch_size=len(prompts), **{**SAMPLE, **kw})]


def test_trace_seed_is_stable_63_bit_and_keyed():
    s = trace_seed("gsm8k-12/view-3", 0)
    assert s == trace_seed("gsm8k-12/view-3", 0) and 0 <= s < 2 ** 63
    assert len({s, trace_seed("gsm8k-12/view-4", 0), trace_seed("gsm8k-12/view-3", 1)}) == 3


def test_a_prompts_sample_does_not_depend_on_its_batch(lm):
    model, tok, prompts = lm
    seeds = [trace_seed(f"p{i}", 7) for i in range(len(prompts))]
    alone = [_gen(model, tok, [p], [s])[0] for p, s in zip(prompts, seeds)]
    together = _gen(model, tok, prompts, seeds)
    order = [2, 0, 3, 1]
    shuffled = _gen(model, tok, [prompts[i] for i in order], [seeds[i] for i in order])
    assert together == alone
    assert shuffled == [alone[i] for i in order]
    assert all(len(a) > 0 for a in alone)
    # other company: prompt 0 beside two strangers with other seeds
    (mixed, *_) = _gen(model, tok, [prompts[0], prompts[3], prompts[1]], [seeds[0], 11, 12])
    assert mixed == alone[0]


def test_different_seeds_give_different_samples(lm):
    model, tok, prompts = lm
    a = _gen(model, tok, prompts, [trace_seed(f"p{i}", 1) for i in range(4)])
    b = _gen(model, tok, prompts, [trace_seed(f"p{i}", 2) for i in range(4)])
    assert a == _gen(model, tok, prompts, [trace_seed(f"p{i}", 1) for i in range(4)])
    assert a != b


def test_finished_rows_do_not_matter(lm):
    """Row 1 stops at once (its first sampled token made the eos); the others match their runs alone."""
    model, tok, prompts = lm
    seeds = [trace_seed(f"p{i}", 3) for i in range(4)]
    unused = len(tok) + 5  # never generated: no row stops
    first = _gen(model, tok, [prompts[1]], [seeds[1]], eos_id=unused)[0][0]
    alone = [_gen(model, tok, [p], [s], eos_id=first)[0] for p, s in zip(prompts, seeds)]
    together = _gen(model, tok, prompts, seeds, eos_id=first)
    assert alone[1] == [] and together == alone
    assert first not in sum(together, [])


def _old_greedy(model, prompts, pad_id, eos_id, max_new_tokens):
    """The generate_ids greedy path before per-trace seeds (reference)."""
    ids, mask, _ = left_padded(prompts, pad_id)
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                             eos_token_id=eos_id, use_cache=True, do_sample=False)
    out = []
    for row in gen[:, ids.shape[1]:].tolist():
        row = row[:row.index(eos_id)] if eos_id in row else row
        while row and row[-1] == pad_id:
            row.pop()
        out.append(row)
    return out


def test_greedy_is_unchanged(lm):
    model, tok, prompts = lm
    new = generate_ids(model, prompts, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, max_new_tokens=10)
    assert [g.new_ids for g in new] == _old_greedy(model, prompts, tok.pad_token_id, tok.eos_token_id, 10)
    assert [g.prompt_ids for g in new] == prompts


def test_sampling_without_seeds_seeds_each_prompt_by_its_index(lm):
    model, tok, prompts = lm
    kw = dict(pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, batch_size=2, **SAMPLE)
    default = [g.new_ids for g in generate_ids(model, prompts, **kw)]
    assert default == [g.new_ids for g in generate_ids(model, prompts,
                                                       seeds=[trace_seed(str(i), 0) for i in range(4)], **kw)]
    with pytest.raises(SiftError, match="one seed per prompt"):
        generate_ids(model, prompts, seeds=[1, 2], **kw)


def test_hf_backend_keeps_input_order(lm):
    model, tok, prompts = lm
    backend = make_backend("hf", None, model, tok, batch_size=3)
    assert isinstance(backend, HFBackend) and backend.batch_size == 3
    order = [3, 0, 2, 1]  # longest first: the backend re-sorts by length and puts the results back
    ps = [prompts[i] for i in order]
    greedy = backend.generate(ps, max_new_tokens=8)
    assert greedy == _old_greedy(model, ps, tok.pad_token_id, tok.eos_token_id, 8)
    seeds = [trace_seed(f"p{i}", 9) for i in order]
    sampled = backend.generate(ps, seeds=seeds, **SAMPLE)
    assert sampled == [_gen(model, tok, [p], [s])[0] for p, s in zip(ps, seeds)]
    with pytest.raises(SiftError, match="one seed per prompt"):
        backend.generate(ps, max_new_tokens=4, do_sample=True)


def test_row_sampler_masks_all_but_one_token():
    scores = torch.tensor([[0.0, 5.0, 1.0, -1.0], [2.0, 2.0, 2.0, float("-inf")]])
    out = RowSampler([1, 2], top_p=1.0)(None, scores)
    assert (torch.isfinite(out).sum(-1) == 1).all() and torch.isfinite(out[1, :3]).any()
    assert torch.isinf(out[1, 3])  # a masked token is never drawn
    tight = RowSampler([3, 4], top_p=0.01)(None, scores)  # top_p this small keeps the top token only
    assert tight[0].argmax().item() == 1
    with pytest.raises(SiftError, match="temperature"):
        RowSampler([1], temperature=0.0)
    with pytest.raises(SiftError, match="2 seeds but the batch has 1 rows"):
        RowSampler([1, 2])(None, scores[:1])


def test_make_backend_errors():
    with pytest.raises(SiftError, match="unknown generation backend 'tgi'"):
        make_backend("tgi", "m")
    with pytest.raises(SiftError, match="needs a loaded model"):
        make_backend("hf", "m")


# ---- vLLM (not installable here: a missing module, and a fake one that records the calls) ----

def test_vllm_missing_gives_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(SiftError, match=r"needs vLLM and a GPU: pip install 'sift\[vllm\]'"):
        make_backend("vllm", "some/model", batch_size=8)


def _fake_vllm(eos: int):
    calls: dict = {"init": [], "generate": []}

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            calls["init"].append(kw)

        def get_tokenizer(self):
            return types.SimpleNamespace(eos_token_id=eos)

        def generate(self, prompts=None, sampling_params=None, use_tqdm=True):
            calls["generate"].append((prompts, sampling_params))
            outs = []
            for p in prompts:  # odd-length prompts: their last id then eos; even: an eos inside, none at the end
                ids = p["prompt_token_ids"]
                ids = (ids[-1], eos) if len(ids) % 2 else (7, eos, 8)
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids)]))
            return outs

    return types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, __name__="vllm"), calls


def test_vllm_backend_passes_ids_seeds_and_strips_eos(monkeypatch, tmp_path):
    eos = 99
    fake, calls = _fake_vllm(eos)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    backend = make_backend("vllm", str(tmp_path), None, None, batch_size=16, dtype="bfloat16",
                           gpu_memory_utilization=0.5)
    (init,) = calls["init"]
    assert init["model"] == str(tmp_path) and init["dtype"] == "bfloat16" and init["max_num_seqs"] == 16
    assert init["gpu_memory_utilization"] == 0.5 and backend.eos == [eos]
    prompts = [[1, 2, 3], [4, 5]]
    assert backend.generate(prompts, max_new_tokens=6) == [[3], [7, eos, 8]]  # only a trailing eos goes
    (ins, params) = calls["generate"][0]
    assert ins == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    for p in params:
        assert p.kw["temperature"] == 0.0 and p.kw["max_tokens"] == 6 and "seed" not in p.kw
        assert p.kw["skip_special_tokens"] is False and p.kw["stop_token_ids"] == [eos]
    backend.generate(prompts, max_new_tokens=5, do_sample=True, temperature=0.7, top_p=0.9, seeds=[11, -3])
    (_, params) = calls["generate"][1]
    assert [p.kw["seed"] for p in params] == [11, (-3) & (2 ** 63 - 1)]
    assert all(p.kw["temperature"] == 0.7 and p.kw["top_p"] == 0.9 for p in params)
    with pytest.raises(SiftError, match="one seed per prompt"):
        backend.generate(prompts, max_new_tokens=5, do_sample=True)
    assert backend.generate([], max_new_tokens=5) == []


def test_vllm_backend_serves_a_gguf_from_its_converted_folder(monkeypatch, tmp_path):
    fake, calls = _fake_vllm(0)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_gguf_to_folder", _fake_convert)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 64)
    make_backend("vllm", str(gguf), None, types.SimpleNamespace(eos_token_id=0))
    assert calls["init"][0]["model"] == str(gguf_cache_folder(gguf))


# ---- GGUF converted once ----

def _fake_convert(path, out, delay: float = 0.0, log: list | None = None):
    if log is not None:
        log.append(str(path))
    time.sleep(delay)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"weights")


def test_gguf_cache_folder_key_and_hash_sidecar(monkeypatch, tmp_path):
    import hashlib

    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.Q4.gguf"
    data = b"GGUF" + os.urandom(3 * loading.HASH_BLOCK // 2)  # more than one hash block
    gguf.write_bytes(data)
    want = tmp_path / "cache" / "gguf" / f"tiny.Q4-{hashlib.sha256(data).hexdigest()[:16]}"
    assert gguf_cache_folder(gguf) == want
    monkeypatch.setattr(loading, "_sha256_file", lambda p: pytest.fail("rehashed an unchanged file"))
    assert gguf_cache_folder(str(gguf)) == want  # from the sidecar
    hashed = []
    monkeypatch.setattr(loading, "_sha256_file", lambda p: hashed.append(p) or "ab" * 32)
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # touched: hashed again
    assert gguf_cache_folder(gguf).name == "tiny.Q4-" + "ab" * 8 and len(hashed) == 1


def test_gguf_converted_once_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x01" * 100)
    folder = gguf_cache_folder(gguf)

    def broken(path, out):  # dies half-way: no folder, no temporary left behind
        (out / "config.json").write_text("{}")
        raise RuntimeError("bad tensor")

    monkeypatch.setattr(loading, "_gguf_to_folder", broken)
    with pytest.raises(SiftError, match="could not load GGUF model .RuntimeError: bad tensor"):
        resolve_model_path(str(gguf))
    assert not folder.exists() and not list(folder.parent.glob(f".{folder.name}.tmp-*"))

    folder.mkdir()  # a half-written folder at the target (no record) is never used, but replaced
    (folder / "config.json").write_text("{}")
    log: list = []
    monkeypatch.setattr(loading, "_gguf_to_folder", lambda p, o: _fake_convert(p, o, log=log))
    assert resolve_model_path(str(gguf)) == str(folder)
    rec = json.loads((folder / "sift_gguf.json").read_text())
    assert rec["source"] == str(gguf.resolve()) and len(rec["sha256"]) == 64 and rec["transformers_version"]
    assert (folder / "model.safetensors").read_bytes() == b"weights" and len(log) == 1
    assert resolve_model_path(str(gguf)) == str(folder) and len(log) == 1  # reused
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)  # anything else is unchanged
    assert resolve_model_path("org/model") == "org/model"


def test_concurrent_writers_convert_once(monkeypatch, tmp_path):
    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x02" * 100)
    log: list = []
    monkeypatch.setattr(loading, "_gguf_to_folder", lambda p, o: _fake_convert(p, o, delay=0.3, log=log))
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(resolve_model_path(str(gguf)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(log) == 1 and len(set(got)) == 1 and len(got) == 3


def test_a_racing_second_writer_keeps_the_first_folder(monkeypatch, tmp_path):
    """Without the lock's protection (e.g. a file system without locks): the rename loses, the winner stays."""
    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x03" * 100)
    folder = gguf_cache_folder(gguf)

    def racing(path, out):  # another process finishes first while we convert
        _fake_convert(path, out)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"winner": 1}')
        (folder / "sift_gguf.json").write_text("{}")

    monkeypatch.setattr(loading, "_gguf_to_folder", racing)
    assert resolve_model_path(str(gguf)) == str(folder)
    assert json.loads((folder / "config.json").read_text()) == {"winner": 1}
    assert not list(folder.parent.glob(f".{folder.name}.tmp-*"))


def test_tiny_gguf_converts_to_an_equivalent_folder(monkeypatch, tmp_path):
    pytest.importorskip("accelerate")  # transformers loads GGUF files only with accelerate installed
    monkeypatch.setenv("SIFT_CACHE", str(tmp_path / "cache"))
    tok = make_tokenizer(chat=True)
    model = make_model("llama", tok, seed=2)
    gguf = tmp_path / "tiny-llama.F32.gguf"
    write_tiny_llama_gguf(gguf, model, tok)
    m2, t2 = load_causal_lm(str(gguf))
    folder = gguf_cache_folder(gguf)
    assert (folder / "sift_gguf.json").is_file() and list(folder.glob("*.safetensors"))
    text = "Step 1: 3 + 4 = 7\nAnswer: 7"
    ids = torch.tensor([tok(text)["input_ids"]])
    assert t2(text, add_special_tokens=False)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        np.testing.assert_allclose(m2(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)
    # the second load reads the folder: no conversion, no rehash
    monkeypatch.setattr(loading, "_gguf_to_folder", lambda p, o: pytest.fail("converted twice"))
    monkeypatch.setattr(loading, "_sha256_file", lambda p: pytest.fail("rehashed"))
    m3, t3 = load_causal_lm(str(gguf), dtype="float32")
    assert t3.chat_template == tok.chat_template and t3.eos_token == "<|endoftext|>"
    with torch.no_grad():
        np.testing.assert_allclose(m3(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5)
    assert resolve_model_path(str(gguf)) == str(folder)


def test_a_finished_row_leaves_the_batch(lm, monkeypatch):
    """Once a row emits the eos, later forward passes carry only the rows still generating; ids are unchanged."""
    model, tok, prompts = lm
    unused = len(tok) + 5  # never generated
    lone = generate_ids(model, [prompts[1]], pad_id=tok.pad_token_id, eos_id=unused, max_new_tokens=1)
    eos = lone[0].new_ids[0]  # prompt 1's first greedy token: as eos, row 1 ends at step one
    rows = []
    forward = model.forward

    @functools.wraps(forward)  # the same signature: the cache argument is found by name
    def counting(*a, **kw):
        rows.append(kw["input_ids"].shape[0])
        return forward(*a, **kw)

    monkeypatch.setattr(model, "forward", counting)
    got = [g.new_ids for g in generate_ids(model, prompts, pad_id=tok.pad_token_id, eos_id=eos, max_new_tokens=8)]
    monkeypatch.undo()
    assert got[1] == [] and rows[0] == 4 and rows[1] <= 3 and rows == sorted(rows, reverse=True)
    assert len(rows) == 1 + max(len(g) for g in got) - (max(len(g) for g in got) == 8)
    assert got == _old_greedy(model, prompts, tok.pad_token_id, eos, 8)


def test_free_places_are_refilled_with_the_same_ids(lm, monkeypatch):
    """Two places for four prompts: when a row ends the next prompt is prefilled and merged into the cache.
    Greedy and seeded ids equal the prompts' runs alone; no forward pass carries more than two rows."""
    model, tok, prompts = lm
    unused = len(tok) + 5
    eos = generate_ids(model, [prompts[0]], pad_id=tok.pad_token_id, eos_id=unused, max_new_tokens=3)[0].new_ids[2]
    kw = dict(pad_id=tok.pad_token_id, eos_id=eos, max_new_tokens=9)
    alone = [generate_ids(model, [p], **kw)[0].new_ids for p in prompts]
    calls = []
    forward = model.forward

    @functools.wraps(forward)
    def counting(*a, **k):
        calls.append(tuple(k["input_ids"].shape))
        return forward(*a, **k)

    monkeypatch.setattr(model, "forward", counting)
    together = [g.new_ids for g in generate_ids(model, prompts, batch_size=2, **kw)]
    monkeypatch.undo()
    assert together == alone and len(alone[0]) == 2  # row 0 ends early: its place is refilled
    assert max(rows for rows, _ in calls) == 2
    assert sum(width > 1 for _, width in calls) >= 2  # a prefill after the first: a merge
    seeds = [trace_seed(f"p{i}", 4) for i in range(4)]
    sampled_alone = [_gen(model, tok, [p], [s], eos_id=eos)[0] for p, s in zip(prompts, seeds)]
    sampled = [g.new_ids for g in generate_ids(model, prompts, seeds=seeds, batch_size=2,
                                               **{**SAMPLE, "eos_id": eos, "pad_id": tok.pad_token_id})]
    assert sampled == sampled_alone
