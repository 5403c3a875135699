"""The main job's report: every run's saved predictions → paper tables, appendix analyses, report.md, W&B.

Inputs are the per-run prediction files written by :mod:`sift.faithshift` (``runs/<key>/predictions/*.npz``),
the corpus (verified pairs, trace metadata) and the config. Run groups map onto the paper as follows:

* ``main``: every detector × seed → Table 1 (main table), Table 8 (seed ensembles), Table 3 / Fig. 9
  (certified selective risk), appendix analyses; plus the instance-level 4-detector ensemble;
* ``ablation``: SIFT with one component off → Table 4 (next to the full SIFT runs of ``main``);
* ``factorial``: SIFT without IRM/DANN and the instance-level MLP with them → rows of their own and the
  2×2×2 decomposition of appendix F;
* ``transfer_domain`` / ``transfer_model``: trained without one domain (model), tested on it → the
  transfer columns of Table 1 and the transfer tables of Table 2 (held-out vs in-distribution AUROC);
* ``kind``: a detector on another mechanism kind of the organism → only the "Detectors × mechanism kind" section
  (:mod:`sift.evaluation.kinds_section`), with the primary kind's main runs and the cross-kind predictions.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sift.atomic import write_text
from sift.detectors.registry import INSTANCE_ENSEMBLE
from sift.errors import SiftError
from sift.evaluation.analysis import CALIB_SPLIT, ensemble_threshold
from sift.evaluation.predictions import Pairs, Predictions, average
from sift.evaluation.sections.transfer_matrix import IN_DIST
from sift.report import Section

TRANSFER_SETTING = {"transfer_domain": "cross-domain", "transfer_model": "cross-model"}


def load_predictions(specs: list, files: dict[str, dict[str, Path]],
                     below_full: Collection[str] = ()) -> list[Predictions]:
    """Every saved prediction table, tagged for :func:`sift.evaluation.run.report_from_predictions`.
    ``below_full``: detectors the preset declares too small to train to their full-preset AUROC (the
    preset's ``undertrained_detectors``); their rows are marked undertrained."""
    out: list[Predictions] = []
    for spec in specs:
        if spec.group == "kind":  # another mechanism kind's corpus: its own section (kinds_section)
            continue
        for split, path in files.get(spec.key, {}).items():
            p = Predictions.load(path)
            if spec.detector in below_full:
                p.meta["below_full"] = True
            if spec.group == "ablation":
                p.meta["ablation"] = spec.tags["ablation"]
            if spec.group == "factorial":  # its own row (e.g. sift_erm), as the factorial analysis names it
                p.detector = spec.tags["variant"]
            if spec.group in TRANSFER_SETTING:
                held = spec.tags.get("holdout_domain") or spec.tags.get("holdout_model")
                if split == "test":  # in-distribution test of a transfer run: the matrix's in-distribution cell
                    p.meta.update(train_on=f"all but {held}", test_on=IN_DIST, matrix=TRANSFER_SETTING[spec.group],
                                  in_dist_of=f"{TRANSFER_SETTING[spec.group]} ({held})")  # like-for-like gap
                elif split == "transfer":
                    p.meta.update(train_on=f"all but {held}", test_on=held, matrix=TRANSFER_SETTING[spec.group])
                else:
                    continue
            out.append(p)
    # the main table's transfer columns: one per held-out domain / model
    for spec in specs:
        if spec.group in TRANSFER_SETTING and "transfer" in files.get(spec.key, {}):
            p = Predictions.load(files[spec.key]["transfer"])
            held = spec.tags.get("holdout_domain") or spec.tags.get("holdout_model")
            p.meta["transfer_setting"] = f"{TRANSFER_SETTING[spec.group]} ({held})"
            out.append(p)
    return out


def instance_ensembles(preds: list[Predictions], members: list[str]) -> list[Predictions]:
    """The paper's instance-level ensemble: per seed, the probability average of ``members`` (main runs),
    its threshold frozen on the averaged validation (selection) predictions; also on the calibration split when
    every member has one (SGR). None when ``members`` is empty."""
    if not members:
        return []
    by = {(p.detector, p.seed, p.split): p for p in preds if p.role.is_main}
    seeds = sorted({s for (d, s, sp) in by if d == members[0] and s is not None})
    out = []
    for s in seeds:
        if not all((d, s, sp) in by for d in members for sp in ("val", "test")):
            continue
        thr, _ = ensemble_threshold([by[(d, s, "test")] for d in members], [by[(d, s, "val")] for d in members])
        splits = ("val", CALIB_SPLIT, "test") if all((d, s, CALIB_SPLIT) in by for d in members) else ("val", "test")
        for sp in splits:
            e = average([by[(d, s, sp)] for d in members], INSTANCE_ENSEMBLE, thr)
            out.append(Predictions(INSTANCE_ENSEMBLE, s, sp, thr, e.trace_id, e.base_item, e.domain, e.model,
                                   e.condition, e.label, e.prob, meta={"members": members}))
    return out


def instance_ensemble_transfer(specs: list, files: dict[str, dict[str, Path]],
                               members: list[str]) -> list[Predictions]:
    """The instance-level ensemble on each transfer setting: per held-out domain / model and seed, the average of
    the members' transfer-run predictions, its threshold frozen on their averaged validation predictions."""
    runs: dict[tuple, dict[str, Any]] = {}
    for spec in specs:
        if spec.group in TRANSFER_SETTING and spec.detector in members:
            held = spec.tags.get("holdout_domain") or spec.tags.get("holdout_model")
            runs.setdefault((spec.group, held, spec.seed), {})[spec.detector] = files.get(spec.key, {})
    out = []
    for (group, held, seed), by in sorted(runs.items(), key=str):
        if not all(d in by and {"val", "transfer"} <= set(by[d]) for d in members):
            continue
        vals = [Predictions.load(by[d]["val"]) for d in members]
        thr, _ = ensemble_threshold(vals, vals)
        e = average([Predictions.load(by[d]["transfer"]) for d in members], INSTANCE_ENSEMBLE, thr)
        setting = f"{TRANSFER_SETTING[group]} ({held})"
        out.append(Predictions(INSTANCE_ENSEMBLE, seed, "transfer", thr, e.trace_id, e.base_item, e.domain,
                               e.model, e.condition, e.label, e.prob,
                               meta={"members": members, "transfer_setting": setting}))
        if all("test" in by[d] for d in members):  # its own in-distribution test split (like-for-like gap)
            e = average([Predictions.load(by[d]["test"]) for d in members], INSTANCE_ENSEMBLE, thr)
            out.append(Predictions(INSTANCE_ENSEMBLE, seed, "test", thr, e.trace_id, e.base_item, e.domain,
                                   e.model, e.condition, e.label, e.prob,
                                   meta={"members": members, "in_dist_of": setting}))
    return out


def runs_training(out: Path, specs: list) -> dict[str, Any]:
    """Per run: stop epoch, optimizer steps, best validation loss, what stopped it and whether it converged
    (from ``runs/<key>/results.json``)."""
    import json

    res: dict[str, Any] = {}
    for spec in specs:
        path = out / "runs" / spec.key / "results.json"
        t = json.loads(path.read_text()).get("training") if path.is_file() else None
        if t:
            res[spec.key] = {k: t.get(k) for k in ("stop_epoch", "global_step", "best_val_loss", "stopped_by",
                                                   "converged", "best_step")}
    return res


def model_shapes(traj_dir: Path) -> dict[str, Any] | None:
    """Native (layers, width) per source model and their common shape, from ``trajectories.json``; None when the
    models share one shape (nothing is mapped) or the manifest is missing."""
    import json

    path = traj_dir / "trajectories.json"
    if not path.is_file():
        return None
    models = json.loads(path.read_text()).get("models") or {}
    native = {m: [int(i["num_layers"]), int(i["hidden_size"])] for m, i in sorted(models.items())}
    if len({tuple(v) for v in native.values()}) < 2:
        return None
    return {"native": native, "num_layers": min(v[0] for v in native.values()),
            "hidden_size": min(v[1] for v in native.values())}


def corpus_section(corpus_dir: Path, shapes: dict[str, Any] | None = None) -> Section:
    """What the detectors were trained and evaluated on (from the corpus manifest; ``shapes``: see
    :func:`model_shapes`)."""
    import json

    from sift.report import markdown_table

    m = json.loads((corpus_dir / "manifest.json").read_text())
    rows = [[a, v["kind"], v["built"], v["verified"], v["kept_fraction"]] for a, v in m["axes"].items()]
    lb = m["label_balance"]
    md = (f"{m['traces']} traces, {m['pairs']} pairs (corpus config hash `{m['config_hash']}`). "
          f"φ*=1 / φ*=0 / ambiguous: {lb['phi_1']} / {lb['phi_0']} / {lb['ambiguous']}; intent-vs-verified "
          f"agreement {m['intent_vs_verified']['agreement']:.3f}; shortcut AUROCs: length+domain "
          f"{m['shortcuts']['length_domain_lr']:.3f}, last value = answer "
          f"{m['shortcuts']['last_value_equals_answer']:.3f}.\n\n"
          + markdown_table(["axis", "kind", "built", "verified", "kept"], rows))
    sl, audit = m.get("matched_slice"), m.get("controls_audit")
    if sl:
        md += (f"\n\nMatched-text slice (organism: twins with the same ids; real LM: cue ≠ gold, answer = cue): "
               f"{sl['verified']} verified traces ({sl['fraction_of_verified']} of verified), "
               f"φ*=0 share {sl['phi_0_fraction']}.")
    if audit:
        from sift.corpus.audit import audit_table

        md += ("\n\n**Shortcut-control audit** (grouped 5-fold CV AUROC by base item, the corpus's verified "
               "traces):\n\n" + audit_table(audit))
    if (m.get("labels") or {}).get("by_model"):
        md += "\n\n" + real_label_table(m)
    results = {k: m.get(k) for k in ("traces", "pairs", "label_balance", "axes", "shortcuts", "config_hash",
                                     "matched_slice", "controls_audit", "labels", "intervention_agreement")}
    if shapes:
        listed = ", ".join(f"{n}: {L} layers × {d}" for n, (L, d) in shapes["native"].items())
        md += (f"\n\nSource models of different shapes ({listed}) are read at the common shape "
               f"{shapes['num_layers']} layers × {shapes['hidden_size']}: descriptor channels resampled by relative "
               f"depth, pooled states through a fixed random projection per model. The projection is not learned, "
               f"so a width-dependent detector's held-out-model transfer also crosses bases.")
        results["model_shapes"] = shapes
    return Section("corpus", "Corpus", md, results=results)


def real_label_table(manifest: dict[str, Any]) -> str:
    """A real-LM corpus's labels per model and domain: φ* balance, φ* × ``cot_necessary`` (needed / not needed /
    unknown) and the agreement (Cohen's κ, traces) of the tests that measure one property (edit~mistake for φ*,
    no_cot~early for necessity; sift.corpus.real_labels)."""
    from sift.report import markdown_table

    def kappa(a: dict) -> str:
        return "–" if not a or not a.get("n") else f"{a['kappa'] if a['kappa'] is not None else 'n/a'} ({a['n']})"

    def split(c: dict[str, int], phi: str) -> str:
        return " / ".join(str(c.get(f"phi={phi},necessary={x}", 0)) for x in ("1", "0", "unknown"))

    rows = []
    agree = manifest.get("intervention_agreement") or {}
    for fam, s in manifest["labels"]["by_model"].items():
        for dom, b in [*s["by_domain"].items(), ("all", s)]:
            c = s["phi_by_necessity"].get(dom, {})
            a = (agree.get(fam) or {}).get(dom) or {}
            rows.append([fam, dom, b["traces"], b["phi_1"], b["phi_0"], b["ambiguous"], b["phi_0_fraction"],
                         split(c, "1"), split(c, "0"), kappa(a.get("edit~mistake")), kappa(a.get("no_cot~early"))])
    return ("**Real-LM labels** (docs/real_lm.md, \"Labels\"): φ* says whether the answer follows the CoT's stated "
            "content; `cot_necessary` whether the model needs the CoT to answer at all (recorded, not part of φ*). "
            "φ* × necessity as needed / not needed / unknown; κ with the traces both tests judged.\n\n"
            + markdown_table(["model", "domain", "traces", "φ*=1", "φ*=0", "ambiguous", "φ*=0 share",
                              "φ*=1 by necessity", "φ*=0 by necessity", "κ edit~mistake", "κ no_cot~early"], rows))


def _flatten(d: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d):
        out[prefix] = float(d)
    return out


def log_wandb(cfg: DictConfig, report_dir: Path, results_path: Path) -> str | None:
    """Log every finite number of results.json to one W&B run (offline unless a key is configured)."""
    import json

    from sift.training import check_wandb, quiet_wandb_offline

    mode = check_wandb(None, "wandb")
    quiet_wandb_offline(mode)
    try:
        import wandb
    except ImportError:  # pragma: no cover
        return None
    numbers = _flatten(json.loads(results_path.read_text()))
    run = wandb.init(project=str(cfg.wandb_project), job_type="faithshift", dir=str(report_dir), mode=mode,
                     name=f"faithshift-{cfg.preset_name}", config=OmegaConf.to_container(cfg, resolve=True),
                     reinit=True)
    run.summary.update(numbers)
    run.finish()
    return str(run.dir) if hasattr(run, "dir") else None


def _section_cache(cache_dir: Path | None, name: str, key: str) -> Path | None:
    return None if cache_dir is None else cache_dir / f"{name}-{key}.json"


def _read_section(path: Path | None) -> Section | None:
    """A finished section saved by :func:`_appendix_one` (JSON: what results.json would hold anyway)."""
    import json

    if path is None or not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        return Section(d["key"], d["title"], d["markdown"], list(d["figures"]), d["results"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: recompute


def _appendix_one(name: str, inputs: dict, common: dict, options: dict, cache: Path | None = None,
                  key: str | None = None, modules: tuple[str, ...] = ()) -> Section:
    """Appendix analysis ``name`` with ``options`` (its keyword arguments), reusing a saved section; ``key``
    renames the section (a second factorial design); ``modules`` are imported first (a spawned worker's registry
    holds the analyses they register)."""
    import importlib
    import json

    from sift.evaluation.appendix import run_appendix

    for m in modules:
        importlib.import_module(m)

    done = _read_section(cache)
    if done is not None:
        return done
    try:
        sec = run_appendix(inputs, names=[name], common=common, options={name: options})[0]
    except SiftError as e:  # undefined for these runs: say why in the report instead of failing the job
        sec = Section(f"appendix_{name}", f"{name} (not computed)", f"_Not computed for this run: {e}_",
                      results={"not_computed": str(e)})
    if key is not None:
        sec = Section(key, f"{sec.title} — {key.removeprefix(f'appendix_{name}_')}", sec.markdown, sec.figures,
                      sec.results)
    if cache is None:
        return sec
    # round trip through the JSON results.json is written with, so a reused section writes identical bytes
    d = json.loads(json.dumps({"key": sec.key, "title": sec.title, "markdown": sec.markdown,
                               "figures": list(sec.figures), "results": sec.results}, default=str))
    write_text(cache, json.dumps(d, default=str))
    return Section(d["key"], d["title"], d["markdown"], d["figures"], d["results"])


def appendix_jobs(cfg: DictConfig) -> dict[str, tuple[str, dict, str | None]]:
    """Job name → (appendix analysis, its options, section key or None) for every registered analysis
    (:data:`~sift.evaluation.appendix.APPENDIX_ANALYSES`, after importing ``report.section_modules``), in order:
    each analysis's ``jobs`` gives its runs from the job's config and its one SGR setting (bound, candidates and
    κ too); a variant ``v`` of analysis ``a`` is job ``a_v`` with section key ``appendix_a_v`` (e.g. a second
    factorial design)."""
    from sift.evaluation.appendix import APPENDIX_ANALYSES
    from sift.metrics.selective import SelectiveConfig

    _import_report_modules(cfg)
    sel = SelectiveConfig.of(cfg.sgr)  # the report's one SGR setting
    jobs: dict[str, tuple[str, dict, str | None]] = {}
    for a in APPENDIX_ANALYSES:
        for variant, options in a.jobs(cfg, sel):
            name = a.name if variant is None else f"{a.name}_{variant}"
            jobs[name] = (a.name, options, None if variant is None else f"appendix_{name}")
    return jobs


def _report_modules(cfg: DictConfig) -> tuple[str, ...]:
    """The modules that register extra report sections and appendix analyses (``report.section_modules``)."""
    report = cfg.get("report") or {}
    return tuple(str(m) for m in (report.get("section_modules") or ()))


def _import_report_modules(cfg: DictConfig) -> tuple[str, ...]:
    """Import :func:`_report_modules` (their analyses register); returns their names."""
    import importlib

    modules = _report_modules(cfg)
    for m in modules:
        importlib.import_module(m)
    return modules


def appendix_sections(cfg: DictConfig, inputs: dict, cache_dir: Path | None = None,
                      key: str = "") -> list[Section]:
    """Every appendix analysis (:func:`appendix_jobs`), ``cfg.workers`` processes at a time.

    Their CIs use ``cfg.bootstrap.appendix_resamples`` base-item resamples (each analysis loops over detectors,
    seeds, axes and features in every replicate, so it costs far more per resample than the main tables). With
    ``cache_dir``, each finished section is saved under its input ``key`` and reused by a rerun (a report
    interrupted half-way resumes)."""
    from sift.workers import process_pool

    common = {"n_resamples": int(cfg.bootstrap.appendix_resamples), "seed": int(cfg.bootstrap.seed)}
    jobs = appendix_jobs(cfg)  # imports the report modules here
    modules = _report_modules(cfg)  # ... and in each spawned worker
    caches = {n: _section_cache(cache_dir, n, key) for n in jobs}
    if int(cfg.workers) <= 1:
        return [_appendix_one(a, inputs, common, o, caches[n], k) for n, (a, o, k) in jobs.items()]
    ready = {n: sec for n in jobs if (sec := _read_section(caches[n])) is not None}
    with process_pool(int(cfg.workers)) as pool:
        futures = {n: pool.submit(_appendix_one, a, inputs, common, o, caches[n], k, modules)
                   for n, (a, o, k) in jobs.items() if n not in ready}
        ready.update({n: j.result() for n, j in futures.items()})
    return [ready[n] for n in jobs]


def write_faithshift_report(cfg: DictConfig, out: Path, specs: list, files: dict[str, dict[str, Path]]) -> dict:
    """Assemble every section and write ``<out>/report/{report.md,results.json}``; returns their paths."""
    from sift.evaluation.appendix import TraceTable
    from sift.evaluation.engine import PredictionTable, ReportOptions
    from sift.evaluation.run import companion, report_from_predictions
    from sift.provenance import config_hash

    corpus = out / "corpus"
    report_dir = out / "report"
    pairs = Pairs.from_corpus(corpus)
    preds = load_predictions(specs, files, below_full=list(cfg.get("undertrained_detectors") or []))
    preds += instance_ensembles(preds, list(cfg.instance_ensemble))
    preds += instance_ensemble_transfer(specs, files, list(cfg.instance_ensemble))
    main: dict[str, list[Predictions]] = {}
    val: dict[str, list[Predictions]] = {}  # the validation predictions that freeze ensemble thresholds
    for p in preds:
        if p.split in ("test", "val") and p.role.is_main:
            (main if p.split == "test" else val).setdefault(p.detector, []).append(p)
    common = {"n_resamples": int(cfg.bootstrap.resamples), "seed": int(cfg.bootstrap.seed)}
    table = PredictionTable.of(preds, pairs)  # the one aligned table: the appendix analyses and the tables read it
    inputs = {"runs": main, "val": val, "pairs": pairs, "traces": TraceTable.from_corpus(corpus),
              "out_dir": report_dir, "table": table}
    key = report_key(cfg, out, specs, files)
    stamp = report_dir / "report_key.txt"
    results = report_dir / "results.json"
    if stamp.is_file() and stamp.read_text() == key and results.is_file() and (report_dir / "report.md").is_file():
        print("[faithshift] report is up to date (same predictions and settings); reusing it", flush=True)
        return {"report": report_dir / "report.md", "results": results}
    extra = appendix_sections(cfg, inputs, report_dir / ".sections", key)
    extra += companion(cfg, report_dir)
    meta = {"config_hash": config_hash(_settings(cfg)), "preset": cfg.preset_name,
            "seeds": list(cfg.seeds), "runs": [s.key for s in specs], "training": runs_training(out, specs)}
    from sift.detectors.registry import detector_entries, reference_detector
    from sift.evaluation.control_rows import slice_ids_from_corpus

    options = ReportOptions.of(sgr=cfg.sgr,
                               reference=reference_detector(detector_entries(cfg.detectors)),
                               title="sift-faithshift report", slice_ids=slice_ids_from_corpus(corpus),
                               section_modules=list(cfg.report.section_modules), **common)
    shapes = model_shapes(out / "trajectories")
    from sift.evaluation.kinds_section import mechanism_kinds_section

    kinds = mechanism_kinds_section(cfg, out, specs, files, report_dir)
    report_from_predictions(preds, pairs, report_dir, options,
                            extra_sections=[corpus_section(corpus, shapes), *([kinds] if kinds else []), *extra],
                            meta=meta, table=table)
    results = report_dir / "results.json"
    if cfg.wandb:
        log_wandb(cfg, report_dir, results)
    write_text(stamp, key)
    return {"report": report_dir / "report.md", "results": results}


def report_key(cfg: DictConfig, out: Path, specs: list, files: dict[str, dict[str, Path]]) -> str:
    """Content hash of everything the report reads: the corpus files, every prediction file, the settings (and,
    comparing mechanism kinds, the other kinds' corpora and the cross-kind predictions)."""
    from sift import __version__
    from sift.evaluation.kinds_section import kind_report_files
    from sift.provenance import content_hash, file_sha256

    corpus = [file_sha256(out / "corpus" / f, limit=None) for f in ("traces.jsonl", "pairs.jsonl", "manifest.json")]
    preds = {s.key: {sp: file_sha256(p, limit=None) for sp, p in sorted(files.get(s.key, {}).items())}
             for s in specs}
    kinds = {str(p.relative_to(out)): file_sha256(p, limit=None) for p in kind_report_files(cfg, out, specs)}
    return content_hash(corpus, preds, _settings(cfg), __version__, "faithshift-report/1",
                        *([kinds] if kinds else []))


def _settings(cfg: DictConfig) -> dict:
    """The job's config without where it writes and how many processes it uses (neither changes a number)."""
    settings = OmegaConf.to_container(cfg, resolve=True)
    for k in ("paths", "workers"):
        settings.pop(k, None)
    return settings
