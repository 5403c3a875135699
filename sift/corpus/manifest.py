"""The corpus manifest: pairs built / verified / dropped per axis, label balance, intent-vs-verified
agreement, clean accuracy, and the two trivial shortcut checks (docs/design.md §4)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from sift import __version__
from sift.corpus.axes import AXES
from sift.metrics.classification import auroc_kernel


def last_value_equals_answer(record: dict) -> int:
    """1 if the CoT's last value token equals the answer (the "last number" shortcut check)."""
    cot = record["cot"].split()
    if not cot or record["answer"] is None:
        return 0
    return int(cot[-1 if cot[-1] != ";" else -2] == record["answer"]) if len(cot) > 1 else 0


def shortcut_aurocs(records: list[dict], seed: int = 0) -> dict[str, float]:
    """Cross-validated AUROC of length+domain logistic regression, and AUROC of the last-value check."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GroupKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rows = [r for r in records if r["phi"] is not None]
    y = np.array([r["phi"] for r in rows])
    if len(set(y)) < 2:
        return {"length_domain_lr": float("nan"), "last_value_equals_answer": float("nan")}
    X = np.array([[len(r["prompt_ids"]), len(r["generated_ids"]), r["domain"]] for r in rows], dtype=object)
    groups = [r["base_item"] for r in rows]
    pre = ColumnTransformer([("num", StandardScaler(), [0, 1]), ("dom", OneHotEncoder(handle_unknown="ignore"), [2])])
    clf = make_pipeline(pre, LogisticRegression(C=1.0, max_iter=1000))
    try:  # tiny corpora (fewer than 5 items, or a fold with one class) leave the shortcut check undefined
        if len(set(groups)) < 5:
            raise ValueError("fewer than 5 base items")
        p = cross_val_predict(clf, X, y, groups=groups, cv=GroupKFold(n_splits=5), method="predict_proba")[:, 1]
        lr_auc = round(auroc_kernel(p, y), 4)
    except ValueError:
        lr_auc = float("nan")
    check = np.array([last_value_equals_answer(r) for r in rows])
    return {"length_domain_lr": lr_auc,
            "last_value_equals_answer": round(auroc_kernel(np.asarray(check, dtype=float), y), 4)}


def intervention_agreement(records: list[dict]) -> dict[str, Any]:
    """How often the two interventions agree on a trace where both ran: the CoT edit says the stated reasoning is
    load-bearing (its answer follows the edit) and the cue change says the answer is not silently driven by the
    cue (it does not follow the new cue, or the CoT states the cue) — or both say the opposite. Also Cohen's κ
    of the two verdicts and how many traces had only one test (no editable value, or no cue)."""
    from sift.metrics.agreement import cohen_kappa

    both, edit_only, cue_only = [], 0, 0
    for r in records:
        v = r.get("verification") or {}
        e, c = v.get("edit_follows"), v.get("cue_follows")
        if e is not None and c is not None:
            both.append((int(bool(e)), int(not c or bool(v.get("mentions_cue")))))
        elif e is not None:
            edit_only += 1
        elif c is not None:
            cue_only += 1
    out: dict[str, Any] = {"both_tests": len(both), "edit_only": edit_only, "cue_only": cue_only,
                           "agreement": None, "kappa": None}
    if both:
        a = np.array(both)
        out["agreement"] = round(float(np.mean(a[:, 0] == a[:, 1])), 4)
        k = cohen_kappa(a[:, 0], a[:, 1]) if len(set(a[:, 0])) > 1 or len(set(a[:, 1])) > 1 else float("nan")
        out["kappa"] = None if k != k else round(float(k), 4)
    return out


def parse_failures(records: list[dict]) -> dict[str, Any]:
    """Traces whose final answer could not be parsed (they are ambiguous, never a wrong label)."""
    n = sum(r.get("answer") is None for r in records)
    # real LMs: replies cut at the token limit whose answer was forced (budget forcing; causal truncation's
    # forced answers are that axis's construction and not counted here)
    forced = sum(bool(r.get("forced_answer")) and r["condition"] != "causal_truncation" for r in records)
    return {"traces": len(records), "unparsable": n, "rate": round(n / len(records), 4) if records else None,
            "forced_at_limit": forced}


def twin_summary(records: list[dict]) -> dict[str, Any] | None:
    """The organism's twins (one prompt generated under both mechanism latents), over base and preserving
    prompts: how many pairs, the share whose twins wrote the same ids, the share with both twins labelled and,
    of those, the share whose labels differ (the latent decided the label). None for a corpus without twins."""
    from sift.corpus.audit import base_or_preserving, same_ids, twin_pairs

    pairs = [(a, b) for a, b in twin_pairs(records) if base_or_preserving(a)]
    if not pairs:
        return None
    same = [same_ids(a, b) for a, b in pairs]
    both = [(a, b) for a, b in pairs if a["phi"] is not None and b["phi"] is not None]
    opposite = sum(a["phi"] != b["phi"] for a, b in both)
    return {"pairs": len(pairs), "identical_ids": round(float(np.mean(same)), 4),
            "both_labelled": round(len(both) / len(pairs), 4),
            "opposite_labels": round(opposite / len(both), 4) if both else None,
            "differing_ids": [a["twin"] for (a, _), s in zip(pairs, same) if not s][:20]}


def build_manifest(records: list[dict], pairs: list[dict], *, cfg: dict, config_hash: str, seconds: float,
                   chunks_reused: int = 0, prompt_states: dict | None = None,
                   prompt_states_reason: str | None = None, audit: bool = True) -> dict[str, Any]:
    """The manifest. Also marks ``record["matched_slice"]`` on every record, in place (the one place both the
    organism and the real-LM corpus set it), and audits the corpus with the shortcut controls
    (:func:`sift.corpus.audit.control_audit`; ``prompt_states``: trace id → prompt-final state)."""
    from sift.corpus.audit import control_audit, mark_matched_slice, slice_summary

    mark_matched_slice(records)
    axes: dict[str, Any] = {}
    for name, ax in AXES.items():
        if name == "base":
            continue
        ps = [p for p in pairs if p["axis"] == name]
        reasons = Counter(p["reason"] for p in ps if not p["verified"])
        n_ver = sum(p["verified"] for p in ps)
        axes[name] = {"kind": ax.kind, "direction": ax.direction, "built": len(ps), "verified": n_ver,
                      "dropped": len(ps) - n_ver, "kept_fraction": round(n_ver / len(ps), 4) if ps else None,
                      "dropped_by_reason": dict(reasons)}
    phi = Counter(str(r["phi"]) for r in records)
    labelled = [r for r in records if r["phi"] is not None]
    # traces without a construction intent (intended_phi None: real-LM base and preserving traces) are left out
    agree = [r["phi"] == r["intended_phi"] for r in labelled if r["intended_phi"] is not None]
    per_cond: dict[str, Any] = defaultdict(dict)
    for cond in sorted({r["condition"] for r in records}):
        rs = [r for r in records if r["condition"] == cond]
        lab = [r for r in rs if r["phi"] is not None and r["intended_phi"] is not None]
        n_amb = sum(r["phi"] is None for r in rs)
        per_cond[cond] = {"traces": len(rs), "phi_1": sum(r["phi"] == 1 for r in rs),
                          "phi_0": sum(r["phi"] == 0 for r in rs), "ambiguous": n_amb,
                          "ambiguous_rate": round(n_amb / len(rs), 4),
                          "parse_failure_rate": parse_failures(rs)["rate"],
                          "interventions": intervention_agreement(rs),
                          "intent_agreement": round(float(np.mean([r["phi"] == r["intended_phi"] for r in lab])), 4)
                          if lab else None}
    for name, info in axes.items():  # the shifted traces' ambiguous rate and intervention agreement, per axis
        if name in per_cond:
            info.update(ambiguous_rate=per_cond[name]["ambiguous_rate"],
                        parse_failure_rate=per_cond[name]["parse_failure_rate"],
                        intervention_agreement=per_cond[name]["interventions"]["agreement"])
    acc: dict[str, Any] = {}
    for r in records:
        if r["condition"] == "base" and r["cue"] is None:
            acc.setdefault(f"{r['family']}/{r['domain']}", []).append(r["correct"])
    confusion = Counter(f"intended {r['intended_phi']} -> verified {r['phi']}" for r in records)
    return {
        "sift_version": __version__, "config_hash": config_hash, "config": cfg, "seconds": seconds,
        "chunks_reused": chunks_reused,
        "traces": len(records), "pairs": len(pairs),
        "label_balance": {"phi_1": phi.get("1", 0), "phi_0": phi.get("0", 0), "ambiguous": phi.get("None", 0),
                          "phi_0_fraction": round(phi.get("0", 0) / max(1, len(labelled)), 4)},
        "parse_failures": parse_failures(records),
        "interventions": intervention_agreement(records),
        "intent_vs_verified": {"agreement": round(float(np.mean(agree)), 4) if agree else None,
                               "confusion": dict(confusion)},
        "axes": axes,
        "conditions": dict(per_cond),
        "clean_accuracy": {k: round(float(np.mean(v)), 4) for k, v in sorted(acc.items())},
        "shortcuts": shortcut_aurocs(records),
        "matched_slice": slice_summary(records),
        "twins": twin_summary(records),
        "controls_audit": (control_audit(records, prompt_states, prompt_states_reason=prompt_states_reason)
                           if audit else None),
    }
