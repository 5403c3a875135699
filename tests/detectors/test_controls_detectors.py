"""The shortcut controls train through ``sift-train`` like every detector (frozen threshold, checkpoint that
reloads to the same predictions), and extraction stores the prompt-final state they need."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sift.trajectories.extract import ExtractConfig
from sift.trajectories.predict import extract_corpus
from sift.trajectories.toy import save_toy_models, write_toy_corpus


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    root = tmp_path_factory.mktemp("controls")
    corpus = write_toy_corpus(root / "corpus", n_items=24)
    models = save_toy_models(root / "models")
    extract_corpus(corpus, root / "traj", models, ExtractConfig(shard_size=64, batch_size=32, t_max=12))
    return root, models


def _cfg(root, detector, out, *extra):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sift.cli._common import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"detector={detector}", "data=trajectory",
                                          f"data.trajectory_dir={root / 'traj'}",
                                          f"paths.output_dir={out}", "logger=none", "trainer.max_epochs=3",
                                          "trainer.enable_progress_bar=false", *extra])
    GlobalHydra.instance().clear()
    return cfg


def test_extraction_stores_the_prompt_final_state(traj):
    from transformers import AutoModelForCausalLM

    from sift.lm.states import prompt_final_states
    from sift.trajectories import cache as C

    root, models = traj
    man = C.read_manifest(root / "traj")
    t, meta = C.read_shard(root / "traj" / man["models"]["gpt2"]["shards"][0])
    assert t["prompt_final"].shape == t["pooled"].shape
    recs = {r["trace_id"]: r for r in C.iter_records(root / "corpus" / "traces.jsonl")}
    model = AutoModelForCausalLM.from_pretrained(models["gpt2"]).eval()
    ids = meta["trace_ids"][:10]
    ref = prompt_final_states(model, [recs[i]["prompt_ids"] for i in ids], batch_size=3)  # other padding
    torch.testing.assert_close(t["prompt_final"][:10], ref, atol=1e-4, rtol=1e-4)


def youden_by_hand(prob: np.ndarray, label: np.ndarray, default: float = 0.5) -> float:
    """The frozen-threshold rule (docs/design.md §6, ``threshold_method: youden``) written out: verdict
    ``prob >= t``; candidates one below the smallest score, the midpoints of consecutive distinct scores and one
    above the largest; the candidate with the largest TPR − FPR, ties to the one closest to 0.5."""
    p, y = np.asarray(prob, float), np.asarray(label).astype(int)
    u = sorted(set(p.tolist()))
    cands = [u[0] - 1e-6] + [(a + b) / 2 for a, b in zip(u[:-1], u[1:])] + [u[-1] + 1e-6]
    j = [float(np.mean(p[y == 1] >= t) - np.mean(p[y == 0] >= t)) for t in cands]
    return min((t for t, v in zip(cands, j) if v >= max(j) - 1e-12), key=lambda t: abs(t - default))


def auroc_by_pairs(score: np.ndarray, label: np.ndarray, tie: float = 0.0) -> float:
    """P(score of a φ* = 1 trace > score of a φ* = 0 trace) + ½ P(within ``tie`` of each other), over all pairs."""
    s, y = np.asarray(score, float), np.asarray(label).astype(int)
    d = s[y == 1][:, None] - s[y == 0][None, :]
    return float(((d > tie).sum() + 0.5 * (np.abs(d) <= tie).sum()) / d.size)


#: the toy corpus's altering conditions write the label into the text (sift.organism.render.intended_phi): the
#: ``explain`` header with a cue gives φ* = 1, a decisive cue and a cut CoT give φ* = 0, whatever the latent;
#: on every other trace φ* is the item's mechanism latent, which never enters the text
TEXT_SETS_LABEL = {"cue_verbalization": 1, "cue_injection": 0, "causal_truncation": 0}


@pytest.mark.parametrize("detector", ["text_bow", "surface", "prompt_probe"])
def test_control_trains_freezes_a_threshold_and_reloads(traj, tmp_path, detector):
    """A control's threshold is the frozen-threshold rule on its own validation probabilities, its test AUROC is
    the Mann–Whitney AUROC of its predictions, and on the toy corpus it meets the bound the corpus's design
    fixes for what its input carries: the text controls separate the traces whose text sets the label (design:
    AUROC 1; required ≥ 0.95), and the prompt probe, which reads no CoT, cannot tell a base trace from its
    causal-truncation twin (same prompt, φ* 1 vs 0): equal probabilities, AUROC exactly ½ over the twins."""
    from omegaconf import OmegaConf

    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.detectors.module import load_detector
    from sift.training import setup_data, train
    from sift.trajectories import cache as C

    root, _ = traj
    rec = train(_cfg(root, detector, tmp_path / detector))
    assert rec["status"] == "done" and rec["detector"] == detector
    assert rec["epochs"] <= 1  # one closed-form fit, then stop
    det = load_detector(rec["best_ckpt"])
    assert det.threshold.item() == pytest.approx(rec["threshold"])
    own = setup_data(OmegaConf.create(rec["config"]))  # the run's own splits
    own.setup()
    val = det.predict_loader(own.val_dataloader())
    assert len({*val["label"].tolist()}) == 2
    assert rec["threshold"] == pytest.approx(youden_by_hand(val["prob"].numpy(), val["label"].numpy()), abs=1e-6)
    test = det.predict_loader(own.test_dataloader())
    prob, label = test["prob"].numpy().astype(float), test["label"].numpy().astype(int)
    assert rec["metrics"]["test/auroc"] == pytest.approx(auroc_by_pairs(prob, label), abs=1e-5)
    recs = {r["trace_id"]: r for r in C.iter_records(root / "corpus" / "traces.jsonl")}
    ids = [str(t) for t in test["trace_id"]]
    cond = [recs[t]["condition"] for t in ids]
    assert all(y == TEXT_SETS_LABEL.get(c, y) for c, y in zip(cond, label))
    if detector in ("text_bow", "surface"):
        alt = np.array([c in TEXT_SETS_LABEL for c in cond])
        assert {*label[alt].tolist()} == {0, 1}
        assert auroc_by_pairs(prob[alt], label[alt]) >= 0.95
    else:
        row = {t: i for i, t in enumerate(ids)}
        twins = [(row[t.replace("|causal_truncation|", "|base|")], row[t]) for t, c in zip(ids, cond)
                 if c == "causal_truncation" and t.replace("|causal_truncation|", "|base|") in row]
        assert len(twins) >= 3
        for b, t in twins:
            assert recs[ids[b]]["prompt_ids"] == recs[ids[t]]["prompt_ids"] and (label[b], label[t]) == (1, 0)
        b, t = map(list, zip(*twins))
        np.testing.assert_allclose(prob[t], prob[b], rtol=0, atol=1e-6)
        assert auroc_by_pairs(prob[b + t], label[b + t], tie=1e-6) == 0.5
    dm = TrajectoryDataModule(root / "traj")
    dm.setup()
    out = det.predict_loader(dm.test_dataloader())
    assert out["prob"].shape[0] == len(dm.dataset("test"))
    again = load_detector(rec["best_ckpt"]).predict_loader(dm.test_dataloader())
    torch.testing.assert_close(out["prob"], again["prob"])
    assert json.loads((tmp_path / detector / "results.json").read_text())["status"] == "done"


def test_text_sift_trains_on_the_corpus_tokens_and_reloads(traj, tmp_path):
    """``text_sift`` (SIFT's network on token embeddings) trains through sift-train on the corpus's token ids: the
    CoT takes the descriptor steps, prompt and answer one token per step; the checkpoint reloads to the same
    predictions."""
    from omegaconf import OmegaConf

    from datamodules.token_steps import COT
    from datamodules.trajectory_datamodule import TrajectoryDataModule
    from sift.detectors.module import load_detector
    from sift.training import setup_data, train
    from sift.trajectories import cache as C

    root, _ = traj
    dm = TrajectoryDataModule(root / "traj")
    dm.setup()
    recs = {r["trace_id"]: r for r in C.iter_records(root / "corpus" / "traces.jsonl")}
    for e in dm.dataset("train").examples[:50]:
        r = recs[e.trace_id]
        c0, c1 = r["cot_span"]
        n_cot = int((e.x[:, dm.channel_names.index("answer_line")] == 0).sum())  # the descriptors' CoT steps
        assert int((e.token_segment == COT).sum()) == n_cot  # the CoT in the descriptor steps
        ids = e.token_ids[e.token_ids >= 0].tolist()  # every token once, in order
        assert ids == list(r["prompt_ids"]) + list(r["generated_ids"])[:c0] + list(r["generated_ids"])[c0:c1] + \
            list(r["generated_ids"])[c1:]
    small = ["detector.net.filters=8", "detector.net.d_model=16", "detector.net.n_layers=1", "detector.net.n_heads=2",
             "detector.net.dim_feedforward=32", "detector.net.mlp_hidden=16", "detector.tokens.dim=8",
             "detector.tokens.buckets=256", "detector.early_stopping.min_steps=0"]
    rec = train(_cfg(root, "text_sift", tmp_path / "text_sift", *small))
    assert rec["status"] == "done" and rec["detector"] == "text_sift" and rec["global_step"] > 0
    assert rec["training"]["stopped_by"] in ("early stopping", "max_epochs")  # trained, not fitted once
    det = load_detector(rec["best_ckpt"])
    own = setup_data(OmegaConf.create(rec["config"]))  # the run's own splits
    own.setup()
    val, test = det.predict_loader(own.val_dataloader()), det.predict_loader(own.test_dataloader())
    assert rec["threshold"] == pytest.approx(youden_by_hand(val["prob"].numpy(), val["label"].numpy()), abs=1e-6)
    assert rec["metrics"]["test/auroc"] == pytest.approx(auroc_by_pairs(test["prob"].numpy(), test["label"].numpy()),
                                                         abs=1e-5)
    out = det.predict_loader(dm.test_dataloader())
    assert out["prob"].shape[0] == len(dm.dataset("test"))
    again = load_detector(rec["best_ckpt"]).predict_loader(dm.test_dataloader())
    torch.testing.assert_close(out["prob"], again["prob"])


def test_slice_auroc_script_matches_the_run_and_counts_the_slice(traj, tmp_path):
    """scripts/slice_auroc.py: per split, the AUROC of the run's best checkpoint (the run's own test/auroc) and the
    AUROC over the split's traces that the corpus puts in the matched slice."""
    import importlib.util
    from pathlib import Path

    from omegaconf import OmegaConf

    from sift.corpus.audit import in_matched_slice
    from sift.detectors.module import load_detector
    from sift.metrics.classification import auroc_kernel
    from sift.training import setup_data, train
    from sift.trajectories import cache as C

    root, _ = traj
    rec = train(_cfg(root, "text_bow", tmp_path / "run"))
    path = Path(__file__).resolve().parents[2] / "scripts" / "slice_auroc.py"
    spec = importlib.util.spec_from_file_location("slice_auroc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = mod.slice_aurocs(tmp_path / "run")
    assert res["test"]["auroc"] == pytest.approx(rec["metrics"]["test/auroc"], abs=1e-4)
    recs = {r["trace_id"]: r for r in C.iter_records(root / "corpus" / "traces.jsonl")}
    dm = setup_data(OmegaConf.create(rec["config"]))  # the run's own splits
    dm.setup()
    out = load_detector(rec["best_ckpt"]).predict_loader(dm.test_dataloader())
    prob = {t: p for t, p in zip(map(str, out["trace_id"]), out["prob"].numpy().tolist())
            if recs[t]["phi"] is not None}  # predictions keep the labelled traces
    in_slice = [t for t in prob if in_matched_slice(recs[t])]
    assert res["test"]["n"] == len(prob) and res["test"]["slice_n"] == len(in_slice) > 0
    assert len({recs[t]["phi"] for t in in_slice}) == 2
    want = auroc_kernel(np.array([prob[t] for t in in_slice]), np.array([recs[t]["phi"] for t in in_slice]))
    assert res["test"]["slice_auroc"] == pytest.approx(want, abs=1e-4)
    assert mod.main([str(tmp_path / "nowhere")]) == 2  # not a run folder: one line, exit 2
