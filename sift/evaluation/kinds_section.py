"""The report's "Detectors × mechanism kind" section (issue 43): the same detectors on each mechanism kind of the
organism (:data:`sift.lm.latent.MECHANISM_KINDS`), and trained on one kind, tested on another.

The main job (``mechanisms``) runs the primary kind (``source.mechanism_kind``) as usual and every other kind under
``kinds/<kind>/`` (:func:`kind_root`): its own corpus, trajectories and runs ``runs/kinds/<kind>/<detector>/seed<s>``.
Each run of the comparison also predicts the other kinds' test splits (:func:`cross_kind_file`). The kinds share
items, twins and splits (same ``n_items`` and ``seed``), so a cross-kind prediction scores only held-out items.

Per kind, every number is the matched-slice table's (:func:`sift.evaluation.control_rows.matched_slice_section`:
AUROC on the kind's own slice with a 95 % cluster-bootstrap CI over base items, IVR and MFS on the verified pairs
with a trace in the slice), seed means; :func:`kinds_table` is the pure computation, :func:`kinds_section` renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from sift.errors import SiftError
from sift.evaluation.predictions import Pairs, Predictions
from sift.report import Section, markdown_table

KEY = "mechanism_kinds"
TITLE = "Detectors × mechanism kind"
METRICS = ("auroc", "ivr", "mfs")


def primary_kind(cfg: Any) -> str:
    """The main job's primary mechanism kind: ``source.mechanism_kind`` (``offset`` when the source has none)."""
    from sift.lm.latent import DEFAULT_KIND

    source = cfg.get("source")
    return str((source.get("mechanism_kind") if source is not None else None) or DEFAULT_KIND)


def mechanism_kinds(cfg: Any) -> list[str]:
    """The job's mechanism kinds in ``mechanisms`` order (null: the primary kind, ``source.mechanism_kind``, alone;
    a source other than the organism has none: []). Raises SiftError naming ``mechanisms`` for an unknown or
    repeated kind, a list without the primary kind, or several kinds with another source."""
    from sift.lm.latent import MECHANISM_KINDS

    listed = cfg.get("mechanisms")
    listed = None if listed is None else [str(k) for k in listed]
    source = cfg.get("source")
    if source is None or source.get("type") != "organism":
        if listed is not None and len(listed) > 1:
            raise SiftError(f"mechanisms: mechanism kinds are the organism's; source.type="
                            f"{None if source is None else source.get('type')} has none (set mechanisms=null)")
        return []
    primary = primary_kind(cfg)
    if listed is None:
        return [primary]
    for k in listed:
        if k not in MECHANISM_KINDS:
            raise SiftError(f"mechanisms: {k!r} is not a mechanism kind ({', '.join(MECHANISM_KINDS)})")
        if listed.count(k) > 1:
            raise SiftError(f"mechanisms: {k!r} is listed twice")
    if primary not in listed:
        raise SiftError(f"mechanisms: {listed} does not list the primary kind {primary!r} (source.mechanism_kind)")
    return listed


def kind_root(out: Path, kind: str, primary: str) -> Path:
    """The folder holding a kind's ``corpus``, ``trajectories`` and ``cache``: the job's own for the primary kind,
    ``kinds/<kind>`` for the others."""
    return Path(out) if kind == primary else Path(out) / "kinds" / kind


def cross_kind_file(out: Path, key: str, kind: str) -> Path:
    """Where run ``key``'s predictions on ``kind``'s test split are written."""
    return Path(out) / "runs" / key / "predictions" / f"on_{kind}" / "test.npz"


class KindData(NamedTuple):
    """One mechanism kind's inputs: row → its runs' test predictions (seeds), its corpus's pairs and slice ids."""

    runs: dict[str, list[Predictions]]
    pairs: Pairs
    slice_ids: set[str]


def _slice_rows(runs: Mapping[str, Sequence[Predictions]], data: KindData, n_resamples: int,
                seed: int) -> dict[str, Any]:
    """The matched-slice table's per-row results of ``runs`` on ``data``'s pairs and slice."""
    from sift.evaluation.control_rows import matched_slice_section

    runs = {r: list(v) for r, v in runs.items() if v}
    if not runs:
        return {}
    return matched_slice_section(runs, data.pairs, data.slice_ids, n_resamples=n_resamples,
                                 seed=seed).results["detectors"]


def kinds_table(in_kind: Mapping[str, KindData],
                cross: Mapping[tuple[str, str], Mapping[str, Sequence[Predictions]]], *,
                matrix_seeds: Sequence[int] | None = None, n_resamples: int = 1000, seed: int = 0) -> dict[str, Any]:
    """The section's numbers. ``in_kind``: kind → its :class:`KindData` (columns in this order); ``cross``:
    (train kind, test kind) → row → the train kind's runs' predictions on the test kind's test split;
    ``matrix_seeds``: the seeds of the cross-kind matrix (None: all), whose diagonal is each kind's in-kind runs
    of those seeds. Returns ``{kinds, matrix_seeds, n_resamples, detectors: {row: {group, kinds: {kind: {auroc,
    ivr, mfs, seeds, n_seeds} | None}, worst_kind: {kind, auroc}}}, cross_kind: {row: {train: {test: {estimate,
    low, high, seeds} | None}}}}``."""
    from sift.detectors.registry import is_control
    from sift.evaluation.control_rows import order_rows

    kinds = list(in_kind)
    per = {k: _slice_rows(d.runs, d, n_resamples, seed) for k, d in in_kind.items()}
    rows = list(order_rows({r: None for d in in_kind.values() for r in d.runs}))
    keep = (lambda p: True) if matrix_seeds is None else (lambda p: p.seed in set(matrix_seeds))
    detectors: dict[str, Any] = {}
    for r in rows:
        cells: dict[str, Any] = {}
        for k in kinds:
            res = per[k].get(r)
            seeds = sorted(int(p.seed) for p in in_kind[k].runs.get(r, []) if p.seed is not None)
            cells[k] = None if res is None else {**{m: res[m] for m in METRICS}, "seeds": seeds,
                                                 "n_seeds": len(seeds)}
        aucs = {k: c["auroc"]["estimate"] for k, c in cells.items() if c and c["auroc"]["estimate"] is not None}
        worst = min(aucs, key=lambda k: aucs[k]) if aucs else None
        detectors[r] = {"group": "controls" if is_control(r) else "detectors", "kinds": cells,
                        "worst_kind": {"kind": worst, "auroc": aucs.get(worst)}}
    matrix: dict[str, dict[str, dict[str, Any]]] = {r: {a: {} for a in kinds} for r in rows}
    for a in kinds:
        for b in kinds:
            if a == b:
                runs = {r: [p for p in v if keep(p)] for r, v in in_kind[a].runs.items()}
                same = all(len(runs[r]) == len(v) for r, v in in_kind[a].runs.items())
                res = per[a] if same else _slice_rows(runs, in_kind[b], n_resamples, seed)
            else:
                runs = {r: [p for p in v if keep(p)] for r, v in cross.get((a, b), {}).items()}
                res = _slice_rows(runs, in_kind[b], n_resamples, seed)
            for r in rows:
                seeds = sorted(int(p.seed) for p in runs.get(r, []) if p.seed is not None)
                matrix[r][a][b] = ({**{x: res[r]["auroc"].get(x) for x in ("estimate", "low", "high")},
                                    "seeds": seeds} if r in res else None)
    return {"kinds": kinds, "matrix_seeds": None if matrix_seeds is None else sorted(int(s) for s in matrix_seeds),
            "n_resamples": n_resamples, "detectors": detectors, "cross_kind": matrix}


def _plot(results: Mapping[str, Any], out_dir: Path | None) -> list[str]:
    """Grouped bars: matched-slice AUROC (95 % CI) per row, one bar per kind; the dashed line is chance."""
    import numpy as np

    from sift.evaluation.appendix_common import error_bars, pyplot, save_figure

    plt = pyplot()
    rows, kinds = list(results["detectors"]), list(results["kinds"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(rows) * max(1, len(kinds)) / 2, 3.4))
    width = 0.8 / max(1, len(kinds))
    x = np.arange(len(rows))
    empty = {"estimate": None, "low": None, "high": None}
    for j, k in enumerate(kinds):
        cells = [(results["detectors"][r]["kinds"].get(k) or {}).get("auroc") or empty for r in rows]
        est, err = error_bars(cells)
        ax.bar(x + (j - (len(kinds) - 1) / 2) * width, est, width, yerr=err, capsize=2, label=k)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(x, rows, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("matched-slice AUROC")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, title="mechanism kind", title_fontsize=7)
    ax.set_title(TITLE, fontsize=9)
    return save_figure(fig, out_dir, KEY)


def kinds_section(results: Mapping[str, Any], out_dir: Path | None = None, primary: str | None = None) -> Section:
    """The section of :func:`kinds_table`'s ``results`` (``primary``: marked in the text; ``out_dir``: where the
    figure goes, none without it)."""
    from sift.evaluation.control_rows import with_group_rows
    from sift.report.numbers import fmt, fmt_cell

    kinds = list(results["kinds"])
    rows = results["detectors"]

    def seeds_of(k: str) -> str:
        s = sorted({x for r in rows.values() if r["kinds"].get(k) for x in r["kinds"][k]["seeds"]})
        return f"{k}{' (primary)' if k == primary else ''}: {', '.join(map(str, s)) or '—'}"

    header = ["Detector"] + [f"{k} {m}" for k in kinds for m in ("AUROC", "IVR", "MFS", "seeds")] + ["worst kind"]
    table = []
    for r, v in rows.items():
        cells: list[Any] = [r]
        for k in kinds:
            c = v["kinds"].get(k)
            cells += ([fmt_cell(c[m]) for m in METRICS] + [c["n_seeds"]]) if c else ["—"] * 4
        w = v["worst_kind"]
        cells.append("—" if w["kind"] is None else f"{w['kind']} ({fmt(w['auroc'])})")
        table.append(cells)
    md = [f"Each detector and control on each mechanism kind of the organism (docs/organism.md, \"Mechanism kinds\"), "
          f"trained and tested on that kind's own corpus: AUROC on the kind's matched slice with a 95 % "
          f"cluster-bootstrap CI over base items ({results['n_resamples']} resamples), IVR and MFS (full coverage) on "
          f"the verified pairs with a trace in the slice (the matched-slice table's numbers); the seed mean over the "
          f"kind's runs (seeds: {'; '.join(seeds_of(k) for k in kinds)}). Worst kind: the lowest AUROC across kinds.",
          "", markdown_table(header, with_group_rows(table)), ""]
    seeds = results.get("matrix_seeds")
    md += [f"**Train on one kind, test on another** (matched-slice AUROC on the test kind's test split and slice; "
           f"seeds {', '.join(map(str, seeds)) if seeds else 'all'}; the diagonal is in-kind):", ""]
    cross = []
    for r, m in results["cross_kind"].items():
        for a in kinds:
            cross.append([r, a, *[fmt_cell(m[a][b]) if m[a].get(b) else "—" for b in kinds]])
    md.append(markdown_table(["Detector", "trained on", *[f"on {b}" for b in kinds]], with_group_rows(cross)))
    return Section(KEY, TITLE, "\n".join(md), figures=_plot(results, out_dir), results=dict(results))


def load_kinds(out: Path, specs: Sequence[Any], files: Mapping[str, Mapping[str, Path]], kinds: Sequence[str],
               primary: str) -> tuple[dict[str, KindData], dict[tuple[str, str], dict[str, list[Predictions]]],
                                      list[int]]:
    """The main job's inputs of :func:`kinds_table` (``specs``: its run specs; ``files``: their split
    predictions): the primary kind's main runs and every other kind's ``kind`` runs of the kind detectors, each
    kind's corpus pairs and slice, the cross-kind predictions and their seeds (those of the ``kind`` runs)."""
    from sift.evaluation.control_rows import slice_ids_from_corpus

    kind_specs = [s for s in specs if s.group == "kind"]
    dets = set(s.detector for s in kind_specs)
    seeds = sorted({int(s.seed) for s in kind_specs})

    def train_kind(s: Any) -> str | None:
        if s.group == "kind":
            return str(s.tags["mechanism_kind"])
        return primary if s.group == "main" and s.detector in dets else None

    data = {}
    for k in kinds:
        corpus = kind_root(out, k, primary) / "corpus"
        runs: dict[str, list[Predictions]] = {}
        for s in specs:
            if train_kind(s) == k and "test" in files.get(s.key, {}):
                runs.setdefault(s.detector, []).append(Predictions.load(files[s.key]["test"]))
        data[k] = KindData(runs, Pairs.from_corpus(corpus), slice_ids_from_corpus(corpus))
    cross: dict[tuple[str, str], dict[str, list[Predictions]]] = {}
    for s in specs:
        a = train_kind(s)
        if a is None or int(s.seed) not in seeds:
            continue
        for b in kinds:
            path = cross_kind_file(out, s.key, b)
            if b == a:
                continue
            if not path.is_file():
                raise SiftError(f"{path}: no cross-kind predictions of run {s.key} (rerun sift-faithshift)")
            cross.setdefault((a, b), {}).setdefault(s.detector, []).append(Predictions.load(path))
    return data, cross, seeds


def job_kinds(cfg: Any) -> list[str]:
    """The kinds the main job compares (:func:`mechanism_kinds`); [] when fewer than two."""
    kinds = mechanism_kinds(cfg)
    return kinds if len(kinds) > 1 else []


def kind_report_files(cfg: Any, out: Path, specs: Sequence[Any]) -> list[Path]:
    """What the section reads besides the split predictions (for the report key): every other kind's corpus
    files and every cross-kind prediction file."""
    kinds, primary = job_kinds(cfg), primary_kind(cfg)
    paths = [kind_root(out, k, primary) / "corpus" / f for k in kinds if k != primary
             for f in ("traces.jsonl", "pairs.jsonl", "manifest.json")]
    paths += [cross_kind_file(out, s.key, k) for s in specs if s.group in ("main", "kind") for k in kinds]
    return [p for p in paths if p.is_file()]


def mechanism_kinds_section(cfg: Any, out: Path, specs: Sequence[Any], files: Mapping[str, Mapping[str, Path]],
                            report_dir: Path) -> Section | None:
    """The section of the main job (None unless ``mechanisms`` lists several kinds of the organism)."""
    kinds = job_kinds(cfg)
    if not kinds:
        return None
    primary = primary_kind(cfg)
    data, cross, seeds = load_kinds(out, specs, files, kinds, primary)
    results = kinds_table(data, cross, matrix_seeds=seeds, n_resamples=int(cfg.bootstrap.resamples),
                          seed=int(cfg.bootstrap.seed))
    return kinds_section({**results, "primary": primary}, report_dir, primary)
