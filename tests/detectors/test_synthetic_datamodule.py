"""The synthetic DataModule honours the batch contract and has the structure it claims."""

import numpy as np
import pytest
import torch

from datamodules.batch import TraceBatch
from datamodules.features import EARLY_COMMITMENT, FEATURE_PREFIXES, organism_channel_names
from datamodules.synthetic_datamodule import SyntheticDataModule, SyntheticSpec
from sift.detectors import DataSpec
from sift.metrics import auroc


def _dm(**kw):
    dm = SyntheticDataModule(generator={"n_items": 200}, **kw)
    dm.setup()
    return dm


def test_contract_and_splits():
    dm = _dm()
    assert dm.channel_names == organism_channel_names(4) and len(dm.channel_names) == 9
    assert all(n.startswith(FEATURE_PREFIXES) for n in dm.feature_names)
    assert {p for p in FEATURE_PREFIXES if any(n.startswith(p) for n in dm.feature_names)} == set(FEATURE_PREFIXES)
    step = next(iter(dm.train_dataloader()))
    assert isinstance(step, list) and len(step) == 3
    assert [int(b.env.unique()) for b in step] == [0, 1, 2]
    b = step[0]
    assert isinstance(b, TraceBatch) and b.x.shape[-1] == 9 and b.mask.dtype == torch.bool
    assert b.features.shape[-1] == len(dm.feature_names) and b.pooled.shape[-1] == dm.pooled_dim
    items = {s: {e.base_item for e in dm.dataset(s)} for s in ("train", "val", "test")}
    assert not (items["train"] & items["val"]) and not (items["train"] & items["test"])
    assert len(items["train"]) == 120 and len(items["val"]) == 30 and len(items["test"]) == 50
    assert {e.env for e in dm.dataset("transfer")} == {3}
    mixed = next(iter(_dm(train_mode="mixed").train_dataloader()))
    assert isinstance(mixed, TraceBatch) and len(mixed.env.unique()) > 1
    spec = DataSpec.from_datamodule(dm)
    assert (spec.n_envs, spec.n_domains, spec.pooled_dim) == (3, 2, 16)


def test_generator_node_names_unknown_keys():
    with pytest.raises(ValueError, match=r"data.generator: unknown keys \['n_item'\]"):
        SyntheticDataModule(generator={"n_item": 10})
    with pytest.raises(ValueError, match="generator.spurious_agree needs 3 values"):
        SyntheticDataModule(generator={"spurious_agree": [0.9]})
    dm = SyntheticDataModule(generator={"n_items": 20, "spurious_agree": [0.9, 0.8, 0.7]})
    assert dm.spec == SyntheticSpec(n_items=20, spurious_agree=(0.9, 0.8, 0.7))
    assert dm.hparams["generator"]["n_items"] == 20  # the checkpoint's record of the data


def test_pairs_are_verified_by_construction():
    dm = _dm()
    for split in ("val", "test"):
        ds = dm.dataset(split)
        assert dm.pairs(split, kind="preserving")
        for p in dm.pairs(split):
            a, b = ds[p.source], ds[p.shifted]
            assert a.base_item == b.base_item and (a.label, b.label) == (p.phi_source, p.phi_shifted)
            assert (p.kind == "preserving") == (a.label == b.label)
    assert len(dm.pairs("test", kind="altering")) == 50 and not dm.pairs("train")
    pb = next(iter(dm.pair_dataloader("test", kind="altering", batch_size=8)))
    assert len(pb.pairs) == 8 and torch.equal(pb.source.label, 1 - pb.shifted.label)


def test_label_lives_in_the_shape_not_the_level_and_spurious_flips():
    dm = _dm()
    ex = [e for e in dm.dataset("test") if not e.trace_id.endswith("altered")]
    y = np.array([e.label for e in ex])
    ec = dm.channel_names.index(EARLY_COMMITMENT)
    mean_ec = np.array([e.x[:, ec].mean().item() for e in ex])
    late_ec = np.array([(e.x[-e.x.shape[0] // 2:, ec].mean() - e.x[: e.x.shape[0] // 2, ec].mean()).item() for e in ex])
    assert abs(auroc(mean_ec, y) - 0.5) < 0.15  # the per-trace level hardly tells
    assert auroc(late_ec, y) > 0.95  # the shape does
    sp = dm.channel_names.index("drift/l1")
    tr_score = np.array([e.x[:, sp].mean().item() for e in ex])
    sh = dm.dataset("transfer")
    sh_score = np.array([e.x[:, sp].mean().item() for e in sh])
    assert auroc(tr_score, y) > 0.75 and auroc(sh_score, [e.label for e in sh]) < 0.25
