"""Adding a metric to the report takes one file: a registered section module (plus naming it in the options).

The module below is written to a temporary folder, as a user's plugin would be; the report then carries its
block in ``results.json`` (after the built-in tables) and its table in ``report.md``.
"""

from __future__ import annotations

import json
import sys
import textwrap

import ev_toy as toy
import numpy as np
import pytest

from sift.evaluation.engine import ReportOptions
from sift.evaluation.run import report_from_predictions
from sift.evaluation.sections import registry

PLUGIN = '''
"""Brier score of every detector row (mean over its seeds), read from the aligned prediction table."""

import numpy as np

from sift.evaluation.sections.registry import ReportSection, register_section
from sift.report import markdown_table


@register_section
class Brier(ReportSection):
    name = "brier"
    title = "Brier score"
    needs = ("test",)

    def compute(self, ctx):
        t, out = ctx.table, {}
        for row, runs in ctx.primary.items():
            per_seed = []
            for p in runs:
                r = t.rows(split=ctx.options.split, detector=row)
                r = r[t.run[r] == t.runs.index(p)]
                per_seed.append(float(np.mean((t.prob[r] - t.label[r]) ** 2)))
            out[row] = {"brier": float(np.mean(per_seed)), "n_seeds": len(per_seed)}
        return {"detectors": out}

    def render(self, results, ctx):
        rows = [[name, f"{v['brier']:.4f}", v["n_seeds"]] for name, v in results["detectors"].items()]
        return markdown_table(["Detector", "Brier", "Seeds"], rows)
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module on sys.path; the registry and sys.modules restored afterwards."""
    (tmp_path / "brier_section.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.registered_sections()  # the built-ins register on import: import them before taking the snapshot
    monkeypatch.setattr(registry, "SECTIONS", registry.SECTIONS.copy())
    yield "brier_section"
    sys.modules.pop("brier_section", None)


def test_a_section_in_one_module_reaches_results_and_report(tmp_path, plugin):
    preds = [toy.predictions(0), toy.predictions(1)]
    out = tmp_path / "report"
    report_from_predictions(preds, toy.pairs(), out, ReportOptions.of(n_resamples=10, section_modules=[plugin]))
    res = json.loads((out / "results.json").read_text())
    expected = np.mean([np.mean((p.prob - p.label) ** 2) for p in preds])
    assert res["brier"]["detectors"]["toy"] == {"brier": pytest.approx(expected), "n_seeds": 2}
    keys = [k for k in res if k != "meta"]
    assert keys.index("brier") > keys.index("selective_risk") and keys[-1] == "brier"
    md = (out / "report.md").read_text()
    assert "## Brier score" in md and f"| toy | {expected:.4f} | 2 |" in md


def test_without_the_plugin_the_report_is_unchanged(tmp_path):
    sections = report_from_predictions([toy.predictions(0)], toy.pairs(), tmp_path, ReportOptions.of(n_resamples=0),
                                       write=False)
    assert [s.key for s in sections] == ["main_table", "selective_risk"]


def test_a_section_name_is_registered_once(monkeypatch):
    registry.registered_sections()
    monkeypatch.setattr(registry, "SECTIONS", registry.SECTIONS.copy())

    class Again(registry.ReportSection):
        name = "main_table"

    with pytest.raises(Exception, match="registered twice"):
        registry.register_section(Again)
