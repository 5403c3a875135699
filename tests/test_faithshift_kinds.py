"""Issue 43 item 5: the main job compares detectors across the organism's mechanism kinds (``mechanisms``).

(a) the plan: every kind but the primary gets its own corpus, trajectories and ``kinds/<kind>/…`` runs, and bad
    ``mechanisms`` / ``kind_seeds`` / ``kind_detectors`` are refused by message;
(b) the table (:func:`sift.evaluation.kinds_section.kinds_table`) on hand-made predictions equals AUROCs computed by
    hand on each kind's matched slice;
(c) a tiny job on offset and answer_routing: the section is in the report, and the detectors reading CoT states only
    (``data.answer_line=false``) score exactly 0.5 on answer_routing's matched slice (its CoT states are
    bit-identical between twins).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from sift.config import compose
from sift.errors import SiftError
from sift.evaluation.kinds_section import KindData, cross_kind_file, kinds_section, kinds_table
from sift.evaluation.predictions import Pairs, Predictions
from sift.organism import DEFAULT_CHECKPOINTS

PLAN = ["detectors=[hidden_probe,sift]", "controls=[text_bow]", "seeds=[0,1]", "ablations=[]", "factorial_seeds=[]",
        "transfer.detectors=[]", "wandb=false", "instance_ensemble=[]"]


def _cfg(out: Path, *extra: str):
    return compose("faithshift", [f"paths.output_dir={out}", *PLAN, *extra])


# ----------------------------------------------------------------------------------------------- (a) the plan
def test_every_other_kind_gets_its_corpus_trajectories_and_runs(tmp_path):
    from sift.faithshift import corpus_config, cross_kinds, plan_runs, source_models, train_config

    cfg = _cfg(tmp_path, "mechanisms=[offset,answer_routing]", "kind_seeds=[1]")
    specs = plan_runs(cfg)
    kind = [s for s in specs if s.group == "kind"]
    assert [s.key for s in kind] == [f"kinds/answer_routing/{d}/seed1" for d in ("hidden_probe", "sift", "text_bow")]
    assert [(s.detector, s.seed, s.overrides) for s in kind] == [(d, 1, [f"detector={d}"])
                                                                 for d in ("hidden_probe", "sift", "text_bow")]
    assert [s.tags for s in kind] == [{"mechanism_kind": "answer_routing"}] * 2 + [
        {"mechanism_kind": "answer_routing", "control": "true"}]
    root = tmp_path / "kinds" / "answer_routing"
    data = train_config(cfg, tmp_path, kind[0]).data
    assert (data.trajectory_dir, data.corpus_dir, data.cache_dir) == (
        str(root / "trajectories"), str(root / "corpus"), str(root / "cache"))
    main = next(s for s in specs if s.key == "main/hidden_probe/seed1")
    assert train_config(cfg, tmp_path, main).data.trajectory_dir == str(tmp_path / "trajectories")
    assert train_config(cfg, tmp_path, main, "answer_routing").data.cache_dir == str(root / "cache")
    # the cross-kind predictions: the kind seeds' main and kind runs, on every other kind
    assert cross_kinds(cfg, main) == ["answer_routing"] and cross_kinds(cfg, kind[0]) == ["offset"]
    assert cross_kinds(cfg, next(s for s in specs if s.key == "main/hidden_probe/seed0")) == []
    assert cross_kind_file(tmp_path, main.key, "answer_routing") == (
        tmp_path / "runs" / "main/hidden_probe/seed1" / "predictions" / "on_answer_routing" / "test.npz")
    # each kind's corpus: the same items and seed, its own kind and folder; cot_routing extracts with its own weights
    c = corpus_config(cfg, tmp_path, "answer_routing")
    assert (c.output_dir, c.source.mechanism_kind) == (str(root / "corpus"), "answer_routing")
    assert (c.n_items, c.seed) == (corpus_config(cfg, tmp_path).n_items, corpus_config(cfg, tmp_path).seed)
    assert corpus_config(cfg, tmp_path).source.mechanism_kind == "offset"
    assert source_models(cfg, tmp_path, "cot_routing") == {
        f: str(DEFAULT_CHECKPOINTS / "cot_routing" / f) for f in ("gpt2", "llama")}
    assert source_models(cfg, tmp_path, "answer_routing") == {f: str(DEFAULT_CHECKPOINTS / f)
                                                              for f in ("gpt2", "llama")}
    # kind_detectors narrows the kinds' runs; one kind (or null) is today's job
    only = plan_runs(_cfg(tmp_path, "mechanisms=[offset,answer_routing]", "kind_detectors=[sift]"))
    assert [s.key for s in only if s.group == "kind"] == ["kinds/answer_routing/sift/seed0"]
    for one in ("mechanisms=null", "mechanisms=[offset]"):
        assert not [s for s in plan_runs(_cfg(tmp_path, one)) if s.group == "kind"]


def test_the_presets_compare_every_kind_on_the_organism_only():
    for preset in (None, "quick", "paper"):
        cfg = compose("faithshift", [f"preset={preset}"] if preset else [])
        assert list(cfg.mechanisms) == ["offset", "answer_routing", "cot_routing"] and list(cfg.kind_seeds) == [0]
        assert cfg.kind_detectors is None
    for preset in ("real_small", "real_paper"):
        assert compose("faithshift", [f"preset={preset}"]).mechanisms is None


@pytest.mark.parametrize("overrides, message", [
    (["mechanisms=[offset,sideways]"], r"mechanisms: 'sideways' is not a mechanism kind \(offset, answer_routing, "
                                       r"cot_routing\)"),
    (["mechanisms=[offset,answer_routing,offset]"], r"mechanisms: 'offset' is listed twice"),
    (["mechanisms=[answer_routing,cot_routing]"], r"does not list the primary kind 'offset' \(source.mechanism_kind\)"),
    (["mechanisms=[answer_routing]"], r"does not list the primary kind 'offset'"),
    (["source=hf", "source.models=[/m/a]"], r"^mechanisms: mechanism kinds are the organism's; source.type=hf has "
                                            r"none \(set mechanisms=null\)$"),
    (["mechanisms=[offset,answer_routing]", "kind_seeds=[2]"], r"kind_seeds: seed 2 is not one of seeds \[0, 1\]"),
    (["mechanisms=[offset,answer_routing]", "kind_seeds=[]"], r"kind_seeds: .* need at least one seed"),
    (["mechanisms=[offset,answer_routing]", "kind_detectors=[counterfactual]"],
     r"kind_detectors: 'counterfactual' is not one of the job's detectors or controls"),
])
def test_bad_kind_settings_are_refused_before_any_work(tmp_path, overrides, message):
    from sift.faithshift import validate_plan

    with pytest.raises(SiftError, match=message):
        validate_plan(_cfg(tmp_path / "job", *overrides), tmp_path / "job")
    assert not (tmp_path / "job").exists()


def test_a_kind_without_its_weights_is_refused_by_name(tmp_path):
    """cot_routing has weights of its own: a checkpoint folder without them fails validation naming the kind."""
    from sift.faithshift import validate_plan

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for f in ("gpt2", "llama"):
        (ckpt / f).symlink_to(DEFAULT_CHECKPOINTS / f)
    cfg = _cfg(tmp_path / "job", f"source.checkpoint_dir={ckpt}", "mechanisms=[offset,cot_routing]")
    with pytest.raises(SiftError, match=rf"mechanisms \(cot_routing\): model path does not exist: "
                                        rf"{ckpt / 'cot_routing' / 'gpt2'}"):
        validate_plan(cfg, tmp_path / "job")


# --------------------------------------------------------------------------------------- (b) the table by hand
N_ITEMS = 12


def _preds(detector: str, seed: int, prob: np.ndarray, label: np.ndarray, ids: list[str]) -> Predictions:
    items = [t.split("|")[0] for t in ids]
    n = len(ids)
    return Predictions(detector, seed, "test", 0.5, ids, items, ["arithmetic"] * n, ["gpt2"] * n, ["base"] * n,
                       label, prob)


def _kind_traces() -> tuple[list[str], np.ndarray, set[str]]:
    """Per item: two twins (labels 1, 0; in the slice) and one trace outside the slice (label 1)."""
    ids = [f"i{i}|{t}" for i in range(N_ITEMS) for t in ("m1", "m0", "x")]
    label = np.array([{"m1": 1, "m0": 0, "x": 1}[t.split("|")[1]] for t in ids])
    return ids, label, {t for t in ids if not t.endswith("|x")}


def _slice_auc(p: Predictions, slice_ids: set[str]) -> float:
    keep = np.array([t in slice_ids for t in p.trace_id])
    return float(roc_auc_score(p.label[keep], p.prob[keep]))


def test_the_table_is_the_slice_auroc_of_each_kind_by_hand(tmp_path):
    rng = np.random.default_rng(0)
    ids, label, sl = _kind_traces()
    empty = Pairs(np.zeros(0, str), np.zeros(0, str), np.zeros(0, str), np.zeros(0, str), np.zeros(0, int),
                  np.zeros(0, int), np.zeros(0, str))
    perfect = np.where(label == 1, 0.9, 0.1)
    perfect[2::3] = 0.0  # outside the slice: ranked last, so only the slice gives AUROC 1
    rand = {k: rng.uniform(size=len(ids)) for k in ("a1", "b0", "c0", "x0", "t0", "t1")}
    offset = {"hidden_probe": [_preds("hidden_probe", 0, perfect, label, ids),
                               _preds("hidden_probe", 1, rand["a1"], label, ids)],
              "text_bow": [_preds("text_bow", 0, rand["t0"], label, ids),
                           _preds("text_bow", 1, rand["t1"], label, ids)]}
    routed = {"hidden_probe": [_preds("hidden_probe", 0, rand["b0"], label, ids)],
              "text_bow": [_preds("text_bow", 0, rand["c0"], label, ids)]}
    cross = {("offset", "answer_routing"): {"hidden_probe": [_preds("hidden_probe", 0, rand["x0"], label, ids)]},
             ("answer_routing", "offset"): {"hidden_probe": [_preds("hidden_probe", 0, perfect, label, ids)]}}
    res = kinds_table({"offset": KindData(offset, empty, sl), "answer_routing": KindData(routed, empty, sl)}, cross,
                      matrix_seeds=[0], n_resamples=30, seed=0)
    assert res["kinds"] == ["offset", "answer_routing"] and res["matrix_seeds"] == [0]
    hp, tb = res["detectors"]["hidden_probe"], res["detectors"]["text_bow"]
    assert (hp["group"], tb["group"]) == ("detectors", "controls")
    # in-kind: the seed mean of the slice AUROCs (the perfect seed is 1.0 on the slice, not on every trace)
    want = np.mean([_slice_auc(p, sl) for p in offset["hidden_probe"]])
    assert _slice_auc(offset["hidden_probe"][0], sl) == 1.0
    assert hp["kinds"]["offset"]["auroc"]["estimate"] == pytest.approx(want, abs=1e-12)
    assert (hp["kinds"]["offset"]["seeds"], hp["kinds"]["offset"]["n_seeds"]) == ([0, 1], 2)
    assert hp["kinds"]["answer_routing"]["auroc"]["estimate"] == pytest.approx(
        _slice_auc(routed["hidden_probe"][0], sl), abs=1e-12)
    assert hp["kinds"]["answer_routing"]["n_seeds"] == 1
    for row in (hp, tb):
        aucs = {k: c["auroc"]["estimate"] for k, c in row["kinds"].items()}
        assert row["worst_kind"] == {"kind": min(aucs, key=aucs.get), "auroc": min(aucs.values())}
        for c in row["kinds"].values():
            assert c["auroc"]["low"] <= c["auroc"]["estimate"] <= c["auroc"]["high"]
            assert set(c) >= {"ivr", "mfs"}
    # the matrix: off the diagonal the cross predictions on the test kind's slice; on it the in-kind runs of the
    # matrix seeds (answer_routing has only seed 0: the in-kind cell itself; offset's seed 0 alone)
    m = res["cross_kind"]["hidden_probe"]
    assert m["offset"]["answer_routing"]["estimate"] == pytest.approx(
        _slice_auc(cross[("offset", "answer_routing")]["hidden_probe"][0], sl), abs=1e-12)
    assert m["answer_routing"]["offset"]["estimate"] == 1.0
    ar = hp["kinds"]["answer_routing"]["auroc"]
    assert {k: m["answer_routing"]["answer_routing"][k] for k in ("estimate", "low", "high")} == ar
    assert m["offset"]["offset"]["estimate"] == 1.0 and m["offset"]["offset"]["seeds"] == [0]
    assert res["cross_kind"]["text_bow"]["offset"]["answer_routing"] is None  # no cross predictions given
    sec = kinds_section(res, tmp_path, primary="offset")
    assert sec.key == "mechanism_kinds" and sec.figures == ["figures/mechanism_kinds.png"]
    assert (tmp_path / "figures" / "mechanism_kinds.png").is_file()
    assert "offset (primary): 0, 1; answer_routing: 0" in sec.markdown and "| **controls** |" in sec.markdown
    line = next(x for x in sec.markdown.splitlines() if x.startswith("| hidden_probe |"))
    assert line.endswith(f"| {hp['worst_kind']['kind']} ({hp['worst_kind']['auroc']:.3f}) |")


def test_a_cross_kind_prediction_needs_the_same_test_items(tmp_path):
    from types import SimpleNamespace

    from sift.faithshift import check_same_test_items
    from sift.trajectories.splits import item_splits

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    items = [f"arithmetic-0-{i:05d}" for i in range(20)]
    (corpus / "traces.jsonl").write_text("".join(json.dumps({"base_item": i, "domain": "arithmetic"}) + "\n"
                                                 for i in items))
    split = item_splits(items, 0)
    dm = SimpleNamespace(holdout_domain=None, seed=0, split_fractions=(0.6, 0.15, 0.25), calib_fraction=0.0,
                         split_items=split)
    check_same_test_items(dm, corpus, "x")  # the same items and seed: the same test split
    dm.split_items = item_splits(items[:-1], 0)
    with pytest.raises(SiftError, match=r"^x: its test split \(\d+ items\) is not the run's own \(5 items, \d+ "
                                        r"differ\); every kind's corpus needs the same n_items and seed$"):
        check_same_test_items(dm, corpus, "x")


# ------------------------------------------------------------------------------------------- (c) a tiny job
#: two kinds, two CoT-state detectors and one control, one seed, one epoch, the base and paraphrase conditions; the
#: step sequences hold the CoT's positions only (``data.answer_line=false``: answer_routing acts at the answer line)
TINY = ["train_overrides=['data.answer_line=false']", "n_items=16", "conditions=[base,paraphrase]",
        "detectors=[hidden_probe,sift]", "controls=[text_bow]",
        "seeds=[0]", "kind_seeds=[0]", "mechanisms=[offset,answer_routing]", "max_epochs=1",
        "max_epochs_by_detector=null", "max_steps_by_detector=null", "ablations=[]", "factorial_seeds=[]",
        "transfer.detectors=[]", "bootstrap.resamples=20", "bootstrap.appendix_resamples=5", "wandb=false",
        "workers=1", "instance_ensemble=[]"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from sift.faithshift import run_faithshift

    out = tmp_path_factory.mktemp("kinds")
    cfg = compose("faithshift", [f"paths.output_dir={out}", *TINY])
    run_faithshift(cfg)
    return cfg, out


def _slice(corpus: Path) -> set[str]:
    from sift.evaluation.control_rows import slice_ids_from_corpus

    return slice_ids_from_corpus(corpus)


def test_the_job_reports_detectors_across_kinds(job):
    _, out = job
    root = out / "kinds" / "answer_routing"
    assert json.loads((root / "corpus" / "manifest.json").read_text())["mechanism_kind"] == "answer_routing"
    assert json.loads((out / "corpus" / "manifest.json").read_text())["mechanism_kind"] == "offset"
    assert (root / "trajectories" / "trajectories.json").is_file()
    index = {r["key"]: r for r in json.loads((out / "runs" / "index.json").read_text())}
    for d in ("hidden_probe", "sift", "text_bow"):
        assert index[f"kinds/answer_routing/{d}/seed0"]["mechanism_kind"] == "answer_routing"
        assert Path(index[f"main/{d}/seed0"]["cross_kind"]["answer_routing"]).is_file()
        assert Path(index[f"kinds/answer_routing/{d}/seed0"]["cross_kind"]["offset"]).is_file()
    report = (out / "report" / "report.md").read_text()
    assert "## Detectors × mechanism kind" in report and "**Train on one kind, test on another**" in report
    assert (out / "report" / "figures" / "mechanism_kinds.png").is_file()
    results = json.loads((out / "report" / "results.json").read_text())
    res = results["mechanism_kinds"]
    assert res["kinds"] == ["offset", "answer_routing"] and res["primary"] == "offset"
    assert list(res["detectors"]) == ["hidden_probe", "sift", "text_bow"]
    assert set(results["main_table"]["detectors"]) == {"hidden_probe", "sift", "text_bow"}  # kind runs stay out
    # in-kind cells are the slice AUROC of each kind's own runs, on its own corpus's slice
    for kind, key in (("offset", "main/hidden_probe/seed0"),
                      ("answer_routing", "kinds/answer_routing/hidden_probe/seed0")):
        p = Predictions.load(out / "runs" / key / "predictions" / "test.npz")
        corpus = out / "corpus" if kind == "offset" else root / "corpus"
        assert res["detectors"]["hidden_probe"]["kinds"][kind]["auroc"]["estimate"] == pytest.approx(
            _slice_auc(p, _slice(corpus)), abs=1e-9)
    p = Predictions.load(cross_kind_file(out, "main/hidden_probe/seed0", "answer_routing"))
    assert res["cross_kind"]["hidden_probe"]["offset"]["answer_routing"]["estimate"] == pytest.approx(
        _slice_auc(p, _slice(root / "corpus")), abs=1e-9)


def test_cot_state_detectors_score_exactly_one_half_on_answer_routing(job):
    """Under answer_routing the CoT states are bit-identical between twins: the twins of every slice pair get one
    probability (up to SIFT's float32 rounding, which depends on the row of the batch), and with opposite labels the
    slice AUROC is 0.5 exactly, in-kind and for the offset-trained model alike."""
    _, out = job
    res = json.loads((out / "report" / "results.json").read_text())["mechanism_kinds"]
    corpus = out / "kinds" / "answer_routing" / "corpus"
    sl = _slice(corpus)
    twin = {}
    for line in (corpus / "traces.jsonl").read_text().splitlines():
        r = json.loads(line)
        twin[r["trace_id"]] = r["twin"]
    for d in ("hidden_probe", "sift"):
        p = Predictions.load(out / "runs" / "kinds" / "answer_routing" / d / "seed0" / "predictions" / "test.npz")
        by: dict[str, list[float]] = {}
        for t, pr in zip(p.trace_id, p.prob):
            if t in sl:
                by.setdefault(twin[t], []).append(float(pr))
        assert by and all(len(v) == 2 and abs(v[0] - v[1]) < 1e-6 for v in by.values()), d
        assert res["detectors"][d]["kinds"]["answer_routing"]["auroc"]["estimate"] == 0.5, d
        assert res["cross_kind"][d]["offset"]["answer_routing"]["estimate"] == 0.5, d
        assert res["detectors"][d]["worst_kind"]["auroc"] <= 0.5


def test_cross_kind_predictions_are_reused_and_enter_the_report_key(job):
    from sift.evaluation.faithshift_report import report_key
    from sift.faithshift import SPLITS, cross_predict, plan_runs

    cfg, out = job
    specs = plan_runs(cfg)
    spec = next(s for s in specs if s.key == "main/sift/seed0")
    path = cross_kind_file(out, spec.key, "answer_routing")
    before = path.stat().st_mtime_ns
    record = json.loads((out / "runs" / spec.key / "results.json").read_text())
    assert cross_predict(cfg, out, spec, record) == {"answer_routing": path}
    assert path.stat().st_mtime_ns == before
    files = {s.key: {sp: f for sp in SPLITS if (f := out / "runs" / s.key / "predictions" / f"{sp}.npz").is_file()}
             for s in specs}
    key = report_key(cfg, out, specs, files)
    assert key == (out / "report" / "report_key.txt").read_text()
    data = path.read_bytes()
    p = Predictions.load(path)
    p.prob = 1 - p.prob
    p.save(path)
    try:
        assert report_key(cfg, out, specs, files) != key
    finally:
        path.write_bytes(data)
