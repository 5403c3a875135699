"""Issue 13, bad input: labels, probabilities, ids and φ* are validated where they enter; manifests must agree
with their files; NaN shards are recomputed; input folders are only read; outputs are 0644."""

import json
import os
import re
import stat

import numpy as np
import pytest
import torch

from sift.errors import SiftError
from sift.evaluation.predictions import Predictions
from sift.trajectories import cache as C
from sift.trajectories.extract import ExtractConfig
from sift.trajectories.predict import extract_corpus
from sift.trajectories.toy import save_toy_models, write_toy_corpus

CFG = dict(shard_size=8, batch_size=8, t_max=16)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_inputs")
    corpus = write_toy_corpus(root / "corpus", n_items=4)
    models = save_toy_models(root / "models")
    return root, corpus, models


def _edit_traces(src, dst, edit):
    """Copy a corpus folder, applying ``edit(records)`` to its traces.jsonl (manifest left as it was)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("pairs.jsonl", "manifest.json"):
        (dst / f).write_bytes((src / f).read_bytes())
    rows = [json.loads(line) for line in (src / "traces.jsonl").read_text().splitlines() if line.strip()]
    rows = edit(rows)
    (dst / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def _preds(**kw):
    base = dict(detector="d", seed=0, split="test", threshold=0.5, trace_id=["a", "b", "c"],
                base_item=["i", "i", "j"], domain=["x"] * 3, model=["m"] * 3, condition=["base"] * 3,
                label=[0, 1, 1], prob=[0.1, 0.8, 0.6])
    return Predictions(**{**base, **kw})


# ------------------------------------------------------------------------------------ predictions (6: silent)
def test_predictions_refuse_labels_outside_0_1():
    with pytest.raises(SiftError, match=r"labels must be 0 or 1 .*found 2"):
        _preds(label=[0, 2, 1])


def test_predictions_refuse_probabilities_outside_unit_interval():
    with pytest.raises(SiftError, match=r"probabilities must lie in \[0, 1\], found -0.2..1.5"):
        _preds(prob=[-0.2, 0.5, 1.5])


def test_predictions_refuse_duplicate_trace_ids():
    with pytest.raises(SiftError, match="trace ids must be unique, 'a' appears 2 times"):
        _preds(trace_id=["a", "a", "c"])


def test_saved_predictions_with_label_2_are_refused_on_load(tmp_path):
    p = _preds()
    path = p.save(tmp_path / "p.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["label"] = np.array([0, 2, 1])
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(SiftError, match="labels must be 0 or 1"):
        Predictions.load(tmp_path / "bad.npz")


# ------------------------------------------------------------------------------------ φ* and trace records
@pytest.mark.parametrize("phi, message", [(0.5, "phi must be 1, 0 or null .*got 0.5"),
                                          (2, "phi must be 1, 0 or null .*got 2"),
                                          (-1, "phi must be 1, 0 or null .*got -1"),
                                          ("yes", "phi must be 1, 0 or null .*got 'yes'"),
                                          (None, None)])
def test_phi_is_validated_by_sift_extract(toy, tmp_path, phi, message):
    root, corpus, models = toy

    def edit(rows):
        rows[3]["phi"] = phi
        return rows

    bad = _edit_traces(corpus, tmp_path / "c", edit)
    if message is None:  # null = ambiguous: accepted
        C.index_corpus(bad / "traces.jsonl")
        return
    with pytest.raises(SiftError, match=re.escape(f"{bad / 'traces.jsonl'}:4: ") + message):
        C.index_corpus(bad / "traces.jsonl")


@pytest.mark.parametrize("field", ["trace_id", "base_item", "domain", "condition", "phi"])
def test_trace_record_missing_a_field_is_refused_by_sift_extract(toy, tmp_path, field):
    root, corpus, models = toy

    def edit(rows):
        del rows[1][field]
        return rows

    bad = _edit_traces(corpus, tmp_path / "c", edit)
    with pytest.raises(SiftError, match=re.escape(f"{bad / 'traces.jsonl'}:2: trace record lacks field {field!r}")):
        extract_corpus(bad, tmp_path / "t", models, ExtractConfig(**CFG))
    assert not (tmp_path / "t").exists()


def test_duplicate_trace_id_is_refused_by_sift_extract(toy, tmp_path):
    root, corpus, models = toy

    def edit(rows):
        rows[5]["trace_id"] = rows[2]["trace_id"]
        return rows

    bad = _edit_traces(corpus, tmp_path / "c", edit)
    with pytest.raises(SiftError, match=r"traces.jsonl:6: duplicate trace_id .*first on line 3"):
        C.index_corpus(bad / "traces.jsonl")


def test_manifest_that_disagrees_with_its_traces_is_refused(toy, tmp_path):
    root, corpus, models = toy
    bad = _edit_traces(corpus, tmp_path / "c", lambda rows: rows)
    man = json.loads((bad / "manifest.json").read_text())
    man["traces"] = 999
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(SiftError, match=r"manifest.json: manifest counts 999 traces but .*traces.jsonl holds \d+"):
        extract_corpus(bad, tmp_path / "t", models, ExtractConfig(**CFG))


# ------------------------------------------------------------------------------------ 9: NaN shards
def test_shard_with_nan_is_recomputed_by_a_rerun(toy, tmp_path):
    root, corpus, models = toy
    out = tmp_path / "traj"
    extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    victim = sorted(out.glob("shards/*/*.safetensors"))[0]
    t, meta = C.read_shard(victim)
    t["desc"][0, 0] = float("nan")
    C.write_shard(victim, {**t, "n_bins": t["bin_offsets"].diff()}, meta)
    with pytest.raises(SiftError, match=re.escape(f"{victim}: non-finite values (NaN/inf) in tensor 'desc'")):
        C.read_shard(victim)  # the error names the shard to delete
    extract_corpus(corpus, out, models, ExtractConfig(**CFG))
    assert extract_corpus.last_run["written"] and str(victim) in map(str, extract_corpus.last_run["written"])
    fixed, _ = C.read_shard(victim)
    assert torch.isfinite(fixed["desc"]).all()


# ------------------------------------------------------------------------------------ 10: input folders are read
def test_datamodule_writes_nothing_into_the_trajectory_folder(toy, tmp_path):
    from datamodules.trajectory_datamodule import TrajectoryDataModule

    root, corpus, models = toy
    traj = tmp_path / "traj"
    extract_corpus(corpus, traj, models, ExtractConfig(**CFG))
    before = sorted(str(p) for p in traj.rglob("*"))
    TrajectoryDataModule(traj, seed=1).setup()
    cache = tmp_path / "run" / "cache"
    TrajectoryDataModule(traj, seed=1, cache_dir=cache).setup()
    assert sorted(str(p) for p in traj.rglob("*")) == before
    assert len(list(cache.glob("early_commitment-*.pt"))) == 1


# ------------------------------------------------------------------------------------ 11: file modes
def test_output_files_are_readable_by_others(tmp_path):
    from sift.atomic import write_json

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644
