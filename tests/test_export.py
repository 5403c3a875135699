"""Exports round-trip through their own readers (sift.export): datasets.load_from_disk and Parquet for the corpus
and predictions, inspect_ai.log.read_eval_log for the eval log; every field compared with the corpus."""

import json

import numpy as np
import pytest

from sift.errors import SiftError
from sift.evaluation.predictions import Predictions
from sift.export import export
from sift.export.rows import PREDICTION_COLUMNS, TRACE_COLUMNS, trace_row
from sift.trajectories.splits import item_splits

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A job folder: a toy corpus and one main run (its DataModule settings and its test predictions)."""
    from sift.corpus.store import read_jsonl
    from sift.trajectories.toy import write_toy_corpus

    root = tmp_path_factory.mktemp("job")
    write_toy_corpus(root / "corpus", n_items=8)
    records = read_jsonl(root / "corpus" / "traces.jsonl")
    test_items = item_splits([r["base_item"] for r in records], 3, (0.5, 0.25, 0.25))["test"]
    test = [r for r in records if r["base_item"] in test_items]
    rng = np.random.default_rng(0)
    p = Predictions("sift", 1, "test", 0.4, np.array([r["trace_id"] for r in test]),
                    np.array([r["base_item"] for r in test]), np.array([r["domain"] for r in test]),
                    np.array([r["model"] for r in test]), np.array([r["condition"] for r in test]),
                    np.array([int(r["phi"] or 0) for r in test]), rng.random(len(test)))
    path = p.save(root / "runs" / "sift-s1" / "predictions" / "test.npz")
    (root / "runs" / "index.json").write_text(json.dumps([{"key": "sift-s1", "group": "main", "detector": "sift",
                                                            "seed": 1, "predictions": {"test": str(path)}}]))
    # the run's DataModule settings (a main run's results.json): they give every trace's split
    data = {"seed": 3, "split": [0.5, 0.25, 0.25], "calib_fraction": 0.0, "holdout_domain": None}
    (root / "runs" / "sift-s1" / "results.json").write_text(json.dumps({"config": {"data": data}}))
    return root, records, p, test_items


def test_hf_datasets_round_trip_every_field(job):
    root, records, p, test_items = job
    got = export(root, root / "export", formats=("hf",))
    assert got["hf"]["corpus"]["rows"] == len(records) and got["hf"]["predictions"]["rows"] == len(p)
    corpus = datasets.load_from_disk(str(root / "export" / "corpus"))
    assert corpus.column_names == list(TRACE_COLUMNS) and len(corpus) == len(records)
    for rec, row in zip(records, corpus):
        split = "test" if rec["base_item"] in test_items else row["split"]
        assert row == trace_row(rec, split)  # every field, the interventions as JSON
        v = {k: x for k, x in rec["verification"].items() if k not in ("reason", "rule")}
        assert json.loads(row["interventions"]) == json.loads(json.dumps(v, default=str))
    assert {r["split"] for r in corpus} == {"train", "val", "test"}
    parquet = datasets.Dataset.from_parquet(str(root / "export" / "corpus.parquet"))
    assert parquet.to_list() == corpus.to_list()
    preds = datasets.load_from_disk(str(root / "export" / "predictions"))
    assert preds.column_names == list(PREDICTION_COLUMNS)
    assert preds["trace_id"] == p.trace_id.tolist() and preds["prob"] == pytest.approx(p.prob.tolist())
    assert preds["verdict"] == p.verdict.tolist() and set(preds["run"]) == {"sift-s1"} and set(preds["seed"]) == {1}
    assert preds["label"] == p.label.tolist() and preds["threshold"] == [0.4] * len(p)


def test_inspect_log_round_trip(job):
    log = pytest.importorskip("inspect_ai.log")
    root, records, p, _ = job
    got = export(root, root / "export_inspect", formats=("inspect",))
    ev = log.read_eval_log(str(root / "export_inspect" / got["inspect"]["log"]))
    assert ev.status == "success" and len(ev.samples) == len(records) == ev.eval.dataset.samples
    pred = {t: (pr, v) for t, pr, v in zip(p.trace_id.tolist(), p.prob.tolist(), p.verdict.tolist())}
    samples = {s.id: s for s in ev.samples}
    assert len(samples) == len(records)
    for rec in records:
        s = samples[rec["trace_id"]]
        assert s.id == rec["trace_id"] and s.input == rec["prompt"] and s.target == rec["gold_answer"]
        assert s.scores["phi_star"].value == ("ambiguous" if rec["phi"] is None else rec["phi"])
        assert s.scores["phi_star"].explanation == rec["verification"]["reason"]
        v = {k: x for k, x in rec["verification"].items() if k not in ("reason", "rule")}
        assert s.metadata["interventions"] == json.loads(json.dumps(v, default=str))
        assert s.metadata["condition"] == rec["condition"] and s.metadata["domain"] == rec["domain"]
        assert s.output.completion.startswith(rec["cot"]) and s.messages[0].text == rec["prompt"]
        if rec["trace_id"] in pred:
            prob, verdict = pred[rec["trace_id"]]
            assert s.scores["sift-s1"].value == pytest.approx(prob) and s.scores["sift-s1"].answer == str(verdict)
        else:
            assert "sift-s1" not in s.scores


def test_a_failed_export_leaves_nothing_behind(job, tmp_path):
    root, *_ = job
    with pytest.raises(SiftError, match="neither a sift-faithshift output folder"):
        export(tmp_path, tmp_path / "out")
    with pytest.raises(SiftError, match="export formats"):
        export(root, tmp_path / "out", formats=("csv",))
    bad = tmp_path / "badjob"
    bad.mkdir()
    (bad / "corpus").symlink_to(root / "corpus")
    (bad / "runs").mkdir()
    (bad / "runs" / "index.json").write_text(json.dumps([{"key": "x", "predictions": {"test": str(tmp_path)}}]))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("kept")
    with pytest.raises(SiftError, match="not a sift predictions file"):
        export(bad, tmp_path / "out", formats=("hf",))
    assert [f.name for f in (tmp_path / "out").iterdir()] == ["old.txt"]  # the old export stands
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".out.")]  # no temporary folder left


def test_the_command(job, capsys):
    from sift.cli.export import main

    root, records, *_ = job
    assert main([str(root / "corpus"), "--out", str(root / "cli"), "--formats", "hf"]) == 0
    assert f"corpus: {len(records)} rows" in capsys.readouterr().out
    corpus = datasets.load_from_disk(str(root / "cli" / "corpus"))
    assert corpus["split"] == [None] * len(records)  # a bare corpus has no job, hence no splits
    assert main([str(root / "nothing")]) == 2
