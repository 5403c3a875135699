"""The main job end to end on a tiny organism corpus: every stage runs, the report holds finite numbers with
CIs for every detector, and a rerun reuses every stage."""

import json
import math
import sys
from pathlib import Path

import pytest

from sift.config import compose
from sift.faithshift import run_faithshift

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from ev_toy import main_row_by_hand  # noqa: E402

TINY = ["n_items=16", "detectors=[hidden_probe,biasing_features]", "controls=[text_bow,surface,text_sift]",
        "seeds=[0,1]", "max_epochs=2", "ablations=[]", "factorial_seeds=[]", "transfer.detectors=[]",
        "bootstrap.resamples=30", "max_epochs_by_detector=null",  # the preset's caps (text_sift: 60) would win
        "wandb=false", "workers=1", "instance_ensemble=[hidden_probe,biasing_features]",
        "mechanisms=null",  # one mechanism kind (tests/test_faithshift_kinds.py compares several)
        "trainer.stack_seeds=true",  # text_sift's two seeds train stacked (on CPU `auto` keeps them apart)
        "export=[hf]"]  # the export stage (sift.export; the Inspect log's round trip: tests/test_export.py)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("faithshift")
    cfg = compose("faithshift", [f"paths.output_dir={out}", *TINY])
    return cfg, out, run_faithshift(cfg)


def test_every_stage_writes_its_files(job):
    cfg, out, res = job
    assert res["runs"] == 10
    for f in ("corpus/traces.jsonl", "corpus/manifest.json", "trajectories/trajectories.json", "runs/index.json",
              "report/report.md", "report/results.json"):
        assert (out / f).is_file(), f
    for d in ("hidden_probe", "biasing_features"):
        for s in (0, 1):
            run = out / "runs" / "main" / d / f"seed{s}"
            assert json.loads((run / "results.json").read_text())["status"] == "done"
            assert (run / "predictions" / "test.npz").is_file() and (run / "predictions" / "val.npz").is_file()
    # the plan records the stacked group: text_sift's seeds trained together (its net stacks), the logistic
    # baselines alone (they fit once, in closed form)
    index = {r["key"]: r for r in json.loads((out / "runs" / "index.json").read_text())}
    for s in (0, 1):
        assert index[f"main/text_sift/seed{s}"]["stacked_with"] == [0, 1]
        assert json.loads((out / "runs" / "main" / "text_sift" / f"seed{s}" / "results.json").read_text())[
            "stacked"] == [0, 1]
        assert index[f"main/hidden_probe/seed{s}"]["stacked_with"] is None


def test_main_table_has_finite_values_with_cis_for_every_detector(job):
    """Every row has finite numbers inside their CIs, and two detectors' in-distribution AUROC and IVR equal
    their recomputation from the job's prediction files and the corpus's pairs (``ev_toy.main_row_by_hand``:
    per-seed Mann–Whitney AUROC and macro-mean flip rate over preserving axes, averaged over seeds)."""
    _, out, _ = job
    results = json.loads((out / "report" / "results.json").read_text())
    report = (out / "report" / "report.md").read_text()
    main = json.dumps(results["main_table"])
    for det in ("hidden_probe", "biasing_features", "instance_ensemble"):
        assert det in main and det in report
    for det, row in results["main_table"]["detectors"].items():
        for col in ("in_dist_auroc", "ivr", "as", "mfs", "coverage"):
            v = row[col]
            assert math.isfinite(v["estimate"]) and v["low"] <= v["estimate"] + 1e-12 <= v["high"] + 2e-12, (det, col)
    for det in ("hidden_probe", "biasing_features"):
        auroc, ivr = main_row_by_hand(out, det, (0, 1))
        row = results["main_table"]["detectors"][det]
        assert (row["in_dist_auroc"]["estimate"], row["ivr"]["estimate"]) == pytest.approx((auroc, ivr), abs=1e-12)
    assert results["meta"]["preset"] == "full" and results["corpus"]["traces"] > 0


def test_report_shows_the_controls_group_margins_and_the_matched_slice(job):
    _, out, _ = job
    results = json.loads((out / "report" / "results.json").read_text())
    report = (out / "report" / "report.md").read_text()
    rows = results["main_table"]["detectors"]
    assert rows["text_bow"]["group"] == rows["surface"]["group"] == rows["text_sift"]["group"] == "controls"
    assert rows["hidden_probe"]["group"] == "detectors"
    assert rows["hidden_probe"]["margin_over_best_control"]["best_control"] in ("text_bow", "surface", "text_sift")
    assert "**controls**" in report and "Δ AUROC vs best control" in report and "Matched-text slice" in report
    assert set(results["matched_slice"]["detectors"]) >= {"hidden_probe", "text_bow", "surface", "text_sift"}
    manifest = json.loads((out / "corpus" / "manifest.json").read_text())
    assert manifest["matched_slice"]["traces"] > 0
    assert set(manifest["controls_audit"]["controls"]) == {"text_bow", "surface", "prompt_probe", "text_trees"}
    assert "Shortcut-control audit" in report


def test_the_export_stage_holds_every_trace_and_prediction_with_the_datamodules_splits(job):
    """The job's export (export=[hf]): one corpus row per trace, one prediction row per (run, split, trace), and
    each trace's split is the one its predictions were made on (the DataModule's, recomputed from the config)."""
    datasets = pytest.importorskip("datasets")
    from sift.evaluation.predictions import Predictions

    _, out, res = job
    corpus = datasets.load_from_disk(str(out / "export" / "corpus"))
    preds = datasets.load_from_disk(str(out / "export" / "predictions"))
    n_traces = sum(1 for line in (out / "corpus" / "traces.jsonl").read_text().splitlines() if line.strip())
    assert len(corpus) == n_traces and res["export"] == str(out / "export")
    files = [f for r in json.loads((out / "runs" / "index.json").read_text()) for f in r["predictions"].values()]
    assert len(preds) == sum(len(Predictions.load(f)) for f in files) > 0
    split_of = dict(zip(corpus["trace_id"], corpus["split"]))
    for t, sp in zip(preds["trace_id"], preds["split"]):
        assert split_of[t] == sp or (sp == "val" and split_of[t] in ("val", "calib"))


def test_rerun_reuses_every_stage(job, capsys):
    cfg, out, _ = job
    before = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("results.json")}
    run_faithshift(cfg)
    assert "skipping" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("results.json")} == before


def test_parallel_workers_give_the_same_predictions(job, tmp_path):
    """Two worker processes (the default) train and predict exactly what one process does."""
    import numpy as np

    _, out1, _ = job
    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", *[o for o in TINY if not o.startswith("workers=")],
                                 "workers=2"])
    run_faithshift(cfg)
    for d in ("hidden_probe", "biasing_features", "text_sift"):
        for s in (0, 1):
            a = np.load(out1 / "runs" / "main" / d / f"seed{s}" / "predictions" / "test.npz")
            b = np.load(tmp_path / "runs" / "main" / d / f"seed{s}" / "predictions" / "test.npz")
            assert list(a["trace_id"]) == list(b["trace_id"])
            np.testing.assert_array_equal(a["prob"], b["prob"])


def test_step_caps_per_detector_reach_each_run_and_bad_caps_are_refused(tmp_path):
    from sift.errors import SiftError
    from sift.faithshift import plan_runs, train_config, validate_plan

    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick", "max_steps_by_detector={sift: 245}"])
    by_det = {}
    for spec in plan_runs(cfg):
        by_det.setdefault(spec.detector, train_config(cfg, tmp_path, spec).trainer)
    assert by_det["sift"].max_steps == 245 and by_det["sift"].max_epochs == 4
    assert by_det["hidden_probe"].get("max_steps", -1) == -1    # no cap: Lightning's default (unlimited)
    bad = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick", "max_steps_by_detector={sift: 0}"])
    with pytest.raises(SiftError, match="max_steps_by_detector.sift"):
        validate_plan(bad, tmp_path / "x")
    typo = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick", "undertrained_detectors=[instance]"])
    with pytest.raises(SiftError, match="undertrained_detectors: 'instance'"):
        validate_plan(typo, tmp_path / "y")


def test_env_batch_size_reaches_every_run_and_a_bad_one_is_refused(tmp_path):
    from sift.errors import SiftError
    from sift.faithshift import plan_runs, train_config, validate_plan

    default = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick"])
    spec = plan_runs(default)[0]
    assert train_config(default, tmp_path, spec).data.env_batch_size is None  # the data config's (batch_size)
    cfg = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick", "env_batch_size=16"])
    assert {train_config(cfg, tmp_path, s).data.env_batch_size for s in plan_runs(cfg)} == {16}
    bad = compose("faithshift", [f"paths.output_dir={tmp_path}", "preset=quick", "env_batch_size=0"])
    with pytest.raises(SiftError, match="env_batch_size: expected an integer >= 1, got 0"):
        validate_plan(bad, tmp_path / "x")
