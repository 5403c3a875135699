"""Mechanism-preservation audit of the preserving pairs (paper App. H, Table 19).

The paper asks whether a preserving transformation kept the *mechanism*, not only the label, by a causal
mediation test (replace the CoT with a length-matched scramble, re-run, see whether the answer moves). On
the organism sift knows more: every trace's verification record says which interventions moved its answer
(CoT edit, cue change) and whether the CoT states the cue, i.e. its causal route
(:func:`sift.evaluation.appendix_common.mechanism_class`). A pair is *mechanism-preserved* when both traces
take the same route. The paper's scramble test is also available (:func:`cot_scramble_test`, re-decoding
with the organism) and reported beside it when given.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import seed_mean
from sift.evaluation.appendix_common import (
    Runs,
    TraceTable,
    ci,
    error_bars,
    fmt_cell,
    nan_none,
    pyplot,
    save_figure,
)
from sift.evaluation.engine import PredictionTable, runs_table
from sift.evaluation.predictions import Pairs
from sift.metrics.appendix_helpers import cluster_bootstrap_many
from sift.metrics.invariance import ivr_compute, ivr_update
from sift.report import Section, markdown_table


def _scrambled(ids: list[int], key: str) -> list[int]:
    """A length-matched scramble of ``ids`` (a permutation that differs from the original when one exists)."""
    rng = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    if len(set(ids)) < 2:
        return list(ids)
    for _ in range(20):
        out = [ids[i] for i in rng.permutation(len(ids))]
        if out != list(ids):
            return out
    return out


def cot_scramble_test(
    corpus_dir: str | Path,
    checkpoint_dir: str | Path | None = None,
    trace_ids: Sequence[str] | None = None,
    seed: int = 0,
    batch_size: int = 512,
) -> dict[str, bool]:
    """The paper's causal mediation test on organism traces: CoT replaced by a length-matched scramble.

    For each trace (all organism traces of ``corpus_dir/traces.jsonl``, or ``trace_ids``) the generated CoT
    tokens are permuted at random (seeded by trace id and ``seed``), ``answer :`` is appended and the answer
    re-decoded greedily with the organism that generated the trace (``checkpoint_dir/<family>``, default the
    shipped checkpoints). Returns trace id → True when the answer changes (the CoT is causally necessary).
    Traces without a parsable answer or of a non-organism model are left out.
    """
    from sift.corpus.store import read_jsonl
    from sift.organism import DEFAULT_CHECKPOINTS
    from sift.organism.latent import kind_folder, latent_kind, trace_latent
    from sift.organism.source import OrganismSource

    path = Path(corpus_dir) / "traces.jsonl"
    if not path.exists():
        raise SiftError(f"{path}: no traces file (build the corpus with sift-corpus first)")
    want = None if trace_ids is None else set(trace_ids)
    recs = [r for r in read_jsonl(path) if (want is None or r["trace_id"] in want) and r.get("answer") is not None
            and str(r.get("model", "")).startswith("organism-")]
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else DEFAULT_CHECKPOINTS
    out: dict[str, bool] = {}
    for fam in sorted({r["family"] for r in recs}):
        rs = [r for r in recs if r["family"] == fam]
        kind = latent_kind([trace_latent(r) for r in rs])
        src = OrganismSource.load(fam, kind_folder(ckpt, fam, kind), kind)
        ans = src.ids(["answer", ":"])
        prefixes = []
        for r in rs:
            cot = r["generated_ids"][r["cot_span"][0]:r["cot_span"][1]]
            prefixes.append(r["prompt_ids"] + _scrambled(cot, f"{seed}:{r['trace_id']}") + ans)
        lat = [trace_latent(r) for r in rs]  # the trace's mechanism latent, replayed (organism v3)
        got = src.next_word(prefixes, batch_size=batch_size,
                            latents=None if None in lat else [x.value for x in lat],
                            starts=None if None in lat else [x.start for x in lat])
        out.update({r["trace_id"]: g != r["answer"] for r, g in zip(rs, got)})
    return out


def mechanism_preservation_audit(
    runs: Runs,
    pairs: Pairs,
    traces: TraceTable,
    out_dir: str | Path | None = None,
    *,
    scramble: Mapping[str, bool] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    table: PredictionTable | None = None,
) -> Section:
    """Mechanism-preservation rate per preserving axis and IVR on mechanism-preserved pairs (App. H, Table 19).

    Over all verified preserving pairs of ``pairs`` whose traces ``traces`` knows: the share whose two
    traces take the same causal route (from their verification records: ``cot``, ``cue_silent``,
    ``cue_stated``, ``none``; pairs with an ambiguous trace count as not verifiably preserved) with the
    route transitions of the others. With ``scramble`` (trace id → answer changed under a CoT scramble,
    :func:`cot_scramble_test`), also the share of pairs whose two traces agree on CoT necessity and the
    paper's literal rate (CoT necessary on both traces). Per detector (seed means) the IVR on all of its
    pairs, on route-preserved pairs only, and the change; all with 95 % base-item bootstrap CIs.

    Deviation from the paper: its rate counts a pair as preserved when the CoT is necessary for the answer,
    which by construction fails every cue-driven (φ* = 0) pair; sift compares the routes of the two traces
    instead and reports the literal rate separately.
    """
    idx = traces.index()
    p = pairs.select(kind="preserving")
    keep = np.array([s in idx and t in idx for s, t in zip(p.source_id.tolist(), p.shifted_id.tolist())], bool)
    if not keep.any():
        raise SiftError("mechanism audit: no preserving pair has both traces in the trace table")
    src = traces.rows(p.source_id[keep].tolist())
    dst = traces.rows(p.shifted_id[keep].tolist())
    axis, groups = p.axis[keep].astype(str), p.base_item[keep].astype(str)
    mech = traces.str_["mechanism"]
    same = (mech[src] == mech[dst]) & (mech[src] != "ambiguous")
    axes = sorted(set(axis.tolist()))
    cols = [same.astype(float)]
    have_scr = scramble is not None
    if have_scr:
        tid = traces.trace_id
        nec = np.array([scramble.get(t, None) for t in tid.tolist()], dtype=object)
        known = np.array([v is not None for v in nec[src]]) & np.array([v is not None for v in nec[dst]])
        a = np.array([bool(v) if v is not None else False for v in nec[src]])
        b_ = np.array([bool(v) if v is not None else False for v in nec[dst]])
        cols += [np.where(known, (a == b_).astype(float), np.nan), np.where(known, (a & b_).astype(float), np.nan)]
    cols = np.array(cols)  # [k, P]
    sel = {g: (axis == g) for g in axes}
    sel["mean"] = None

    def rate_stat(ix):
        out = []
        for g in axes:
            j = ix[sel[g][ix]]
            for c in cols:
                v = c[j][~np.isnan(c[j])]
                out.append(float(v.mean()) if v.size else math.nan)
        per = np.array(out).reshape(len(axes), len(cols))
        return np.concatenate([out, [seed_mean(per[:, q]) for q in range(len(cols))]])  # macro mean over axes

    b = cluster_bootstrap_many(rate_stat, groups, n_resamples, seed)
    k = len(cols)
    rates: dict = {}
    for gi, g in enumerate(axes + ["mean"]):
        d = {"n_pairs": int(sel[g].sum()) if g != "mean" else int(len(axis)), "route_preserved": ci(b, gi * k)}
        if have_scr:
            d["scramble_agreement"] = ci(b, gi * k + 1)
            d["cot_necessary_both"] = ci(b, gi * k + 2)
        if g != "mean":
            m = sel[g] & ~same
            d["transitions"] = dict(Counter(f"{x}→{y}" for x, y in zip(mech[src][m], mech[dst][m])).most_common())
        rates[g] = d

    # IVR per detector on all pairs vs route-preserved pairs
    ivr_res: dict = {}
    if table is None:
        table = runs_table(runs, pairs)
    for name, preds in runs.items():
        st = table.stack(name, preds)
        pr = st.pair_rows("preserving")
        ok = np.array([s in idx and t in idx for s, t in zip(pr.source_id.tolist(), pr.shifted_id.tolist())], bool)
        pr = pr.subset(ok)
        if len(pr) == 0:
            continue
        ms, md_ = mech[traces.rows(pr.source_id.tolist())], mech[traces.rows(pr.shifted_id.tolist())]
        pres_ok = (ms == md_) & (ms != "ambiguous")
        vs, vd = st.verdict[:, pr.src], st.verdict[:, pr.dst]
        pax = pr.axis
        gsel = {g: pax == g for g in axes}

        def ivr_of(rows: np.ndarray, vs: np.ndarray = vs, vd: np.ndarray = vd) -> float:
            """Mean over seeds of the IVR on pair rows ``rows``."""
            return seed_mean([ivr_compute(*ivr_update(vs[s, rows], vd[s, rows]))[1] for s in range(vs.shape[0])])

        def ivr_stat(ix, pres_ok=pres_ok, gsel=gsel):
            out = []
            per_axis = []
            for g in axes:
                j = ix[gsel[g][ix]]
                jp = j[pres_ok[j]]
                a_, p_ = ivr_of(j), ivr_of(jp)
                per_axis.append([a_, p_, p_ - a_])
            per_axis = np.array(per_axis)
            for row in per_axis:
                out += row.tolist()
            out += [seed_mean(per_axis[:, q]) for q in range(3)]
            return np.array(out)

        bi = cluster_bootstrap_many(ivr_stat, pr.base_item, n_resamples, seed)
        ivr_res[name] = {g: {"ivr_all": ci(bi, 3 * gi), "ivr_preserved": ci(bi, 3 * gi + 1),
                             "change": ci(bi, 3 * gi + 2)} for gi, g in enumerate(axes + ["mean"])}

    hdr = ["axis", "pairs", "route preserved"] + (["scramble agreement", "CoT necessary (both)"] if have_scr else [])
    rows = [[g, rates[g]["n_pairs"], fmt_cell(rates[g]["route_preserved"])]
            + ([fmt_cell(rates[g]["scramble_agreement"]), fmt_cell(rates[g]["cot_necessary_both"])] if have_scr else [])
            for g in axes + ["mean"]]
    irows = [[n, g, fmt_cell(d[g]["ivr_all"]), fmt_cell(d[g]["ivr_preserved"]), fmt_cell(d[g]["change"])]
             for n, d in ivr_res.items() for g in axes + ["mean"]]
    trans = [f"- {g}: " + ", ".join(f"{t} ×{c}" for t, c in list(rates[g]["transitions"].items())[:5])
             for g in axes if rates[g]["transitions"]]
    md = ["Mechanism preservation of verified preserving pairs (paper App. H, Table 19): a pair is route-preserved "
          "when both traces take the same causal route by their verification interventions (CoT edit / cue change / "
          "cue stated)" + ("; the paper's CoT-scramble mediation test is shown beside it" if have_scr else
                           "; the paper's CoT-scramble test was not run (pass scramble=cot_scramble_test(...))")
          + f". 'mean' = macro mean over axes. 95 % CIs: {n_resamples} base-item resamples.", "",
          markdown_table(hdr, rows), ""]
    if trans:
        md += ["Route changes among the non-preserved pairs (most frequent):", ""] + trans + [""]
    if irows:
        md += ["IVR on all pairs versus route-preserved pairs only (seed means):", "",
               markdown_table(["detector", "axis", "IVR all", "IVR preserved", "change"], irows)]
    figs = []
    if out_dir is not None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 3.6))
        e, err = error_bars([rates[g]["route_preserved"] for g in axes])
        ax.bar(axes, e, yerr=err, capsize=3, color="#4c72b0", label="route preserved")
        if have_scr:
            s_ = np.array([np.nan if rates[g]["scramble_agreement"]["estimate"] is None
                           else rates[g]["scramble_agreement"]["estimate"] for g in axes])
            ax.plot(axes, s_, "o", color="C1", label="scramble agreement")
        ax.set_ylim(0, 1.05), ax.set_ylabel("share of preserving pairs"), ax.legend(fontsize=7)
        ax.tick_params(axis="x", rotation=30)
        figs = save_figure(fig, out_dir, "appendix_mechanism")
    results = nan_none({"rates": rates, "ivr": ivr_res, "scramble_run": have_scr, "n_resamples": n_resamples})
    return Section("appendix_mechanism", "Mechanism-preservation audit (App. H)", "\n".join(md), figs, results)
