"""Issue 43's negative control: under ``mechanism_kind=answer_routing`` the latent enters at the answer line only,
so everything a detector on CoT positions reads is the same for the two twins of a matched-slice pair (the same
ids, one labelled φ*=1 and one φ*=0), and such a detector scores exactly 0.5 there.

One small organism corpus (both families, base + paraphrase) is built under answer_routing and extracted. The
positive contrast, which shows the checks can fail, replays the *same* traces under ``offset`` (the records'
``mechanism_kind`` rewritten; extraction replays the latent from the records): the CoT tensors then differ between
twins, every detector gives the twins different probabilities and the hidden-state probe separates them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from sift.corpus.audit import twin_pairs, twin_text_matches
from sift.corpus.config import OrganismCorpusConfig
from sift.corpus.sources.organism import build_corpus
from sift.organism import DEFAULT_CHECKPOINTS
from sift.trajectories import cache as C
from sift.trajectories.extract import ExtractConfig
from sift.trajectories.predict import extract_corpus

FAMILIES = ["gpt2", "llama"]
#: what the trajectory-state detectors read, all from CoT positions (``prompt_final``: the last prompt token)
COT_TENSORS = ("desc", "final", "pooled", "prompt_final", "scalars")
#: answer-time quantities: the latent reaches them under answer_routing, so they may differ between twins
ANSWER_TIME = ("answer_logp", "profile")
#: a tiny SIFT network (as tests/faults/test_faults_checkpoints.py)
SMALL_SIFT = ["detector.net.d_model=32", "detector.net.filters=16", "detector.net.n_layers=1",
              "detector.net.n_heads=4", "detector.net.dim_feedforward=64", "detector.net.mlp_hidden=32",
              "detector.objective.dann_hidden=32"]
#: the detectors on CoT positions only: the probe on pooled final-layer states, SIFT on the per-step descriptors
#: (+ early commitment, from the final-layer states), sift_raw on the per-step final-layer states; the SIFTs tiny and
#: trained for 3 steps (the check is that twins get one probability, which needs no training)
COT_ONLY = "data.answer_line=false"  # the documented switch: the trajectories' CoT steps only
COT_DETECTORS = [("hidden_probe", (COT_ONLY,)),
                 ("sift", (*SMALL_SIFT, "trainer.max_epochs=3", COT_ONLY)),
                 ("sift_raw", (*SMALL_SIFT, "detector.projection.dim=16", "trainer.max_epochs=3", COT_ONLY))]


#: small micro-batches and shards (a family has 16 items × 2 conditions × 2 latents = 64 traces): extraction keeps
#: twins in one shard and one micro-batch (sift.trajectories.cache.group_cuts), so they share their padding and the
#: comparison is of the organism's states. (Twins split across micro-batches or shards got other padding: their CoT
#: tensors agreed only to float rounding, ~1e-6.)
BATCH, SHARD = 5, 11


def _extract(corpus: Path, out: Path) -> None:
    models = {f: str(DEFAULT_CHECKPOINTS / f) for f in FAMILIES}
    extract_corpus(corpus, out, models, ExtractConfig(t_max=32, batch_size=BATCH, shard_size=SHARD))


@pytest.fixture(scope="module")
def organism(tmp_path_factory):
    """(root, traces, slice pairs): an answer_routing corpus under ``root/corpus``, its trajectories under
    ``root/traj``; the same traces replayed under offset in ``root/offset_corpus`` / ``root/offset_traj``."""
    root = tmp_path_factory.mktemp("answer_routing")
    cfg = OrganismCorpusConfig(n_items=16, conditions=["base", "paraphrase"], families=FAMILIES,
                               mechanism_kind="answer_routing", audit_seeds=1, chunk_items=16)
    manifest = build_corpus(cfg, root / "corpus", progress=False)
    assert manifest["mechanism_kind"] == "answer_routing"
    _extract(root / "corpus", root / "traj")
    traces = [json.loads(line) for line in (root / "corpus" / "traces.jsonl").read_text().splitlines()]
    assert {t["mechanism_kind"] for t in traces} == {"answer_routing"}
    # the positive contrast: the same ids, twins and labels, the latent replayed from the first CoT position on
    off = root / "offset_corpus"
    off.mkdir()
    for name in ("pairs.jsonl", "manifest.json"):
        shutil.copy(root / "corpus" / name, off / name)
    (off / "traces.jsonl").write_text("".join(json.dumps({**t, "mechanism_kind": "offset"}) + "\n" for t in traces))
    _extract(off, root / "offset_traj")
    in_slice = twin_text_matches(traces)
    pairs = [(a, b) for a, b in twin_pairs(traces) if in_slice[a["trace_id"]]]
    return root, traces, pairs


def _rows(traj: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Trace id → every stored tensor of that trace (ragged ``desc`` / ``final`` cut at ``bin_offsets``)."""
    man = C.read_manifest(traj)
    out = {}
    for info in man["models"].values():
        for s in info["shards"]:
            t, meta = C.read_shard(traj / s)
            assert all(k in t for k in COT_TENSORS + ANSWER_TIME)
            off = t["bin_offsets"].tolist()
            for i, tid in enumerate(meta["trace_ids"]):
                end = off[i + 1] - int(t["n_answer"][i])  # the CoT's steps; the answer line's are the last rows
                out[tid] = {"desc": t["desc"][off[i]:end], "final": t["final"][off[i]:end],
                            "answer_desc": t["desc"][end:off[i + 1]], "answer_final": t["final"][end:off[i + 1]],
                            **{k: t[k][i] for k in ("n_tokens", "n_answer", "pooled", "prompt_final", "scalars",
                                                    *ANSWER_TIME)}}
    return out


def test_the_slice_is_twins_with_one_text_and_opposite_labels(organism):
    _, traces, pairs = organism
    assert len(traces) == 16 * 2 * 2 * len(FAMILIES)  # items × conditions × latents × families
    assert len(pairs) >= 0.9 * len(traces) / 2
    for a, b in pairs:
        assert a["twin"] == b["twin"] and (a["latent"]["mechanism"], b["latent"]["mechanism"]) == (1, 0)
        assert a["prompt_ids"] == b["prompt_ids"] and a["generated_ids"] == b["generated_ids"]
    opposite = [(a, b) for a, b in pairs if a["phi"] != b["phi"]]
    assert len(opposite) >= 0.9 * len(pairs)


def test_cot_tensors_are_bit_identical_between_twins_under_answer_routing(organism):
    """Every CoT-position tensor of a matched-slice twin pair is the same bits, while their labels are opposite;
    the answer-time quantities are where the latent shows (and must: the organism's behaviour needs it)."""
    root, _, pairs = organism
    rows = _rows(root / "traj")
    for a, b in pairs:
        ra, rb = rows[a["trace_id"]], rows[b["trace_id"]]
        for k in COT_TENSORS + ("n_tokens", "n_answer"):
            assert torch.equal(ra[k], rb[k]), (a["trace_id"], k)
        assert int(ra["n_answer"]) == 2  # the organism's answer line: ``answer :``
    assert sum(a["phi"] != b["phi"] for a, b in pairs) >= 0.9 * len(pairs)
    for k in ("profile", "answer_desc", "answer_final"):  # the answer line's steps carry the routing
        moved = [not torch.equal(rows[a["trace_id"]][k], rows[b["trace_id"]][k]) for a, b in pairs]
        assert np.mean(moved) >= 0.9, k


def test_the_same_traces_under_offset_differ_between_twins(organism):
    """The contrast that makes the check above able to fail: the latent replayed from the first CoT position on
    (the same ids) changes every CoT state of the twins; the prompt's last state stays the same in both kinds."""
    root, _, pairs = organism
    rows = _rows(root / "offset_traj")
    for k in ("desc", "final", "pooled", "scalars"):
        differ = [not torch.equal(rows[a["trace_id"]][k], rows[b["trace_id"]][k]) for a, b in pairs]
        assert np.mean(differ) >= 0.9, k
    for a, b in pairs:
        assert torch.equal(rows[a["trace_id"]]["prompt_final"], rows[b["trace_id"]]["prompt_final"])


def _train_and_score(traj: Path, out: Path, detector: str, *extra: str) -> dict[str, tuple[float, int]]:
    """Train ``detector`` through sift.training.train on ``traj``; trace id → (probability, label) of every trace
    of every split, predicted by the best checkpoint."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from sift.cli._common import CONFIG_DIR
    from sift.detectors.module import load_detector
    from sift.training import setup_data, train

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"detector={detector}", "data=trajectory", f"data.trajectory_dir={traj}",
                                          f"paths.output_dir={out}", "logger=none",
                                          "trainer.enable_progress_bar=false", *extra])
    GlobalHydra.instance().clear()
    rec = train(cfg)
    assert rec["status"] == "done"
    det = load_detector(rec["best_ckpt"])
    dm = setup_data(OmegaConf.create(rec["config"]))
    dm.setup()
    got: dict[str, tuple[float, int]] = {}
    for loader in (dm.train_flat_dataloader(shuffle=False), dm.val_dataloader(), dm.calib_dataloader(),
                   dm.test_dataloader()):
        p = det.predict_loader(loader)
        if not p:
            continue
        got.update({str(t): (float(pr), int(y)) for t, pr, y in zip(p["trace_id"], p["prob"].tolist(),
                                                                    p["label"].tolist())})
    return got


def _slice_auroc(pairs, got) -> float:
    """roc_auc_score over the traces of the slice's opposite-label twin pairs (where 0.5 is a theorem for any
    score that gives both twins one value)."""
    ids = [t["trace_id"] for a, b in pairs if a["phi"] != b["phi"] for t in (a, b)]
    return float(roc_auc_score([got[t][1] for t in ids], [got[t][0] for t in ids]))


@pytest.mark.parametrize("detector,extra", COT_DETECTORS)
def test_cot_position_detectors_score_one_half_on_the_slice(organism, tmp_path, detector, extra):
    """A detector on CoT positions only, trained through sift-train on the answer_routing trajectories, gives both
    twins of every slice pair the same probability: slice AUROC exactly 0.5."""
    root, _, pairs = organism
    got = _train_and_score(root / "traj", tmp_path / detector, detector, *extra)
    assert all(a["trace_id"] in got and b["trace_id"] in got for a, b in pairs)
    for a, b in pairs:
        assert got[a["trace_id"]][0] == got[b["trace_id"]][0], (detector, a["trace_id"])
        assert (got[a["trace_id"]][1], got[b["trace_id"]][1]) == (a["phi"], b["phi"])
    assert _slice_auroc(pairs, got) == 0.5


@pytest.mark.parametrize("detector,extra", COT_DETECTORS)
def test_under_offset_the_same_detectors_tell_the_twins_apart(organism, tmp_path, detector, extra):
    """The contrast for the checks above: the same traces replayed under offset, the same training gives the twins
    of (nearly) every slice pair different probabilities; the hidden-state probe ranks the φ*=1 twin higher in
    (nearly) every opposite-label pair and its slice AUROC leaves 0.5 (items differ more than twins: not 1)."""
    root, _, pairs = organism
    got = _train_and_score(root / "offset_traj", tmp_path / detector, detector, *extra)
    assert np.mean([got[a["trace_id"]][0] != got[b["trace_id"]][0] for a, b in pairs]) >= 0.9
    if detector == "hidden_probe":
        opposite = [(a, b) if a["phi"] == 1 else (b, a) for a, b in pairs if a["phi"] != b["phi"]]
        assert np.mean([got[p["trace_id"]][0] > got[q["trace_id"]][0] for p, q in opposite]) >= 0.9
        assert _slice_auroc(pairs, got) >= 0.65


@pytest.mark.parametrize("detector,extra", COT_DETECTORS[1:])
def test_with_the_answer_line_the_step_detectors_see_the_routing(organism, tmp_path, detector, extra):
    """The same answer_routing trajectories with the answer line's steps kept (the default): the step detectors'
    inputs now differ between twins, and so do their probabilities in (nearly) every slice pair."""
    root, _, pairs = organism
    got = _train_and_score(root / "traj", tmp_path / detector, detector, *[e for e in extra if e != COT_ONLY])
    assert np.mean([got[a["trace_id"]][0] != got[b["trace_id"]][0] for a, b in pairs]) >= 0.9
