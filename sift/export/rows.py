"""The rows every export writes: one per trace of a corpus, one per (run, trace) of a job's predictions.

A job folder (``sift-faithshift``'s ``paths.output_dir``) holds the corpus (``corpus/``) and the runs' index
(``runs/index.json``: each run's predictions files; a main run's ``results.json`` holds the DataModule settings
that give the splits). A bare corpus folder gives the trace rows alone, without splits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sift.errors import SiftError

#: the columns of a trace row, in order (docs/exports.md describes each)
TRACE_COLUMNS = ("trace_id", "base_item", "domain", "model", "family", "condition", "split", "prompt", "cot",
                 "answer", "gold_answer", "correct", "cue_value", "cue_format", "phi", "reason", "cot_necessary",
                 "intended_phi", "matched_slice", "interventions")
#: the columns of a prediction row
PREDICTION_COLUMNS = ("run", "detector", "seed", "split", "trace_id", "base_item", "domain", "model", "condition",
                      "label", "prob", "verdict", "threshold")


@dataclass(frozen=True)
class Source:
    """What to export: the corpus folder, and the job folder around it when there is one."""

    corpus_dir: Path
    job_dir: Path | None = None

    @classmethod
    def of(cls, path: str | Path) -> Source:
        """A job folder (it holds ``corpus/traces.jsonl``) or a corpus folder (it holds ``traces.jsonl``)."""
        p = Path(path)
        if (p / "corpus" / "traces.jsonl").is_file():
            return cls(p / "corpus", p)
        if (p / "traces.jsonl").is_file():
            return cls(p, None)
        raise SiftError(f"{p}: neither a sift-faithshift output folder (corpus/traces.jsonl) nor a corpus folder "
                        "(traces.jsonl)")

    @property
    def name(self) -> str:
        return (self.job_dir or self.corpus_dir).resolve().name


def _data_settings(job_dir: Path) -> dict[str, Any] | None:
    """The DataModule settings a main run of the job trained with (its ``results.json`` config: split seed,
    fractions, calibration share, held-out domain); None before any main run finished."""
    index = job_dir / "runs" / "index.json"
    if not index.is_file():
        return None
    for run in json.loads(index.read_text()):
        res = job_dir / "runs" / run["key"] / "results.json"
        if run.get("group") == "main" and res.is_file():
            return (json.loads(res.read_text()).get("config") or {}).get("data")
    return None


def trace_splits(records: list[dict], job_dir: Path | None) -> dict[str, str | None]:
    """trace_id → the DataModule split of its base item (train / val / calib / test, ``transfer`` for a held-out
    domain's traces), as the job's main runs made it (:func:`sift.trajectories.splits.item_splits` with their
    data settings); None for every trace of a bare corpus or a job without a finished main run."""
    data = _data_settings(job_dir) if job_dir is not None else None
    if data is None:
        return {r["trace_id"]: None for r in records}
    from sift.trajectories.splits import item_splits

    holdout = data.get("holdout_domain")
    items = [r["base_item"] for r in records if r["domain"] != holdout]
    split = item_splits(items, int(data["seed"]), tuple(data["split"]), float(data.get("calib_fraction", 0.0)))
    of_item = {it: name for name, its in split.items() for it in its}
    return {r["trace_id"]: "transfer" if r["domain"] == holdout else of_item.get(r["base_item"]) for r in records}


def read_traces(corpus_dir: Path) -> list[dict]:
    from sift.corpus.store import read_jsonl

    return read_jsonl(corpus_dir / "traces.jsonl")


def trace_row(r: dict, split: str | None) -> dict[str, Any]:
    """One trace as a flat row: text, answer, label and reason, and every intervention's result as JSON."""
    v = dict(r.get("verification") or {})
    reason = v.pop("reason", None)
    v.pop("rule", None)
    cue = r.get("cue") or {}
    return {"trace_id": str(r["trace_id"]), "base_item": str(r["base_item"]), "domain": str(r["domain"]),
            "model": str(r.get("model")), "family": str(r.get("family")), "condition": str(r["condition"]),
            "split": split, "prompt": str(r.get("prompt") or ""), "cot": str(r.get("cot") or ""),
            "answer": None if r.get("answer") is None else str(r["answer"]),
            "gold_answer": None if r.get("gold_answer") is None else str(r["gold_answer"]),
            "correct": bool(r.get("correct")), "cue_value": None if cue.get("value") is None else str(cue["value"]),
            "cue_format": cue.get("format"), "phi": r.get("phi"), "reason": reason,
            "cot_necessary": r.get("cot_necessary"), "intended_phi": r.get("intended_phi"),
            "matched_slice": bool(r.get("matched_slice")),
            "interventions": json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)}


def trace_rows(src: Source) -> list[dict[str, Any]]:
    records = read_traces(src.corpus_dir)
    splits = trace_splits(records, src.job_dir)
    return [trace_row(r, splits[r["trace_id"]]) for r in records]


def runs(src: Source) -> list[dict[str, Any]]:
    """The job's runs (``runs/index.json``); none for a corpus folder or a job whose training has not run."""
    if src.job_dir is None or not (src.job_dir / "runs" / "index.json").is_file():
        return []
    return json.loads((src.job_dir / "runs" / "index.json").read_text())


def prediction_rows(src: Source) -> Iterator[dict[str, Any]]:
    """Every run's predictions, one row per (run, split, trace)."""
    from sift.evaluation.predictions import Predictions

    for run in runs(src):
        for split, path in sorted((run.get("predictions") or {}).items()):
            p = Predictions.load(path if Path(path).is_absolute() else src.job_dir / path)
            verdict = p.verdict
            for i in range(len(p)):
                yield {"run": run["key"], "detector": p.detector, "seed": p.seed, "split": split,
                       "trace_id": str(p.trace_id[i]), "base_item": str(p.base_item[i]), "domain": str(p.domain[i]),
                       "model": str(p.model[i]), "condition": str(p.condition[i]), "label": int(p.label[i]),
                       "prob": float(p.prob[i]), "verdict": int(verdict[i]), "threshold": float(p.threshold)}


__all__ = ["PREDICTION_COLUMNS", "Source", "TRACE_COLUMNS", "prediction_rows", "runs", "trace_row", "trace_rows",
           "trace_splits"]
