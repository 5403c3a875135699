"""A corpus as an Inspect AI eval log (``pip install ".[export]"``): each trace a sample, browsable with
``inspect view`` and readable with ``inspect_ai.log.read_eval_log``.

Per sample: ``input`` the prompt, ``target`` the gold answer, ``messages`` the prompt and the model's reply (CoT
and answer), ``output`` the reply; ``scores``: ``phi_star`` (1 / 0, or ``"ambiguous"``; the label's reason and rule
as the explanation), ``cot_necessary`` where the corpus records it, and every run's verdict on the trace
(``<run key>``: the detector's probability as the value, its thresholded verdict as the answer); ``metadata``: the
trace's ids, condition, cue, split and every intervention's result.
"""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from sift import __version__
from sift.errors import SiftError
from sift.export.rows import Source, prediction_rows, trace_rows


def _inspect():
    try:
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
    except ImportError as e:
        raise SiftError("the Inspect export needs inspect-ai: pip install \"sift[export]\" "
                        "(or pip install inspect-ai)") from e
    return log, model, scorer


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def eval_log(src: Source) -> Any:
    """The :class:`inspect_ai.log.EvalLog` of a corpus (and its job's runs)."""
    log, model, scorer = _inspect()
    rows = trace_rows(src)
    verdicts: dict[str, dict[str, dict]] = defaultdict(dict)
    for p in prediction_rows(src):
        verdicts[p["trace_id"]][p["run"]] = p
    samples, phis = [], []
    for r in rows:
        reply = r["cot"] + (f"Answer: {r['answer']}" if r["answer"] is not None else "")
        interventions = json.loads(r["interventions"])
        scores = {"phi_star": scorer.Score(value="ambiguous" if r["phi"] is None else int(r["phi"]),
                                           answer=r["answer"], explanation=r["reason"])}
        if r["cot_necessary"] is not None:
            scores["cot_necessary"] = scorer.Score(value=int(r["cot_necessary"]))
        for run, p in sorted(verdicts[r["trace_id"]].items()):
            scores[run] = scorer.Score(value=p["prob"], answer=str(p["verdict"]),
                                       explanation=f"{p['detector']} seed {p['seed']}, {p['split']} split, "
                                                   f"threshold {p['threshold']:.4f}")
        if r["phi"] is not None:
            phis.append(float(r["phi"]))
        samples.append(log.EvalSample(
            id=r["trace_id"], epoch=1, input=r["prompt"], target=r["gold_answer"] or "",
            messages=[model.ChatMessageUser(content=r["prompt"]), model.ChatMessageAssistant(content=reply)],
            output=model.ModelOutput.from_content(model=r["model"], content=reply), scores=scores,
            metadata={k: r[k] for k in ("base_item", "domain", "model", "family", "condition", "split", "cue_value",
                                        "cue_format", "correct", "matched_slice", "intended_phi", "reason")}
            | {"interventions": interventions}))
    models = sorted({r["model"] for r in rows})
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    spec = log.EvalSpec(created=created, task=f"sift/{src.name}", dataset=log.EvalDataset(
        name=src.name, location=str(src.corpus_dir), samples=len(samples)), model=",".join(models),
        config=log.EvalConfig(), metadata={"sift_version": __version__, "models": models,
                                            "manifest": str(src.corpus_dir / "manifest.json")})
    results = log.EvalResults(total_samples=len(samples), completed_samples=len(samples), scores=[
        log.EvalScore(name="phi_star", scorer="sift_verified_label",
                      metrics={"mean": log.EvalMetric(name="mean", value=_mean(phis))},
                      metadata={"labelled": len(phis), "ambiguous": len(samples) - len(phis)})])
    # no evaluation ran here: the log's start and end are the export's time (Inspect shows a duration of 0)
    return log.EvalLog(eval=spec, status="success", samples=samples, results=results,
                       stats=log.EvalStats(started_at=created, completed_at=created))


def export_inspect(src: Source, out_dir: Path) -> dict[str, Any]:
    """``<out_dir>/<name>.eval``: the eval log of :func:`eval_log`."""
    log, _, _ = _inspect()
    ev = eval_log(src)
    path = out_dir / f"{src.name}.eval"
    log.write_eval_log(ev, str(path))
    return {"samples": len(ev.samples or []), "log": path.name}


__all__ = ["eval_log", "export_inspect"]
