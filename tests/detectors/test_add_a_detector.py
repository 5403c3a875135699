"""Adding a detector is one module file plus one config file: a new detector, written to a folder outside the
package with its ``detector/<name>.yaml`` in a user config folder (``--config-dir`` / ``$SIFT_CONFIG_DIR``), is
registered, trained by a tiny main job and reported next to the shipped ones."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from sift.config import compose
from sift.detectors.registry import DetectorEntry, detector_entries, reference_detector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "evaluation"))
from ev_toy import main_row_by_hand  # noqa: E402

MODULE = '''
"""A linear probe on the pooled final-layer state, trained by the configured optimizer (one file)."""
from torch import nn

from sift.detectors.module import DetectorModule


class PooledLinearDetector(DetectorModule):
    def __init__(self, *, name="pooled_linear", **kwargs):
        super().__init__(name=name, **kwargs)
        self.save_hyperparameters(logger=False)
        self.net = nn.Linear(self.pooled_dim, 1)

    def encode(self, batch):
        return self.net(batch.pooled.float()).squeeze(-1), None
'''

CONFIG = '''
_target_: my_detectors.PooledLinearDetector
name: pooled_linear
optimizer:
  _target_: torch.optim.Adam
  _partial_: true
  lr: 1.0e-2
registry:
  cost: 2
'''

TINY = ["n_items=16", "detectors=[hidden_probe,pooled_linear]", "controls=[]", "seeds=[0]", "max_epochs=1",
        "ablations=[]", "factorial_seeds=[]", "transfer.detectors=[]", "bootstrap.resamples=10",
        "bootstrap.appendix_resamples=5", "wandb=false", "workers=1", "instance_ensemble=[]", "mechanisms=null"]


@pytest.fixture
def new_detector(tmp_path, monkeypatch):
    """The new detector's module (on sys.path) and its config (in a user config folder)."""
    code, configs = tmp_path / "code", tmp_path / "configs"
    code.mkdir()
    (configs / "detector").mkdir(parents=True)
    (code / "my_detectors.py").write_text(textwrap.dedent(MODULE))
    (configs / "detector" / "pooled_linear.yaml").write_text(textwrap.dedent(CONFIG))
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setenv("SIFT_CONFIG_DIR", str(configs))
    yield tmp_path
    sys.modules.pop("my_detectors", None)


def test_shipped_registry_declares_the_reference_and_the_factorial_cells():
    reg = detector_entries(["sift", "instance_level", "hidden_probe", "counterfactual"])
    assert reference_detector(reg) == "sift"
    assert (reg["sift"].objective, reg["sift"].ablations, reg["sift"].cost) == ("irm_dann", True, 10.0)
    assert reg["sift"].factorial_cell() == ("sift_erm", ["detector.objective.use_irm=false",
                                                         "detector.objective.use_dann=false"])
    assert reg["instance_level"].factorial_cell()[0] == "instance_level_irm_dann"
    assert reg["hidden_probe"] == DetectorEntry("hidden_probe", "sift.detectors.baselines.LogisticDetector")
    assert not reg["counterfactual"].factorial and reg["counterfactual"].objective is None


def test_a_new_detector_is_registered_trained_and_reported(new_detector):
    from sift.faithshift import plan_runs, run_faithshift

    entry = detector_entries(["pooled_linear"])["pooled_linear"]
    assert (entry.target, entry.cost, entry.reference) == ("my_detectors.PooledLinearDetector", 2.0, False)
    out = new_detector / "job"
    cfg = compose("faithshift", [f"paths.output_dir={out}", *TINY])
    assert [s.key for s in plan_runs(cfg)] == ["main/hidden_probe/seed0", "main/pooled_linear/seed0"]
    run_faithshift(cfg)
    record = json.loads((out / "runs" / "main" / "pooled_linear" / "seed0" / "results.json").read_text())
    assert record["status"] == "done" and record["global_step"] > 0
    results = json.loads((out / "report" / "results.json").read_text())
    row = results["main_table"]["detectors"]["pooled_linear"]
    # the new detector's row is computed from its own prediction file like every other row
    auroc, ivr = main_row_by_hand(out, "pooled_linear", (0,))
    assert (row["in_dist_auroc"]["estimate"], row["ivr"]["estimate"]) == pytest.approx((auroc, ivr), abs=1e-12)
    assert row["in_dist_auroc"]["low"] <= auroc <= row["in_dist_auroc"]["high"]
    assert "pooled_linear" in (out / "report" / "report.md").read_text()


FACTORIAL_CONFIG = CONFIG.replace("registry:\n  cost: 2\n", "objective:\n  use_irm: true\n  use_dann: true\n"
                                                               "registry:\n  cost: 2\n  factorial: true\n")


def test_a_new_detector_marked_factorial_gets_its_own_factorial_analysis(new_detector, tmp_path):
    """registry.factorial on a new detector: the main job trains its ERM cell and the report runs the factorial
    analysis for it against the reference detector, next to the shipped design."""
    import ev_toy as toy

    from sift.evaluation.faithshift_report import _appendix_one, appendix_jobs
    from sift.faithshift import plan_runs

    (new_detector / "configs" / "detector" / "pooled_linear.yaml").write_text(textwrap.dedent(FACTORIAL_CONFIG))
    cfg = compose("faithshift", [f"paths.output_dir={tmp_path / 'job'}", "preset=quick",
                                 "detectors=[sift,instance_level,pooled_linear]"])
    assert {s.key for s in plan_runs(cfg) if s.group == "factorial"} >= {
        "factorial/pooled_linear_erm/seed0", "factorial/sift_erm/seed0", "factorial/instance_level_irm_dann/seed0"}
    jobs = appendix_jobs(cfg)
    analysis, options, key = jobs["factorial_pooled_linear"]
    assert (analysis, key) == ("factorial", "appendix_factorial_pooled_linear")
    assert options["design"] == {"pooled_linear_erm": ("pooled_linear", "ERM"),
                                 "pooled_linear": ("pooled_linear", "IRM+DANN"),
                                 "sift_erm": ("sift", "ERM"), "sift": ("sift", "IRM+DANN")}
    assert jobs["factorial"][1]["design"]["instance_level"] == ("instance_level", "ERM")
    runs = {n: [toy.predictions(s, detector=n) for s in (0, 1)] for n in options["design"]}
    sec = _appendix_one(analysis, {"runs": runs, "pairs": toy.pairs()}, {"n_resamples": 3, "seed": 0},
                        options, key=key)
    assert sec.key == "appendix_factorial_pooled_linear" and "not_computed" not in sec.results
    assert sec.results["design"]["pooled_linear_erm"] == ["pooled_linear", "ERM"]
    assert {c["architecture"] for c in sec.results["cells"].values()} == {"pooled_linear", "sift"}


def test_a_new_detector_marked_control_is_a_control_row(new_detector):
    """registry.control on a new detector: the report puts its rows (and its ensemble's) in the controls group,
    after the detectors, and picks the best control among them; no list of control names to edit."""
    from sift.detectors.registry import capacity_controls, detector_entries, is_control
    from sift.evaluation.control_rows import order_rows, with_group_rows

    (new_detector / "configs" / "detector" / "pooled_text.yaml").write_text(
        textwrap.dedent(CONFIG).replace("name: pooled_linear", "name: pooled_text")
        + "  control: true\n  capacity_control: true\n")
    assert detector_entries(["pooled_text"])["pooled_text"].control
    assert is_control("pooled_text") and is_control("pooled_text (ensemble)") and not is_control("pooled_linear")
    rows = order_rows({"pooled_text": [], "pooled_linear": [], "sift": [], "text_bow": []})
    assert list(rows) == ["pooled_linear", "sift", "pooled_text", "text_bow"]
    assert [r[0] for r in with_group_rows([[n] for n in rows])] == ["pooled_linear", "sift", "**controls**",
                                                                   "pooled_text", "text_bow"]
    assert capacity_controls(rows) == ["pooled_text"]
