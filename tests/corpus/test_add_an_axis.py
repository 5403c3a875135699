"""Adding a FaithShift axis is one class (here, in this file) plus its name in the corpus config's conditions:
the corpus builds and verifies its pairs, the manifest counts them and the evaluation lists it among the axes."""

from __future__ import annotations

import json
import random

import pytest

from sift.corpus.axes import AXES, PreservingAxis, check_conditions, register_axis
from sift.organism.domains import Item
from sift.organism.render import View


class NameSwap(PreservingAxis):
    """The same problem told about another person: the label must not move."""

    name = "name_swap"

    def organism_view(self, item: Item, base: View, rng: random.Random, phi: int | None) -> View | None:
        return base.with_(name=(base.name + 1 + rng.randrange(3)) % 4)


@pytest.fixture
def name_swap():
    register_axis(NameSwap)
    yield AXES["name_swap"]
    AXES.pop("name_swap")


def test_a_new_axis_is_one_class(name_swap):
    assert check_conditions(["base", "name_swap"]) == ["base", "name_swap"]
    assert name_swap.kind == "preserving" and name_swap.verify(1, 1) == (True, "kept")
    assert name_swap.verify(1, 0) == (False, "label flipped") and name_swap.verify(None, 1)[0] is False
    assert not name_swap.applies_to_lm()  # no lm_view: not applicable to a real LM's corpus


def test_a_new_axis_reaches_the_manifest_and_the_evaluation(name_swap, tmp_path):
    from sift.config import compose
    from sift.corpus.job import run_corpus
    from sift.evaluation.analysis import preserving_axes
    from sift.evaluation.predictions import Pairs

    out = tmp_path / "corpus"
    cfg = compose("corpus", [f"output_dir={out}", "n_items=8", "conditions=[base,paraphrase,name_swap]",
                             "source.families=[gpt2]", "source.audit_seeds=1", "source.chunk_items=8"])
    manifest = run_corpus(cfg, progress=False)
    traces = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    base = {t["base_item"]: t for t in traces if t["condition"] == "base"}
    swapped = [t for t in traces if t["condition"] == "name_swap"]  # 8 items × both mechanism latents (twins)
    assert len(swapped) == 16 and all(t["view"]["name"] != base[t["base_item"]]["view"]["name"] for t in swapped)
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    mine = [p for p in pairs if p["axis"] == "name_swap"]
    assert len(mine) == 16 and all(p["kind"] == "preserving" for p in mine)
    assert all(p["source"].rsplit("|", 1)[1] == p["shifted"].rsplit("|", 1)[1] for p in mine)  # one latent a pair
    assert all(p["verified"] == (p["phi_source"] == p["phi_shifted"] is not None) for p in mine)
    axis = manifest["axes"]["name_swap"]
    assert axis["kind"] == "preserving" and axis["built"] == 16
    assert axis["verified"] == sum(p["verified"] for p in mine) > 0
    assert preserving_axes(Pairs.from_corpus(out)) == ["paraphrase", "name_swap"]


def test_a_new_axis_gets_its_column_in_the_report(name_swap, tmp_path):
    """Detector predictions on a corpus with the new axis: the report's main table has an IVR column for it."""
    import numpy as np

    from sift.config import compose
    from sift.corpus.job import run_corpus
    from sift.evaluation.engine import ReportOptions
    from sift.evaluation.predictions import Pairs, Predictions
    from sift.evaluation.run import report_from_predictions

    out = tmp_path / "corpus"
    run_corpus(compose("corpus", [f"output_dir={out}", "n_items=8", "conditions=[base,paraphrase,name_swap]",
                                  "source.families=[gpt2]", "source.audit_seeds=1", "source.chunk_items=8"]),
               progress=False)
    traces = [t for t in map(json.loads, (out / "traces.jsonl").read_text().splitlines()) if t["phi"] is not None]
    rng = np.random.default_rng(0)
    label = np.array([t["phi"] for t in traces])
    preds = [Predictions("toy", seed, "test", 0.5, np.array([t["trace_id"] for t in traces]),
                         np.array([t["base_item"] for t in traces]), np.array([t["domain"] for t in traces]),
                         np.array([t["model"] for t in traces]), np.array([t["condition"] for t in traces]),
                         label, np.clip(0.25 + 0.5 * label + rng.normal(0, 0.2, label.size), 0, 1))
             for seed in (0, 1)]
    report_from_predictions(preds, Pairs.from_corpus(out), tmp_path / "report", ReportOptions.of(n_resamples=5))
    table = json.loads((tmp_path / "report" / "results.json").read_text())["main_table"]
    assert "name_swap" in table["axes"]
    assert "name_swap" in (tmp_path / "report" / "report.md").read_text()
