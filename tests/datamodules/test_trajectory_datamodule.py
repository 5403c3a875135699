"""TrajectoryDataModule: grouped splits, environment-balanced training steps, pairs, transfer, features, errors."""

import json
import os
import shutil
import sys
import time

import pytest
import torch

from datamodules.batch import TraceBatch, TraceExample
from datamodules.trajectory_datamodule import TrajectoryDataModule
from sift.errors import SiftError
from sift.trajectories.extract import ExtractConfig
from sift.trajectories.predict import extract_corpus
from sift.trajectories.toy import save_toy_models, write_toy_corpus


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    root = tmp_path_factory.mktemp("dm")
    corpus = write_toy_corpus(root / "corpus", n_items=12)
    models = save_toy_models(root / "models")
    extract_corpus(corpus, root / "traj", models, ExtractConfig(shard_size=64, batch_size=32, t_max=16))
    return root


@pytest.fixture(scope="module")
def dm(traj):
    d = TrajectoryDataModule(traj / "traj", batch_size=4, seed=3)
    d.setup()
    return d


def _items(ds):
    return {e.base_item for e in ds.examples}


def test_splits_are_grouped_by_item_and_deterministic(dm, traj):
    tr, va, te = (_items(dm.dataset(s)) for s in ("train", "val", "test"))
    assert not (tr & va or tr & te or va & te)
    n = len(tr | va | te)
    assert abs(len(tr) - 0.6 * n) <= 1 and abs(len(te) - 0.25 * n) <= 1
    again = TrajectoryDataModule(traj / "traj", seed=3)
    again.setup()
    assert [e.trace_id for e in again.dataset("test").examples] == [e.trace_id for e in dm.dataset("test").examples]
    other = TrajectoryDataModule(traj / "traj", seed=4)
    other.setup()
    assert _items(other.dataset("train")) != tr
    assert dm.summary["ambiguous"] > 0  # φ* = None traces are not examples


def test_training_loader_yields_one_batch_per_environment(dm):
    loader = dm.train_dataloader()
    steps = list(loader)
    n_train, n_env = len(dm.dataset("train")), len(dm.train_env_ids)
    assert len(steps) == len(loader) == -(-n_train // (n_env * 4))
    for step in steps:
        assert isinstance(step, list) and len(step) == n_env
        for env, b in zip(dm.train_env_ids, step):
            assert isinstance(b, TraceBatch) and len(b) == 4
            assert torch.all(b.env == env)
            assert b.x.shape[2] == dm.n_channels and b.mask[:, 0].all()
            assert b.features.shape == (4, len(dm.feature_names)) and b.pooled.shape == (4, dm.pooled_dim)
    second = [[b.trace_id for b in s] for s in loader]  # next epoch (no trainer: counts passes): reshuffled
    assert second != [[b.trace_id for b in s] for s in steps]
    assert [dm.env_names[e] for e in dm.train_env_ids][0] == "base"


def test_training_loader_under_lightning(dm):
    import pytorch_lightning as pl

    seen = []

    class Probe(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(dm.n_channels, 1)

        def training_step(self, batches, i):
            seen.append((self.current_epoch, [b.trace_id[0] for b in batches]))
            return sum(self.w(b.x).mean() for b in batches)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    pl.Trainer(max_epochs=2, limit_train_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, accelerator="cpu").fit(Probe(), datamodule=dm)
    assert [e for e, _ in seen] == [0, 0, 1, 1] and seen[0][1] != seen[2][1]


def test_eval_loaders_are_ordered_and_pairs_index_them(dm, traj):
    for split in ("val", "test"):
        loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
        ids = [t for b in loader for t in b.trace_id]
        ds = dm.dataset(split)
        assert ids == [e.trace_id for e in ds.examples]
        pairs = dm.pairs(split)
        assert pairs and {p.kind for p in pairs} <= {"preserving", "altering"}
        raw = {(p["source"], p["shifted"]): p for p in map(json.loads, (traj / "corpus" / "pairs.jsonl").open())}
        for p in pairs:
            a, b = ds[p.source], ds[p.shifted]
            assert raw[(a.trace_id, b.trace_id)]["verified"] and (a.label, b.label) == (p.phi_source, p.phi_shifted)
        pb = next(dm.pair_dataloader(split, kind="preserving"))
        assert torch.equal(pb.source.label, pb.shifted.label) and len(pb.pairs) == len(pb.source)


def test_channels_features_and_ablation(dm, traj):
    assert dm.channel_names[:8] == ["velocity/l1", "velocity/l2", "drift/l1", "drift/l2", "drift/l3",
                                    "early_commitment", "attention_stability", "answer_line"]
    heads = len({c.split("/")[2] for c in dm.channel_names[8:]})
    assert dm.channel_names[8:] == [f"head_mass/s{j}/h{h}/{src}" for j in (1, 2, 3) for h in range(heads)
                                    for src in ("prompt", "cue", "cot")]
    g = dm.feature_groups
    assert [dm.feature_names[i] for i in g["cue"]][0] == "cue/present"
    assert len(g["counterfactual"]) == 9 and "int/early_commitment" in [dm.feature_names[i] for i in g["internal"]]
    from sift.trajectories.descriptors import bin_starts

    i_ec, i_T = dm.feature_names.index("int/early_commitment"), dm.feature_names.index("beh/cot_tokens")
    kinds = set()
    for ex in dm.dataset("train").examples:
        T, n = int(ex.features[i_T]), int((ex.x[:, 7] == 0).sum())  # the CoT's steps (answer line: flag 1)
        assert torch.all(ex.x[n:, 7] == 1) and ex.x.shape[0] - n == 2  # the toy answer line: two steps, last
        cut = -(-T // 3)
        k = sum(s < cut for s in bin_starts(T, n))  # bins that start in the first ⌈T/3⌉ tokens (k = cut if unbinned)
        assert float(ex.features[i_ec]) == pytest.approx(float(ex.x[:k, 5].max()), abs=1e-6)
        kinds.add(n < T)
    assert kinds == {True, False}  # both binned and unbinned traces were checked
    no_ec = TrajectoryDataModule(traj / "traj", seed=3, drop_channels=["early_commitment", "velocity/", "head_mass/"])
    no_ec.setup()
    assert no_ec.channel_names == ["drift/l1", "drift/l2", "drift/l3", "attention_stability", "answer_line"]
    assert no_ec.dataset("train").examples[0].x.shape[1] == 5


def test_probe_is_fit_on_train_items_only(traj, monkeypatch):
    from sift.trajectories import probe as P

    fitted = []
    real = P.AnswerProbe.fit

    def spy(self, X, y):
        fitted.append(len(y))
        return real(self, X, y)

    monkeypatch.setattr(P.AnswerProbe, "fit", spy)
    d = TrajectoryDataModule(traj / "traj", seed=3, probe_max_samples=10**9)
    d.setup()
    train_items = d.split_items["train"]
    from sift.trajectories import cache as C

    # one probe per source model; each train-item trace contributes all of its (binned) CoT steps, no other trace does

    man = C.read_manifest(traj / "traj")
    steps = {}
    for m, info in man["models"].items():
        n = 0
        for s in info["shards"]:
            t, meta = C.read_shard(traj / "traj" / s)
            for i, tid in enumerate(meta["trace_ids"]):
                tr = d.traces[tid]
                if tr.base_item in train_items and tr.answer is not None:  # the CoT's steps, not the answer line's
                    n += int(t["bin_offsets"][i + 1] - t["bin_offsets"][i] - t["n_answer"][i])
        steps[m] = n
    assert sorted(fitted) == sorted(steps.values())


def test_holdout_domain_and_model(traj):
    d = TrajectoryDataModule(traj / "traj", holdout_domain="boolean")
    d.setup()
    assert {d.domain_names[e.domain] for e in d.dataset("transfer").examples} == {"boolean"}
    for s in ("train", "val", "test"):
        assert "boolean" not in {d.domain_names[e.domain] for e in d.dataset(s).examples}
    m = TrajectoryDataModule(traj / "traj", holdout_model="llama")
    m.setup()
    assert {m.model_names[e.model] for e in m.dataset("transfer").examples} == {"llama"}
    assert {m.model_names[e.model] for e in m.dataset("train").examples} == {"gpt2"}
    assert _items(m.dataset("transfer")) <= m.split_items["test"]
    assert all(p.kind in ("preserving", "altering") for p in m.pairs("transfer"))


def test_clear_errors(traj, tmp_path):
    work = tmp_path / "traj"
    shutil.copytree(traj / "traj", work)
    shard = sorted(work.glob("shards/llama/*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(SiftError, match=f"{shard}: truncated or corrupt shard"):
        TrajectoryDataModule(work).setup()
    corpus = tmp_path / "corpus"
    shutil.copytree(traj / "corpus", corpus)
    with open(corpus / "traces.jsonl", "a") as fh:
        fh.write("\n")
    with pytest.raises(SiftError, match="traces.jsonl: changed since"):
        TrajectoryDataModule(traj / "traj", corpus_dir=corpus).setup()
    with pytest.raises(SiftError, match="holdout_domain 'poetry'"):
        TrajectoryDataModule(traj / "traj", holdout_domain="poetry").setup()


def test_a_training_split_without_labelled_traces_is_refused_by_name(traj, monkeypatch):
    import datamodules.trajectory_datamodule as tdm

    monkeypatch.setattr(tdm, "check_phi", lambda phi, where: None)  # every trace ambiguous
    with pytest.raises(SiftError, match=r"training split has no labelled trace \((\d+) traces: \1 ambiguous"):
        TrajectoryDataModule(traj / "traj").setup()


def test_answer_probe_is_fit_once_per_split_and_cached(traj, monkeypatch, tmp_path):
    from sift.trajectories import probe as P

    cache = tmp_path / "cache"
    first = TrajectoryDataModule(traj / "traj", seed=11, cache_dir=cache)
    first.setup()
    fits = []
    real = P.AnswerProbe.fit
    monkeypatch.setattr(P.AnswerProbe, "fit", lambda self, X, y: fits.append(1) or real(self, X, y))
    again = TrajectoryDataModule(traj / "traj", seed=11, cache_dir=cache)
    again.setup()
    assert fits == []  # same shards, train items and probe settings: the cached curves are reused
    for split in ("train", "val", "test"):  # early commitment is a descriptor channel: identical sequences
        for a, b in zip(first.dataset(split).examples, again.dataset(split).examples):
            assert a.trace_id == b.trace_id
            torch.testing.assert_close(a.x, b.x)
    other = TrajectoryDataModule(traj / "traj", seed=12, cache_dir=cache)  # other split → other train items → a new fit
    other.setup()
    assert len(fits) == 2  # one probe per source model


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork")
def test_parallel_setups_of_one_split_fit_the_answer_probe_once(traj, tmp_path, monkeypatch):
    """Two processes setting up the same uncached split at once: one fits the probes, the other waits for the
    cache (a file lock), and both get the same early-commitment channel."""
    import multiprocessing as mp

    from sift.trajectories import probe as P

    log = tmp_path / "fits.log"
    real = P.AnswerProbe.fit

    def logged(self, X, y):
        time.sleep(0.5)  # keep the first fit in progress while the other process arrives
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(self, X, y)

    monkeypatch.setattr(P.AnswerProbe, "fit", logged)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    cache = tmp_path / "cache"  # the shared cache lives outside the (read-only) trajectory folder
    procs = [ctx.Process(target=_setup_and_report, args=(traj / "traj", 23, out, cache)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:  # a child that hangs must not outlive the test (it would hold the runner's output open)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
    fits = log.read_text().split()
    assert len(fits) == 2 and len(set(fits)) == 1  # one probe per source model, both in one process
    assert got[0] == got[1] and len(got[0]) > 0


def _setup_and_report(path, seed, out, cache_dir=None):
    # a forked child must not enter the parent's OpenMP thread pool (libgomp is not fork-safe: the first parallel
    # torch op in the child waits forever on a team barrier); one intra-op thread keeps torch off it
    torch.set_num_threads(1)
    dm = TrajectoryDataModule(path, seed=seed, cache_dir=cache_dir)
    dm.setup()
    out.put(torch.cat([e.x for e in dm.dataset("train").examples]).tolist())  # plain lists: no shared memory


def test_length_buckets_keep_the_traces_and_cut_padding():
    from datamodules.trajectory_datamodule import EnvStepDataset

    lengths = [3 + (7 * i) % 29 for i in range(120)]
    ex = [TraceExample(x=torch.zeros(n, 2), label=i % 2, env=i % 3, domain=0, model=0, pooled=torch.zeros(1),
                       features=torch.zeros(1), trace_id=str(i)) for i, n in enumerate(lengths)]
    plain = EnvStepDataset(ex, [0, 1, 2], env_batch_size=4, seed=5, length_buckets=1)
    bucketed = EnvStepDataset(ex, [0, 1, 2], env_batch_size=4, seed=5, length_buckets=5)
    assert len(plain) == len(bucketed) == 10

    def group(ds, g):  # traces of a 5-step group, per environment
        return {e: sorted(i for s in range(5 * g, 5 * g + 5) for i in ds.indices(0, s)[e]) for e in (0, 1, 2)}

    assert group(plain, 0) == group(bucketed, 0) and group(plain, 1) == group(bucketed, 1)
    steps = [bucketed.indices(0, s) for s in range(10)]
    assert all(len(idx) == 4 for st in steps for idx in st.values())

    def padded(ds):
        return sum(max(lengths[i] for idx in ds.indices(0, s).values() for i in idx) for s in range(10))

    assert padded(bucketed) < 0.8 * padded(plain)
    assert [bucketed.indices(0, s) for s in range(10)] == steps  # deterministic
    assert [bucketed.indices(1, s) for s in range(10)] != steps  # reshuffled each epoch


def test_calibration_split_is_held_out_of_validation_by_item(traj, dm):
    cal = TrajectoryDataModule(traj / "traj", batch_size=4, seed=3, calib_fraction=0.5)
    cal.setup()
    tr, va, ca, te = (_items(cal.dataset(s)) for s in ("train", "val", "calib", "test"))
    assert ca and va and not (ca & va or ca & tr or ca & te)
    # train and test are the items of calib_fraction=0; validation = selection part + calibration part
    assert tr == _items(dm.dataset("train")) and te == _items(dm.dataset("test"))
    assert va | ca == _items(dm.dataset("val"))
    assert len(ca) == round(0.5 * len(_items(dm.dataset("val"))))
    assert ([e.trace_id for e in cal.calib_dataloader().dataset.examples]
            == [e.trace_id for e in cal.dataset("calib").examples])
    assert len(dm.dataset("calib")) == 0  # calib_fraction=0: no calibration split
    with pytest.raises(SiftError, match="calib_fraction"):
        TrajectoryDataModule(traj / "traj", calib_fraction=1.0)
    # one validation item cannot be split: no calibration split, said in a warning
    one = TrajectoryDataModule(traj / "traj", batch_size=4, seed=3, calib_fraction=0.5, split=(0.85, 0.05, 0.1))
    with pytest.warns(UserWarning, match="no 'calib' split"):
        one.setup()
    assert len(one.dataset("calib")) == 0 and len(one.dataset("val")) > 0


def test_resample_train_is_a_per_seed_bootstrap_of_train_items(traj):
    def resampled(seed):
        d = TrajectoryDataModule(traj / "traj", batch_size=4, seed=3)
        d.setup()
        items = _items(d.dataset("train"))
        n_items = len(items)
        test = [e.trace_id for e in d.dataset("test").examples]
        d.resample_train(seed)
        ex = d.dataset("train").examples
        assert _items(d.dataset("train")) <= items and [e.trace_id for e in d.dataset("test").examples] == test
        # as many item draws as items: every drawn item brings all its traces (items drawn twice appear twice)
        per_item = {}
        for e in ex:
            per_item.setdefault(e.base_item, set()).add(e.trace_id)
        assert all(len([e for e in ex if e.base_item == i]) % len(per_item[i]) == 0 for i in per_item)
        draws = sum(len([e for e in ex if e.base_item == i]) // len(per_item[i]) for i in per_item)
        assert draws == n_items
        return [e.trace_id for e in ex]

    assert resampled(1) == resampled(1) and resampled(1) != resampled(2)


# ---------------------------------------------------------------------------------- models of different shapes
def _raw(traj_dir):
    """trace id → (model, desc [n, C0], pooled [d], prompt_final [d]) straight from the cache shards."""
    from sift.trajectories import cache as C

    out = {}
    for m, info in C.read_manifest(traj_dir)["models"].items():
        for s in info["shards"]:
            t, meta = C.read_shard(traj_dir / s)
            off = t["bin_offsets"].tolist()
            for i, tid in enumerate(meta["trace_ids"]):
                out[tid] = (m, t["desc"][off[i]:off[i + 1]], t["pooled"][i], t["prompt_final"][i])
    return out


def _examples(d):
    return [e for s in ("train", "val", "test", "transfer") for e in d.dataset(s).examples]


@pytest.fixture(scope="module")
def two_shapes(tmp_path_factory):
    """A toy corpus extracted from a 2-layer × 32 GPT-2 and a 3-layer × 48 Llama organism."""
    root = tmp_path_factory.mktemp("dm_shapes")
    corpus = write_toy_corpus(root / "corpus", n_items=8)
    models = {**save_toy_models(root / "models", families=("gpt2",), width=32, layers=2),
              **save_toy_models(root / "models", families=("llama",), seed=1, width=48, layers=3)}
    extract_corpus(corpus, root / "traj", models, ExtractConfig(shard_size=64, batch_size=32, t_max=12))
    return root / "traj"


def test_models_of_different_shapes_share_the_common_shape(two_shapes):
    from sift.trajectories import cache as C
    from sift.trajectories.common_shape import channel_layout, channel_map, projection

    d = TrajectoryDataModule(two_shapes, batch_size=4, seed=3)
    d.setup()
    assert d.common_shape == {"num_layers": 2, "hidden_size": 32, "native": {"gpt2": [2, 32], "llama": [3, 48]},
                              "mapped": ["llama"]}
    assert d.summary["common_shape"] == d.common_shape
    man = C.read_manifest(two_shapes)
    src = {m: channel_layout(i["channels"]) for m, i in man["models"].items()}
    heads = min(x.heads for x in src.values())
    assert d.channel_names[:6] == ["velocity/l1", "drift/l1", "drift/l2", "early_commitment", "attention_stability",
                                   "answer_line"]
    assert d.channel_names[6:] == [f"head_mass/s{j}/h{h}/{c}" for j in (1, 2) for h in range(heads)
                                   for c in ("prompt", "cue", "cot")]  # 2 slots (gpt2's 2 layers) × the fewest heads
    C_ = d.n_channels
    assert C_ == 6 + 2 * heads * 3 and d.pooled_dim == 32
    no_ec = [i for i in range(C_) if i != 3]
    raw, P = _raw(two_shapes), projection("llama", 48, 32)
    seen = set()
    for e in _examples(d):
        m, desc, pooled, prompt = raw[e.trace_id]
        seen.add(m)
        assert e.x.shape[1] == C_ and e.pooled.shape == (32,) and e.prompt_pooled.shape == (32,)
        # gpt2: its own channels, but its heads mapped onto the fewest heads (when llama has fewer); llama: velocity/l2,
        # drift/l2, drift/l3, attention_stability, answer_line, head-mass slots 1 and 3 (layer_map(3, 2)) of the mapped
        # heads; widths through the fixed projection
        mapped = desc[:, channel_map(src[m], channel_layout(["velocity/l1", "drift/l1", "drift/l2",
                                                              *d.channel_names[4:]]))]
        want_desc = desc if (m == "gpt2" and src[m].heads == heads) else mapped
        want_pooled, want_prompt = (pooled, prompt) if m == "gpt2" else (pooled @ P.T, prompt @ P.T)
        assert torch.equal(e.x[:, no_ec], want_desc)
        torch.testing.assert_close(e.pooled, want_pooled, rtol=0, atol=0 if m == "gpt2" else 1e-6)
        torch.testing.assert_close(e.prompt_pooled, want_prompt, rtol=0, atol=0 if m == "gpt2" else 1e-6)
    assert seen == {"gpt2", "llama"}
    b = next(iter(d.test_dataloader()))
    assert b.x.shape[2] == C_ and b.pooled.shape[1] == 32
    held = TrajectoryDataModule(two_shapes, batch_size=4, seed=3, holdout_model="llama")  # cross-model transfer
    held.setup()
    assert {held.model_names[e.model] for e in held.dataset("transfer").examples} == {"llama"}
    assert all(e.x.shape[1] == C_ and e.pooled.shape == (32,) for e in held.dataset("transfer").examples)


def test_one_shape_datamodule_reads_the_cache_unchanged(dm, traj, two_shapes):
    # the organisms of `traj` share one shape (3 layers × 32): every tensor is the cached one
    assert dm.common_shape == {"num_layers": 3, "hidden_size": 32, "native": {"gpt2": [3, 32], "llama": [3, 32]},
                               "mapped": []}
    raw = _raw(traj / "traj")
    for e in _examples(dm):
        _, desc, pooled, prompt = raw[e.trace_id]
        no_ec = [i for i in range(e.x.shape[1]) if i != 5]  # every stored channel, early commitment left out
        assert torch.equal(e.x[:, no_ec], desc) and torch.equal(e.pooled, pooled)
        assert torch.equal(e.prompt_pooled, prompt)
    # one model of a two-shape cache: its own shape, nothing mapped
    wide = TrajectoryDataModule(two_shapes, seed=3, models=["llama"])
    wide.setup()
    heads = len({c.split("/")[2] for c in wide.channel_names if c.startswith("head_mass/")})
    assert (wide.common_shape["mapped"], wide.pooled_dim, wide.n_channels) == ([], 48, 8 + 3 * heads * 3)
    raw = _raw(two_shapes)
    for e in _examples(wide):
        no_ec = [i for i in range(e.x.shape[1]) if i != 5]
        assert torch.equal(e.x[:, no_ec], raw[e.trace_id][1]) and torch.equal(e.pooled, raw[e.trace_id][2])
