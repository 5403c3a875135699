"""sift-evaluate end to end: tiny detectors trained on synthetic data → predictions, pairs, report; then the
report again from the saved predictions alone (no models), and the collect helpers."""

import json
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sift.cli._common import CONFIG_DIR
from sift.evaluation.collect import pairs_from_datamodule, predict
from sift.evaluation.predictions import Predictions
from sift.evaluation.run import evaluate, load_pairs, resolve_detectors
from sift.training import train

DATA = ["data=synthetic", "data.generator.n_items=120", "data.generator.t_max=24"]


def compose_eval(*overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("evaluate", overrides=[*DATA, *overrides])
    GlobalHydra.instance().clear()
    return cfg


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """Two seeds of the instance-level MLP, two epochs each, on 120 synthetic items."""
    root = tmp_path_factory.mktemp("runs")
    GlobalHydra.instance().clear()
    recs = []
    for s in (0, 1):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[f"paths.output_dir={root / f'seed{s}'}", "logger=none", *DATA,
                                              "detector=instance_level", "trainer.max_epochs=2", f"seed={s}"])
        GlobalHydra.instance().clear()
        recs.append(train(cfg))
    return root, recs


def test_collect_predict_and_pairs(two_seeds):
    from datamodules.synthetic_datamodule import SyntheticDataModule
    from sift.detectors import load_detector

    _, recs = two_seeds
    c = recs[0]["config"]["data"]
    dm = SyntheticDataModule(**{k: v for k, v in c.items() if k != "_target_"})
    dm.setup()
    det = load_detector(recs[0]["best_ckpt"])
    p = predict(det, dm, "test", seed=0)
    ds = dm.dataset("test")
    assert p.detector == "instance_level" and p.seed == 0 and p.threshold == pytest.approx(recs[0]["threshold"])
    assert p.trace_id.tolist() == [e.trace_id for e in ds]
    assert p.label.tolist() == [e.label for e in ds]
    assert set(p.condition) == {"env0", "env1", "env2", "altered"} and set(p.domain) <= {"domain0", "domain1"}
    np.testing.assert_allclose(p.prob, det.predict_loader(dm.test_dataloader())["prob"].numpy(), atol=1e-6)
    pr = pairs_from_datamodule(dm)
    assert len(pr) == sum(len(dm.pairs(s)) for s in ("val", "test", "transfer"))
    src, dst, keep = pr.select(kind="altering").rows(p)
    assert keep.all() and (p.label[src] != p.label[dst]).all()


def test_sift_evaluate_end_to_end(two_seeds, tmp_path):
    root, recs = two_seeds
    specs = resolve_detectors([str(root)])  # a sweep-like folder: both runs
    assert sorted(s.seed for s in specs) == [0, 1] and {s.name for s in specs} == {"instance_level"}
    out = tmp_path / "eval"
    cfg = compose_eval(f"paths.output_dir={out}", f"detectors=[{root / 'seed0'},{root / 'seed1'}]",
                       "bootstrap.resamples=30", "sgr.alpha=0.4", "sgr.alphas=[0.4]")
    rec = evaluate(cfg)
    assert rec["sections"] == ["main_table", "ensemble_comparison", "selective_risk"]
    res = json.loads((out / "results.json").read_text())
    main = res["main_table"]["detectors"]["instance_level"]
    assert main["seed_stability"]["seeds"] == [0, 1]
    assert main["in_dist_auroc"]["estimate"] > 0.6
    assert res["main_table"]["transfer_settings"] == ["transfer"]
    # the synthetic DataModule has no calibration split: SGR is in-sample and the report says so
    assert res["main_table"]["calibration"] == "in-sample on the evaluated split (descriptive, not a certificate)"
    assert main["seed_repeat"]["n_seed_pairs"] == 1 and main["seed_repeat"]["raw"] is not None
    assert "instance_level" in res["ensemble_comparison"]["detectors"]
    report = (out / "report.md").read_text()
    assert "## Main results (Table 1)" in report and "risk_coverage.png" in report
    assert (out / "risk_coverage.png").is_file()
    saved = sorted(x.name for x in (out / "predictions").glob("*.npz"))
    assert "pairs.npz" in saved and "instance_level__seed0__test.npz" in saved and len(saved) == 7
    p = Predictions.load(out / "predictions" / "instance_level__seed1__transfer.npz")
    assert p.meta["transfer_setting"] == "transfer" and p.split == "transfer"
    # the same report from the saved predictions alone (no models, no DataModule)
    out2 = tmp_path / "eval2"
    evaluate(compose_eval(f"paths.output_dir={out2}", f"predictions=[{out / 'predictions'}]", "bootstrap.resamples=30",
                          "sgr.alpha=0.4", "sgr.alphas=[0.4]"))
    res2 = json.loads((out2 / "results.json").read_text())
    assert res2["main_table"] == res["main_table"]
    assert len(load_pairs(out / "predictions" / "pairs.npz")) > 0


def test_console_entry_composes_its_config():
    r = subprocess.run([sys.executable, "-m", "sift.cli.evaluate", "--cfg", "job", "data=synthetic",
                        "companion=none"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "match_coverage: 0.7" in r.stdout and "enabled: false" in r.stdout


def test_sift_evaluate_errors(tmp_path):
    cfg = compose_eval(f"paths.output_dir={tmp_path / 'x'}")
    from sift.errors import SiftError

    with pytest.raises(SiftError, match="no verified pairs|nothing to evaluate"):
        evaluate(cfg)
    with pytest.raises(SiftError, match="no such file"):
        resolve_detectors([str(tmp_path / "missing")])
