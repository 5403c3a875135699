"""The sharded, content-keyed, resumable trajectory cache written by the Lightning predict loop."""

import re
import shutil
from pathlib import Path

import pytest
import torch

from sift.errors import SiftError
from sift.trajectories import cache as C
from sift.trajectories.extract import ExtractConfig, Extractor
from sift.trajectories.predict import ShardWriter, extract_corpus
from sift.trajectories.toy import save_toy_models, toy_tokenizer, write_toy_corpus

CFG = dict(shard_size=8, batch_size=8, t_max=16)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("extract")
    corpus = write_toy_corpus(root / "corpus", n_items=4)
    models = save_toy_models(root / "models")
    out = root / "traj"
    manifest = extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    return root, corpus, models, out, manifest


def _shards(out):
    return sorted(Path(out).glob("shards/*/*.safetensors"))


def test_manifest_and_shards_match_direct_extraction(setup):
    root, corpus, models, out, man = setup
    records = list(C.iter_records(corpus / "traces.jsonl"))
    assert set(man["models"]) == {"gpt2", "llama"}
    assert man["corpus"]["traces"] == len(records)
    assert sum(len(i["shards"]) for i in man["models"].values()) == len(_shards(out)) == man["shards"]["total"]
    got = {}
    for _m, info in man["models"].items():
        for s in info["shards"]:
            t, meta = C.read_shard(out / s, {k: info[k] for k in ("num_layers", "hidden_size", "vocab_size")})
            assert meta["key"] == info["key"] and meta["channels"] == info["channels"]
            for i, tid in enumerate(meta["trace_ids"]):
                a, b = t["bin_offsets"][i], t["bin_offsets"][i + 1]
                got[tid] = (t["desc"][a:b], t["pooled"][i], t["profile"][i])
    assert set(got) == {r["trace_id"] for r in records}
    from sift.lm.loading import load_causal_lm

    model, tok = load_causal_lm(models["llama"])
    mine = [r for r in records if r["family"] == "llama"][:5]
    direct = Extractor(model, ExtractConfig(**CFG), tokenizer=tok).extract_many(mine)
    off = torch.cat([torch.zeros(1, dtype=torch.long), direct["n_bins"].cumsum(0)])
    for i, r in enumerate(mine):
        desc, pooled, prof = got[r["trace_id"]]
        assert torch.allclose(desc, direct["desc"][off[i]:off[i + 1]], atol=1e-5)
        assert torch.allclose(pooled, direct["pooled"][i], atol=1e-5)
        assert torch.allclose(prof, direct["profile"][i], atol=1e-5)


def test_rerun_recomputes_nothing(setup):
    root, corpus, models, out, man = setup
    stamps = {p: p.stat().st_mtime_ns for p in _shards(out)}
    again = extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    assert extract_corpus.last_run["computed"] == [] and again["shards"]["computed_by_rank0"] == 0
    assert {p: p.stat().st_mtime_ns for p in _shards(out)} == stamps
    assert again["models"]["gpt2"]["key"] == man["models"]["gpt2"]["key"]


def test_killed_extraction_resumes_without_recomputing_finished_shards(setup, monkeypatch):
    root, corpus, models, _, man = setup
    out = root / "killed"
    real = ShardWriter.write_on_batch_end
    state = {"n": 0}

    def dying(self, *a, **k):
        if state["n"] == 3:
            raise RuntimeError("simulated kill")
        real(self, *a, **k)
        state["n"] += 1

    monkeypatch.setattr(ShardWriter, "write_on_batch_end", dying)
    with pytest.raises(RuntimeError, match="simulated kill"):
        extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    done = _shards(out)
    assert len(done) == 3 and not (out / C.MANIFEST).exists()
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in done}
    monkeypatch.setattr(ShardWriter, "write_on_batch_end", real)
    m = extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    computed = {str(C.shard_path(out, f, k, m["models"][f]["key"])) for f, k in extract_corpus.last_run["computed"]}
    assert not computed & {str(p) for p in done}
    assert len(computed) == man["shards"]["total"] - 3
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in done} == stamps
    assert not list(out.rglob("*.tmp"))


def test_truncated_shard_is_named_and_recomputed(setup, tmp_path):
    root, corpus, models, out, man = setup
    work = tmp_path / "traj"
    shutil.copytree(out, work)
    victim = _shards(work)[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(SiftError, match=f"{victim}: truncated or corrupt shard"):
        C.read_shard(victim)
    extract_corpus(corpus, work, models, ExtractConfig(**CFG))
    assert len(extract_corpus.last_run["computed"]) == 1
    C.read_shard(victim)


def test_nan_in_shard_is_named(setup, tmp_path):
    _, _, _, out, _ = setup
    t, meta = C.read_shard(_shards(out)[0])
    t["desc"][0, 0] = float("nan")
    res = {**t, "n_bins": t["bin_offsets"].diff()}
    bad = tmp_path / "bad.safetensors"
    C.write_shard(bad, res, meta)
    with pytest.raises(SiftError, match=re.escape(f"{bad}: non-finite values (NaN/inf) in tensor 'desc'")):
        C.read_shard(bad)


def test_model_that_does_not_match_the_cache_or_corpus(setup, tmp_path):
    root, corpus, models, out, _ = setup
    wide = save_toy_models(tmp_path / "wide", families=("gpt2",), width=48)
    with pytest.raises(SiftError, match=r"trajectories.json: cache records hidden_size=32 .* has 48"):
        extract_corpus(corpus, out, {**models, **wide}, ExtractConfig(**CFG))
    tok = toy_tokenizer()
    from sift.organism.models import build_model

    small = build_model("gpt2", 20, tok.pad_token_id, 1, 2, width=32, layers=2, heads=2).eval()
    with pytest.raises(SiftError,
                       match=r"traces.jsonl: traces of 'gpt2' use token id \d+ but model .* vocabulary of 20"):
        extract_corpus(corpus, tmp_path / "o", models, ExtractConfig(**CFG), families=["gpt2"],
                       loaded={"gpt2": (small, None)})
    with pytest.raises(SiftError, match="models` has no entry"):
        extract_corpus(corpus, tmp_path / "o", {"gpt2": models["gpt2"]}, ExtractConfig(**CFG))


def test_cli_config_composes_and_runs(setup, tmp_path):
    from hydra import compose, initialize_config_dir

    from sift.config import register_schemas
    from sift.resources import config_dir
    from sift.trajectories.job import run_extract

    register_schemas()  # what the CLI entry points do first (the test may run before any of them was imported)
    root, corpus, models, out, man = setup
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("extract", overrides=[f"corpus_dir={corpus}", f"output_dir={out}", "progress=false",
                                            f"models.gpt2={models['gpt2']}", f"models.llama={models['llama']}",
                                            "extraction.shard_size=8", "extraction.batch_size=8",
                                            "extraction.t_max=16"])
    m = run_extract(cfg)
    assert m["models"]["llama"]["key"] == man["models"]["llama"]["key"]  # same config ⇒ same cache
    assert m["shards"]["computed_by_rank0"] == 0


def test_weights_in_another_dtype_are_another_cache_entry(setup, tmp_path):
    """bfloat16 weights give other states than float32 ones: a cache made in one is never reused for the other."""
    root, corpus, models, out, man = setup
    work = tmp_path / "traj"
    shutil.copytree(out, work)
    bf16 = extract_corpus(corpus, work, models, ExtractConfig(**CFG), dtype="bfloat16")
    assert len(extract_corpus.last_run["computed"]) == len(_shards(out))  # nothing reused
    assert all(bf16["models"][m]["key"] != man["models"][m]["key"] for m in man["models"])
    extract_corpus(corpus, work, models, ExtractConfig(**CFG), dtype="float32")
    assert extract_corpus.last_run["computed"] == []  # the float32 shards are still there, still valid


def test_group_cuts_never_split_a_twin_group():
    from sift.trajectories.cache import group_cuts

    assert group_cuts(["a", "a", "b", "b", "c"], 3) == [(0, 4), (4, 5)]  # the cut waits for the group change
    assert group_cuts(["a", "b", "c", "d"], 2) == [(0, 2), (2, 4)]
    assert group_cuts(["a", "a", "a"], 1) == [(0, 3)]
    assert group_cuts([], 4) == []
    g = [str(i // 2) for i in range(23)]  # pairs
    cuts = group_cuts(g, 5)
    assert cuts[0][0] == 0 and cuts[-1][1] == 23 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert all(g[s - 1] != g[s] for s, _ in cuts[1:])


def test_memory_is_released_after_models_loaded_here_only(setup, tmp_path, monkeypatch):
    """A model extract_corpus loads is freed (a full garbage collection) before the next one loads; a model the
    caller passes in stays the caller's, and nothing is collected for it (0.25 s on a loaded heap)."""
    from sift.lm.loading import load_causal_lm
    from sift.trajectories import predict

    root, corpus, models, out, man = setup
    calls = []
    monkeypatch.setattr(predict, "release_memory", lambda: calls.append(1))
    extract_corpus(corpus, tmp_path / "a", models, ExtractConfig(**CFG))
    assert len(calls) == 2  # gpt2, then llama
    calls.clear()
    given = {m: load_causal_lm(models[m]) for m in ("gpt2", "llama")}
    extract_corpus(corpus, tmp_path / "b", models, ExtractConfig(**CFG), loaded={"gpt2": given["gpt2"]})
    assert len(calls) == 1  # llama only
    for s in _shards(tmp_path / "b"):  # the same shards either way
        assert s.read_bytes() == (tmp_path / "a" / s.relative_to(tmp_path / "b")).read_bytes()


def test_a_shard_is_written_as_the_same_bytes_every_time(tmp_path):
    """safetensors orders ``__metadata__`` differently on every save; shards are written with one fixed header order
    (sorted metadata, tensors in data order), so the same extraction gives cmp-identical files, and they load."""
    from safetensors.torch import load_file

    result = {"desc": torch.randn(5, 3), "final": torch.randn(5, 4).half(), "n_bins": torch.tensor([2, 3]),
              "n_answer": torch.tensor([1, 0]), "n_tokens": torch.tensor([4, 3]), "pooled": torch.randn(2, 4),
              "scalars": torch.randn(2, 3), "answer_logp": torch.tensor([-1.0, float("nan")]),
              "profile": torch.randn(2, 9)}
    meta = {"model": "m", "shard": 0, "trace_ids": ["a", "b"], "key": "k", "channels": ["x", "y", "z"],
            "profile_names": [f"p{i}" for i in range(9)], "num_layers": 2, "hidden_size": 4, "vocab_size": 10}
    blobs = set()
    for i in range(6):
        C.write_shard(tmp_path / f"s{i}.safetensors", result, meta)
        blobs.add((tmp_path / f"s{i}.safetensors").read_bytes())
    assert len(blobs) == 1
    blob = blobs.pop()
    assert C.canonical_safetensors(blob) == blob
    got = load_file(tmp_path / "s0.safetensors")
    assert torch.equal(got["desc"], result["desc"]) and torch.equal(got["final"], result["final"])
    t, md = C.read_shard(tmp_path / "s0.safetensors", {"num_layers": 2, "hidden_size": 4, "vocab_size": 10})
    assert md["trace_ids"] == ["a", "b"] and torch.equal(t["bin_offsets"], torch.tensor([0, 2, 5]))


def test_a_non_finite_shard_is_never_written_and_written_shards_are_not_read_again(setup, tmp_path, monkeypatch):
    """extract_corpus checks each shard's tensors in memory before writing it, so a shard with NaN is refused with its
    path and tensor and never reaches the disk; the shards it wrote are then checked by header only (a full read is
    kept for shards found on disk)."""

    root, corpus, models, out, man = setup
    real = Extractor.extract_many

    def poisoned(self, records):
        got = real(self, records)
        got["pooled"][0, 0] = float("nan")
        return got

    monkeypatch.setattr(Extractor, "extract_many", poisoned)
    with pytest.raises(SiftError, match=r"non-finite values \(NaN/inf\) in tensor 'pooled' of gpt2's shard 0"):
        extract_corpus(corpus, tmp_path / "bad", models, ExtractConfig(**CFG))
    assert not _shards(tmp_path / "bad")
    monkeypatch.setattr(Extractor, "extract_many", real)
    reads = []
    real_read = C.read_shard
    monkeypatch.setattr(C, "read_shard", lambda *a, **k: reads.append(a[0]) or real_read(*a, **k))
    extract_corpus(corpus, tmp_path / "good", models, ExtractConfig(**CFG))
    assert reads == []  # every shard was written here: header checks only
    extract_corpus(corpus, tmp_path / "good", models, ExtractConfig(**CFG))
    assert len(reads) >= len(_shards(tmp_path / "good"))  # a rerun finds them on disk: each is read in full


def test_compare_trajectories_script_tells_identical_reordered_and_changed_shards(setup, tmp_path, capsys):
    """scripts/compare_trajectories.py: a copy is identical; a shard whose header lists its metadata in another order
    is identical up to header order; a changed value is named by its tensor and fails the comparison."""
    import importlib.util
    import json
    import struct

    spec = importlib.util.spec_from_file_location("compare_trajectories",
                                                  Path(__file__).parents[2] / "scripts" / "compare_trajectories.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _, _, _, out, _ = setup
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert mod.main([str(out), str(copy)]) == 0
    first = _shards(copy)[0]
    blob = first.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(reversed(list(header["__metadata__"].items())))
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    first.write_bytes(struct.pack("<Q", len(head)) + head + blob[8 + n:])
    assert first.read_bytes() != blob
    assert mod.main([str(out), str(copy)]) == 0
    assert "1 identical up to header order" in capsys.readouterr().out
    t, meta = C.read_shard(first)
    t["desc"][0, 0] += 1.0
    C.write_shard(first, {**t, "n_bins": t["bin_offsets"].diff()}, meta)
    assert mod.main([str(out), str(copy)]) == 1
    assert "differs in desc" in capsys.readouterr().out
