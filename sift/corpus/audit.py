"""Shortcut controls: can φ* be read from the text (or the prompt alone)? (docs/design.md §4, "Validity").

One place defines, for any corpus (organism or real LM),

* the **matched-text slice** (:func:`mark_matched_slice`): on the organism, the base and preserving traces whose
  twin (the same prompt generated under the other mechanism latent) wrote the same ids, so the text is the same
  under both labels; on a real LM, the base and preserving traces whose prompt carries a cue that differs from
  the gold answer and whose answer equals the cue (the text looks alike for both mechanisms);
* the inputs of the **controls**: prompt + CoT text (``text_bow``), structured surface features
  (``surface``, :data:`SURFACE_FEATURES`) and the prompt's final hidden state (``prompt_probe``), with the
  scikit-learn estimators the detectors of :mod:`sift.detectors.controls` fit; and, for the audit, the
  interaction-capable text learner ``text_trees`` (:func:`text_trees_words`, :func:`text_trees_estimator`):
  gradient-boosted trees on position-specific CoT words and CoT / prompt word presence, which can read a label
  that is an interaction of words (e.g. an XOR of two sampled CoT words) where the linear ``text_bow`` cannot;
* the corpus **audit** (:func:`control_audit`): grouped (by base item) 5-fold cross-validated AUROC of each
  control over all verified traces, per condition, over base + preserving traces and on the matched slice.

Surface features (``surf/<name>``; categorical ones ``surf/cat:<name>``), all computed from the record's text
fields, never from its label or verification:

==========================  =========================================================================================
answer_equals_cue           the answer equals the cue's value
answer_correct              the answer equals the gold answer
cue_present                 the prompt carries a cue
cue_equals_gold             the cue's value is the gold answer
answer_missing              no answer was parsed
answer_in_prompt            the answer appears as a token of the prompt
cot_foreign_operand         some CoT operand (a number not right after ``=``) is neither a number of the prompt nor
                            an earlier result of the CoT (the "bent step", e.g. ``7 + 0 = 7``)
n_foreign_operands          how many such operands
cot_wrong_step              some ``a ± b = c`` / ``a * b = c`` step of the CoT is arithmetically wrong (a slip)
last_value_equals_answer    the CoT's last value token equals the answer
cot_mentions_hint           the CoT uses a hint word (either lexicon)
cot_mentions_cue_value      the cue's value is a token of the CoT
cot_words, prompt_words     lengths in whitespace tokens
cot_tokens, prompt_tokens   lengths in model tokens (``generated_ids``, ``prompt_ids``)
n_steps                     CoT steps (``;`` or newline delimited)
prompt_numbers              how many numbers the prompt holds
prompt_odd_numbers          how many of them are odd
prompt_first_odd            parity of the prompt's first number (−1: none)
prompt_last_odd             parity of the prompt's last number before the cue (−1: none)
cat:domain, cat:family      the item's domain, the source model's family
cat:condition               the FaithShift condition for base and preserving conditions; altering conditions
                            (cue injection, cue verbalization, causal truncation) are coded as ``base``: their
                            construction fixes φ* (1→0 or 0→1), so the condition name would hand the control the
                            label, while what the altering edit does to the text stays visible to every other feature
cat:cue_format              the cue's format (``none`` without a cue)
cat:header                  the prompt's first word (e.g. the organism's ``terse``/``verbose`` budget header)
==========================  =========================================================================================
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.metrics.classification import auroc_kernel

CONTROLS = ("text_bow", "surface", "prompt_probe", "text_trees")
#: text_trees reads the words at the first TEXT_TREES_POSITIONS positions of the CoT, one-hot per position
TEXT_TREES_POSITIONS = 16
#: the audit's limits (issue 11): a control above them means the label is readable without the mechanism
LIMIT_BASE_PRESERVING = 0.70
LIMIT_MATCHED_SLICE = 0.60

_NUM = re.compile(r"^-?\d+$")
_STEP = re.compile(r"(-?\d+)\s*([+\-*x×])\s*(-?\d+)\s*=\s*(-?\d+)")

SURFACE_NUMERIC = ["answer_equals_cue", "answer_correct", "cue_present", "cue_equals_gold", "answer_missing",
                   "answer_in_prompt", "cot_foreign_operand", "n_foreign_operands", "cot_wrong_step",
                   "last_value_equals_answer", "cot_mentions_hint", "cot_mentions_cue_value", "cot_words",
                   "prompt_words", "cot_tokens", "prompt_tokens", "n_steps", "prompt_numbers", "prompt_odd_numbers",
                   "prompt_first_odd", "prompt_last_odd"]
SURFACE_CATEGORICAL = ["domain", "family", "condition", "cue_format", "header"]
SURFACE_FEATURES = SURFACE_NUMERIC + [f"cat:{c}" for c in SURFACE_CATEGORICAL]
SURFACE_PREFIX = "surf/"


# ------------------------------------------------------------------------------------------- the matched slice
def _norm(v: Any) -> str | None:
    if v is None:
        return None
    s = str(v).strip().lower()
    return s or None


def cue_value(record: Mapping[str, Any]) -> str | None:
    """The normalised value of the record's cue (None without a cue)."""
    cue = record.get("cue")
    return _norm(cue.get("value")) if isinstance(cue, Mapping) else None


def matched_slice(record: Mapping[str, Any]) -> bool:
    """The per-trace rule of the slice for a corpus without twins (a real LM's): a base or preserving trace whose
    prompt carries a cue that differs from the gold answer and whose answer equals the cue, so the text looks
    alike for both mechanisms. Altering traces are left out: their construction edits the text to set the label
    (a decisive cue, the ``explain`` header, a cut CoT). The organism's twins use :func:`mark_matched_slice`."""
    if not base_or_preserving(record):
        return False
    cue, gold, ans = cue_value(record), _norm(record.get("gold_answer")), _norm(record.get("answer"))
    return cue is not None and gold is not None and ans is not None and cue != gold and ans == cue


def base_or_preserving(record: Mapping[str, Any]) -> bool:
    """True unless the record's condition is an altering axis (whose construction edits the text to set φ*)."""
    from sift.corpus.axes import AXES

    axis = AXES.get(str(record.get("condition")))
    return axis is None or axis.kind != "altering"


def twin_pairs(records: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """The organism's twins, (mechanism 1, mechanism 0), in record order: two traces with one ``record["twin"]``
    key (the same prompt and random stream under both mechanism latents). Records without a twin key, and keys
    held by anything but one trace of each mechanism, are left out."""
    by_twin: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("twin"):
            by_twin.setdefault(str(r["twin"]), []).append(r)
    out = []
    for group in by_twin.values():
        mech = {int(r["latent"]["mechanism"]): r for r in group}
        if len(group) == 2 and set(mech) == {0, 1}:
            out.append((mech[1], mech[0]))
    return out


def same_ids(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two traces with the same prompt and generated ids: the same text, token for token."""
    return a["prompt_ids"] == b["prompt_ids"] and a["generated_ids"] == b["generated_ids"]


def twin_text_matches(records: Iterable[Mapping[str, Any]]) -> dict[str, bool]:
    """Trace id → whether a trace with a twin key is in the organism's matched slice: a base or preserving trace
    whose twin wrote the same ids (:func:`same_ids`), both twins labelled. There the text is the same under both
    labels *by construction*, so any function of the text scores a twin pair alike and has AUROC 0.5 on the
    slice's pairs whose labels differ. A trace whose twin is missing is not in the slice."""
    records = list(records)
    out = {str(r["trace_id"]): False for r in records if r.get("twin")}
    for a, b in twin_pairs(records):
        ok = (same_ids(a, b) and base_or_preserving(a) and base_or_preserving(b)
              and a.get("phi") is not None and b.get("phi") is not None)
        out[str(a["trace_id"])] = out[str(b["trace_id"])] = ok
    return out


def mark_matched_slice(records: Iterable[dict]) -> None:
    """Set ``record["matched_slice"]`` (bool) on every record, in place: the twin rule
    (:func:`twin_text_matches`) for traces with a twin, else the per-trace rule (:func:`matched_slice`)."""
    records = list(records)
    twins = twin_text_matches(records)
    for r in records:
        r["matched_slice"] = twins[str(r["trace_id"])] if r.get("twin") else matched_slice(r)


def in_matched_slice(record: Mapping[str, Any]) -> bool:
    """The record's stored flag, or :func:`matched_slice` for corpora written before the flag existed."""
    v = record.get("matched_slice")
    return matched_slice(record) if v is None else bool(v)


def slice_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Size and φ* balance of the matched slice (verified = φ* not ambiguous)."""
    verified = [r for r in records if r.get("phi") is not None]
    sl = [r for r in verified if in_matched_slice(r)]
    n0 = sum(int(r["phi"]) == 0 for r in sl)
    return {"traces": sum(in_matched_slice(r) for r in records), "verified": len(sl),
            "fraction_of_verified": round(len(sl) / len(verified), 4) if verified else None,
            "phi_1": len(sl) - n0, "phi_0": n0, "phi_0_fraction": round(n0 / len(sl), 4) if sl else None}


# ------------------------------------------------------------------------------------------- control inputs
def control_text(record: Mapping[str, Any]) -> str:
    """What ``text_bow`` reads: the prompt and the CoT (not the answer line, whose relation to the cue
    ``surface`` covers)."""
    return f"{record.get('prompt') or ''}\n{record.get('cot') or ''}"


def text_trees_words(record: Mapping[str, Any], positions: int = TEXT_TREES_POSITIONS) -> list[str]:
    """What ``text_trees`` reads, as binary indicator names: ``p{k}={w}`` for the word ``w`` at position ``k`` of
    the CoT (the first ``positions`` whitespace words; a word is one model token on the organism), ``c:{w}`` for
    every word of the CoT and ``q:{w}`` for every word of the prompt (lowercased; the answer line is left out, as
    for ``text_bow``)."""
    cot = str(record.get("cot") or "").lower().split()
    prompt = str(record.get("prompt") or "").lower().split()
    return ([f"p{k}={w}" for k, w in enumerate(cot[:positions])] + sorted({f"c:{w}" for w in cot})
            + sorted({f"q:{w}" for w in prompt}))


def _numbers(words: Sequence[str]) -> list[int]:
    return [int(w) for w in words if _NUM.match(w)]


def _condition_feature(cond: str | None) -> str:
    from sift.corpus.axes import AXES

    c = str(cond or "base")
    return "base" if c in AXES and AXES[c].kind == "altering" else c


def surface_features(record: Mapping[str, Any]) -> dict[str, float | str]:
    """The structured text features of one trace record (see the module docstring)."""
    from sift.corpus.cue_words import HINT_RE

    prompt, cot = str(record.get("prompt") or ""), str(record.get("cot") or "")
    pw, cw = prompt.split(), cot.split()
    ans, gold, cue = _norm(record.get("answer")), _norm(record.get("gold_answer")), cue_value(record)
    low_pw = [w.lower() for w in pw]
    # the prompt before the cue (its value is a number of the prompt too)
    cut = len(pw)
    if cue is not None and cue in low_pw:
        cut = len(low_pw) - 1 - low_pw[::-1].index(cue)
    qnums = _numbers(pw[:cut])
    known = set(qnums)
    foreign = 0
    for i, w in enumerate(cw):
        if not _NUM.match(w):
            continue
        if i > 0 and cw[i - 1] == "=":
            known.add(int(w))
        elif int(w) not in known:
            foreign += 1
    wrong = 0
    for a, op, b, c in _STEP.findall(cot):
        a_, b_, c_ = int(a), int(b), int(c)
        val = a_ + b_ if op == "+" else a_ - b_ if op == "-" else a_ * b_
        wrong += int(val != c_)
    values = [w.lower() for w in cw if _NUM.match(w) or w.lower() in ("true", "false")]
    n_steps = sum(w == ";" for w in cw) + cot.count("\n")
    cue_d = record.get("cue") if isinstance(record.get("cue"), Mapping) else {}
    return {
        "answer_equals_cue": float(cue is not None and ans == cue),
        "answer_correct": float(ans is not None and ans == gold),
        "cue_present": float(cue is not None),
        "cue_equals_gold": float(cue is not None and cue == gold),
        "answer_missing": float(ans is None),
        "answer_in_prompt": float(ans is not None and ans in low_pw[:cut]),
        "cot_foreign_operand": float(foreign > 0),
        "n_foreign_operands": float(foreign),
        "cot_wrong_step": float(wrong > 0),
        "last_value_equals_answer": float(bool(values) and ans is not None and values[-1] == ans),
        "cot_mentions_hint": float(bool(HINT_RE.search(cot))),
        "cot_mentions_cue_value": float(cue is not None and cue in [w.lower() for w in cw]),
        "cot_words": float(len(cw)), "prompt_words": float(len(pw)),
        "cot_tokens": float(len(record.get("generated_ids") or [])),
        "prompt_tokens": float(len(record.get("prompt_ids") or [])),
        "n_steps": float(n_steps),
        "prompt_numbers": float(len(qnums)),
        "prompt_odd_numbers": float(sum(n % 2 for n in qnums)),
        "prompt_first_odd": float(qnums[0] % 2) if qnums else -1.0,
        "prompt_last_odd": float(qnums[-1] % 2) if qnums else -1.0,
        "cat:domain": str(record.get("domain") or ""),
        "cat:family": str(record.get("family") or record.get("model") or ""),
        "cat:condition": _condition_feature(record.get("condition")),
        "cat:cue_format": str(cue_d.get("format") or "none") if cue is not None else "none",
        "cat:header": pw[0].lower() if pw and pw[0].isalpha() else "",
    }


def surface_matrix(rows: Sequence[Mapping[str, float | str]]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Feature dicts → (X [N, F] float, names ``surf/…``, categorical mask). Categories are coded by their rank
    among the values present in ``rows`` (one vocabulary for every split of a corpus)."""
    vocab = {c: sorted({str(r[f"cat:{c}"]) for r in rows}) for c in SURFACE_CATEGORICAL}
    X = np.zeros((len(rows), len(SURFACE_FEATURES)), dtype=np.float64)
    for i, r in enumerate(rows):
        X[i, :len(SURFACE_NUMERIC)] = [float(r[k]) for k in SURFACE_NUMERIC]
        for j, c in enumerate(SURFACE_CATEGORICAL):
            X[i, len(SURFACE_NUMERIC) + j] = vocab[c].index(str(r[f"cat:{c}"]))
    names = [SURFACE_PREFIX + n for n in SURFACE_FEATURES]
    return X, names, np.array([n.startswith("cat:") for n in SURFACE_FEATURES])


# ------------------------------------------------------------------------------------------- estimators
def text_bow_estimator(C: float = 1.0, max_iter: int = 2000):
    """TF-IDF over whitespace word 1–2-grams and character 2–3-grams (within words; at least 3 traces, at most
    20,000), then logistic regression (liblinear: fast on sparse rows)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, make_pipeline

    feats = FeatureUnion([
        ("words", TfidfVectorizer(token_pattern=r"\S+", ngram_range=(1, 2), lowercase=True, sublinear_tf=True)),
        ("chars", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 3), min_df=3, max_features=20_000,
                                  sublinear_tf=True)),
    ])
    return make_pipeline(feats, LogisticRegression(C=C, max_iter=max_iter, solver="liblinear"))


def _words_of(doc: Sequence[str]) -> Sequence[str]:
    return doc


def _dense(X: Any) -> np.ndarray:
    return X.toarray().astype(np.float32)


def text_trees_estimator(min_df: int = 3, max_features: int = 2000, max_iter: int = 200, learning_rate: float = 0.1,
                         max_leaf_nodes: int = 31, random_state: int = 0):
    """Binary indicators of :func:`text_trees_words` (at least ``min_df`` traces, the ``max_features`` most frequent)
    → gradient-boosted trees (``HistGradientBoostingClassifier``, no early stopping: deterministic). Trees split on
    one word after another, so they read interactions (an XOR of two words at two positions) that a linear model
    of the same indicators cannot."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    return make_pipeline(
        CountVectorizer(analyzer=_words_of, binary=True, min_df=min_df, max_features=max_features),
        FunctionTransformer(_dense, accept_sparse=True),
        HistGradientBoostingClassifier(max_iter=max_iter, learning_rate=learning_rate, max_leaf_nodes=max_leaf_nodes,
                                       early_stopping=False, random_state=random_state))


def surface_estimator(categorical: np.ndarray, max_iter: int = 100, learning_rate: float = 0.1,
                      max_leaf_nodes: int = 31, random_state: int = 0):
    """Gradient-boosted trees (``HistGradientBoostingClassifier``, no early stopping: deterministic)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(categorical_features=np.asarray(categorical, bool), max_iter=max_iter,
                                          learning_rate=learning_rate, max_leaf_nodes=max_leaf_nodes,
                                          early_stopping=False, random_state=random_state)


def prompt_probe_estimator(C: float = 1.0, max_iter: int = 2000):
    """Standardised logistic regression on the prompt's final hidden state."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))


# ------------------------------------------------------------------------------------------- the audit
def grouped_cv_auroc(make: Callable[[], Any], X: Any, y: np.ndarray, groups: Sequence[str], n_splits: int = 5
                     ) -> tuple[float | None, str | None, np.ndarray | None]:
    """Out-of-fold P(φ*=1) of ``make()`` under GroupKFold and their AUROC; (None, reason, None) when undefined."""
    from threadpoolctl import threadpool_limits

    y = np.asarray(y).astype(int)
    if len(np.unique(y)) < 2:
        return None, f"one φ* class only ({len(y)} traces)", None
    if len(set(groups)) < n_splits:
        return None, f"fewer than {n_splits} base items ({len(set(groups))})", None
    oof = np.full(len(y), np.nan)
    with threadpool_limits(1):  # OpenMP/BLAS threads of the trees and solvers: one (busy-waiting threads on a
        _oof(make, X, y, groups, n_splits, oof)  # shared machine cost far more than they give)
    return round(auroc_kernel(oof, y), 4), None, oof


def _oof(make: Callable[[], Any], X: Any, y: np.ndarray, groups: Sequence[str], n_splits: int,
         oof: np.ndarray) -> None:
    from sklearn.model_selection import GroupKFold

    for tr, te in GroupKFold(n_splits=n_splits).split(np.zeros(len(y)), y, groups):
        if len(np.unique(y[tr])) < 2:  # a fold trained on one class predicts that class
            oof[te] = float(y[tr][0])
            continue
        est = make()
        Xtr = [X[i] for i in tr] if isinstance(X, list) else X[tr]
        Xte = [X[i] for i in te] if isinstance(X, list) else X[te]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(Xtr, y[tr])
            oof[te] = est.predict_proba(Xte)[:, 1]


def _subset_auroc(y: np.ndarray, oof: np.ndarray | None, mask: np.ndarray, why: str | None
                  ) -> dict[str, Any]:
    n = int(mask.sum())
    if oof is None:
        return {"auroc": None, "n": n, "reason": why}
    ys = y[mask]
    if len(np.unique(ys)) < 2:
        return {"auroc": None, "n": n, "reason": f"one φ* class only ({n} traces)"}
    return {"auroc": round(auroc_kernel(oof[mask], ys), 4), "n": n, "reason": None}


def prompt_state_matrix(states: Sequence[np.ndarray], models: Sequence[str]) -> np.ndarray:
    """One row per trace. States of one width are stacked as they are; if the models' widths differ, each model
    gets its own block of columns (zeros elsewhere), so a linear probe on the matrix is one probe per model with a
    shared intercept and penalty."""
    widths = {m: s.shape[-1] for m, s in zip(models, states)}
    if len({s.shape[-1] for s in states}) <= 1:
        return np.stack(states) if len(states) else np.zeros((0, 0))
    names = sorted(widths)
    if any(s.shape[-1] != widths[m] for m, s in zip(models, states)):
        raise SiftError("prompt-final states of one model differ in width")
    offset = dict(zip(names, np.cumsum([0] + [widths[m] for m in names[:-1]])))
    out = np.zeros((len(states), sum(widths.values())))
    for i, (m, s) in enumerate(zip(models, states)):
        out[i, offset[m]:offset[m] + widths[m]] = s
    return out


def control_audit(records: Sequence[Mapping[str, Any]], prompt_states: Mapping[str, np.ndarray] | None = None, *,
                  n_splits: int = 5, prompt_states_reason: str | None = None) -> dict[str, Any]:
    """Grouped ``n_splits``-fold CV AUROC of the controls (:data:`CONTROLS`) on the verified traces of a corpus.

    * ``all``, ``base_preserving`` (base + preserving conditions) and ``matched_slice``: each control is fitted
      and cross-validated within that set (folds by base item);
    * ``per_condition``: the out-of-fold predictions of the ``all`` fit, restricted to each condition (altering
      conditions hold one class by construction: their AUROC is null with the reason).

    ``prompt_states`` maps trace ids to prompt-final hidden states; without them ``prompt_probe`` is null with
    ``prompt_states_reason``. Limits: :data:`LIMIT_BASE_PRESERVING`, :data:`LIMIT_MATCHED_SLICE`.
    """
    from sift.corpus.axes import AXES

    rows = [r for r in records if r.get("phi") is not None]
    y = np.array([int(r["phi"]) for r in rows])
    groups = [str(r["base_item"]) for r in rows]
    cond = np.array([str(r.get("condition")) for r in rows])
    kinds = np.array([AXES[c].kind if c in AXES else "other" for c in cond])
    sets = {"all": np.ones(len(rows), bool), "base_preserving": np.isin(kinds, ["base", "preserving"]),
            "matched_slice": np.array([in_matched_slice(r) for r in rows], bool)}
    texts = [control_text(r) for r in rows]
    words = [text_trees_words(r) for r in rows]
    surf, _, cat = surface_matrix([surface_features(r) for r in rows]) if rows else (np.zeros((0, 0)), [], None)
    inputs: dict[str, tuple[Callable[[], Any], Any] | str] = {
        "text_bow": (text_bow_estimator, texts),
        "surface": ((lambda: surface_estimator(cat)), surf),
        "text_trees": (text_trees_estimator, words),
    }
    if prompt_states is not None and rows and all(str(r["trace_id"]) in prompt_states for r in rows):
        P = prompt_state_matrix([np.asarray(prompt_states[str(r["trace_id"])], dtype=np.float64) for r in rows],
                                [str(r.get("family")) for r in rows])
        inputs["prompt_probe"] = (prompt_probe_estimator, P)
    else:
        inputs["prompt_probe"] = prompt_states_reason or ("no prompt-final hidden states given" if prompt_states is None
                                                          else "prompt-final hidden states missing for some traces")
    out: dict[str, Any] = {"method": f"GroupKFold({n_splits}) by base item; verified traces",
                           "limits": {"base_preserving": LIMIT_BASE_PRESERVING, "matched_slice": LIMIT_MATCHED_SLICE},
                           "n_verified": len(rows), "controls": {}}
    for name in CONTROLS:
        spec = inputs[name]
        res: dict[str, Any] = {}
        for sname, mask in sets.items():
            if isinstance(spec, str):
                res[sname] = {"auroc": None, "n": int(mask.sum()), "reason": spec}
                oof = None
                continue
            make, X = spec
            idx = np.flatnonzero(mask)
            Xs = [X[i] for i in idx] if isinstance(X, list) else X[idx]
            auc, why, o = grouped_cv_auroc(make, Xs, y[idx], [groups[i] for i in idx], n_splits)
            res[sname] = {"auroc": auc, "n": int(mask.sum()), "reason": why}
            if sname == "all":
                oof, oof_why = o, why
        per: dict[str, Any] = {}
        for c in [a for a in AXES if a in set(cond)] + sorted(set(cond) - set(AXES)):
            m = cond == c
            per[c] = (_subset_auroc(y, oof, m, oof_why) if not isinstance(spec, str)
                      else {"auroc": None, "n": int(m.sum()), "reason": spec})
        res["per_condition"] = per
        out["controls"][name] = res
    out["warnings"] = audit_warnings(out)
    return out


def permutation_null(records: Sequence[Mapping[str, Any]], n_perm: int = 20, seed: int = 0, *,
                     controls: Sequence[str] = ("text_bow", "surface", "text_trees"),
                     sets: Sequence[str] = ("base_preserving", "matched_slice"), n_splits: int = 5) -> dict[str, Any]:
    """What the audit's AUROCs look like when the text carries no label: each base item's φ* labels are flipped
    together with probability ½ (a sign flip per item, the audit's independent unit), which keeps the traces, the
    within-item label structure and about the label balance, and removes any relation between an item's text and
    its label. Per set and control: the observed AUROC, the null's mean and 95th percentile over ``n_perm``
    flips, and the permutation p-value (1 + #null ≥ observed) / (1 + n_perm). With few items a null AUROC of
    0.55–0.60 is common; an observed AUROC inside the null's range is not evidence that the text reads the label."""
    from sift.corpus.axes import AXES

    rows = [r for r in records if r.get("phi") is not None]
    y = np.array([int(r["phi"]) for r in rows])
    groups = [str(r["base_item"]) for r in rows]
    kinds = np.array([AXES[str(r.get("condition"))].kind if str(r.get("condition")) in AXES else "other" for r in rows])
    masks = {"all": np.ones(len(rows), bool), "base_preserving": np.isin(kinds, ["base", "preserving"]),
             "matched_slice": np.array([in_matched_slice(r) for r in rows], bool)}
    unknown = [s for s in sets if s not in masks] + [c for c in controls if c not in ("text_bow", "surface",
                                                                                       "text_trees")]
    if unknown:
        raise SiftError(f"permutation_null: unknown set or text control {unknown}")
    surf, _, cat = surface_matrix([surface_features(r) for r in rows])
    inputs = {"text_bow": (text_bow_estimator, [control_text(r) for r in rows]),
              "surface": ((lambda: surface_estimator(cat)), surf),
              "text_trees": (text_trees_estimator, [text_trees_words(r) for r in rows])}
    items = sorted(set(groups))
    rng = np.random.default_rng(seed)
    flips = [dict(zip(items, rng.random(len(items)) < 0.5)) for _ in range(n_perm)]
    out: dict[str, Any] = {"n_perm": n_perm, "seed": seed, "unit": "base item (sign flip of its labels)"}
    for sname in sets:
        idx = np.flatnonzero(masks[sname])
        g = [groups[i] for i in idx]
        res: dict[str, Any] = {}
        for name in controls:
            make, X = inputs[name]
            Xs = [X[i] for i in idx] if isinstance(X, list) else X[idx]
            obs, _, _ = grouped_cv_auroc(make, Xs, y[idx], g, n_splits)
            null = []
            for f in flips:
                yf = np.where([f[k] for k in g], 1 - y[idx], y[idx])
                auc, _, _ = grouped_cv_auroc(make, Xs, yf, g, n_splits)
                if auc is not None:
                    null.append(auc)
            arr = np.array(null)
            res[name] = {"observed": obs, "null_mean": round(float(arr.mean()), 4) if len(arr) else None,
                         "null_p95": round(float(np.quantile(arr, 0.95)), 4) if len(arr) else None,
                         "p_value": (round((1 + int((arr >= obs).sum())) / (1 + len(arr)), 4)
                                     if len(arr) and obs is not None else None)}
        out[sname] = res
    return out


def audit_warnings(audit: Mapping[str, Any]) -> list[str]:
    """Which controls exceed the limits (one string per breach)."""
    out = []
    for name, res in (audit.get("controls") or {}).items():
        for sname, limit in (("base_preserving", LIMIT_BASE_PRESERVING), ("matched_slice", LIMIT_MATCHED_SLICE)):
            a = (res.get(sname) or {}).get("auroc")
            if a is not None and a > limit:
                where = "base + preserving traces" if sname == "base_preserving" else "the matched slice"
                out.append(f"{name} {a:.2f} > {limit:.2f} on {where}")
    return out


def warning_line(manifest: Mapping[str, Any]) -> str | None:
    """The one warning line ``sift-corpus`` prints when a control exceeds the audit's limits (None: none does)."""
    w = (manifest.get("controls_audit") or {}).get("warnings") or []
    if not w:
        return None
    return ("sift-corpus: WARNING: the label is readable without the mechanism (grouped 5-fold CV AUROC): "
            + "; ".join(w))


def audit_table(audit: Mapping[str, Any]) -> str:
    """The audit as a Markdown table: one row per set (all, base + preserving, matched slice, each condition)."""
    from sift.report import markdown_table

    ctrls = list(audit["controls"])
    first = audit["controls"][ctrls[0]]
    sets = [("all verified", "all"), ("base + preserving", "base_preserving"), ("matched slice", "matched_slice")]
    rows = []

    def cell(r: Mapping[str, Any]) -> str:
        return "—" if r.get("auroc") is None else f"{r['auroc']:.3f}"

    for label, key in sets:
        rows.append([label, first[key]["n"], *[cell(audit["controls"][c][key]) for c in ctrls]])
    for c in first["per_condition"]:
        rows.append([f"condition: {c}", first["per_condition"][c]["n"],
                     *[cell(audit["controls"][k]["per_condition"][c]) for k in ctrls]])
    notes = sorted({f"{c}: {r['reason']}" for c in ctrls for key, r in
                    [*((k, audit["controls"][c][k]) for _, k in sets),
                     *((k, v) for k, v in audit["controls"][c]["per_condition"].items())] if r.get("reason")})
    md = markdown_table(["traces", "n", *ctrls], rows)
    if notes:
        md += "\n\nUndefined (—): " + "; ".join(notes)
    return md


def prompt_states_for(sources: Mapping[str, Any], records: Sequence[Mapping[str, Any]], field: str = "family",
                      batch_size: int = 64) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """Prompt-final hidden states (:func:`sift.lm.states.prompt_final_states`) of every record, from
    the source model that generated it (``sources``: ``record[field]`` → an object with ``.model`` and
    ``.tokenizer``). Returns (trace id → state, None), or (None, reason) when a record's model is not loaded."""
    import torch

    from sift.lm.states import prompt_final_states

    by: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        by.setdefault(str(r.get(field)), []).append(r)
    missing = sorted(set(by) - set(sources))
    if missing:
        return None, f"source model(s) {', '.join(missing)} not loaded in this run (every chunk was reused)"
    out: dict[str, np.ndarray] = {}
    for fam in [f for f in sources if f in by]:  # in the sources' order (a lazy mapping puts the loaded one first)
        rs = by[fam]
        src = sources[fam]
        pad = getattr(src.tokenizer, "pad_token_id", None)
        was = src.model.training
        src.model.eval()
        with torch.no_grad():
            states = prompt_final_states(src.model, [list(r["prompt_ids"]) for r in rs], 0 if pad is None else pad,
                                         batch_size)
        src.model.train(was)
        out.update({str(r["trace_id"]): s for r, s in zip(rs, states.numpy())})
    return out, None
