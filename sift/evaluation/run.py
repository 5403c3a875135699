"""``evaluate(cfg)``: the task behind ``sift-evaluate`` — detectors (or saved predictions) → report.

1. Detectors: each entry of ``cfg.detectors`` is a ``sift-train`` run folder (``results.json``: single run or
   seed ensemble), a folder holding several runs (a sweep: every ``results.json`` below it, ensemble members
   left out), a detector ``.ckpt``, an ensemble file (``ensemble.pt``), a glob of these, or a mapping
   ``{path, name, seed}``. Each is run on the DataModule ``cfg.data`` (``trajectory_dir``/``corpus_dir`` are
   shortcuts) for the splits ``cfg.split`` (test), ``cfg.calib_split`` (val; SGR calibration and thresholds of
   ensembles built here) and, with ``cfg.transfer``, ``transfer``. Predictions are saved as
   ``<output_dir>/predictions/*.npz`` together with the verified pairs (``pairs.npz``).
2. Saved predictions: ``cfg.predictions`` lists ``.npz`` files or folders of them (a ``pairs.npz`` beside
   them is used unless ``corpus_dir`` is given) — no models needed.
3. Sections (the registry of :mod:`sift.evaluation.sections`): main table, ensemble comparison, certified
   selective risk with risk–coverage curves, ablations (runs whose ``meta['ablation']`` differ), transfer
   matrices (runs with ``meta['train_on']``/``meta['test_on']``), and the companion sections when
   ``cfg.companion`` is enabled.
4. ``report.md``, ``results.json`` and the figures in ``output_dir``.

:func:`report_from_predictions` does steps 3–4 for predictions already in memory (the main job's path).
"""

from __future__ import annotations

import glob
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.analysis import CALIB_SPLIT
from sift.evaluation.engine import DEFAULT_COVERAGES, PredictionTable, ReportContext, ReportOptions
from sift.evaluation.predictions import ENSEMBLE_OF, Pairs, Predictions
from sift.report import Section, write_report

PAIRS_FILE = "pairs.npz"


# ------------------------------------------------------------------------------------------- pairs on disk
def save_pairs(pairs: Pairs, path: str | Path) -> Path:
    """Write verified pairs as ``.npz`` (atomic)."""
    from dataclasses import fields

    from sift.atomic import atomic_open

    path = Path(path)
    with atomic_open(path, "wb") as fh:
        np.savez(fh, **{f.name: np.asarray(getattr(pairs, f.name)) for f in fields(pairs)})
    return path


def load_pairs(path: str | Path) -> Pairs:
    from dataclasses import fields

    try:
        with np.load(path, allow_pickle=False) as z:
            return Pairs(**{f.name: z[f.name] for f in fields(Pairs)})
    except (OSError, KeyError, ValueError) as e:
        raise SiftError(f"{path}: not a sift pairs file ({e})") from e


# ------------------------------------------------------------------------------------------- detectors
@dataclass
class DetectorSpec:
    """One detector to evaluate: how to load it, its name and seed (None = ensemble), provenance."""

    path: str
    kind: str  # checkpoint | ensemble
    name: str
    seed: int | None
    meta: dict[str, Any] = field(default_factory=dict)

    def load(self, device: str = "cpu") -> Any:
        from sift.detectors import EnsembleDetector, load_detector

        det = EnsembleDetector.load(self.path) if self.kind == "ensemble" else load_detector(self.path)
        det.eval()
        return det.to(device)


def _ablation(rec: Mapping[str, Any]) -> str | None:
    for o in rec.get("overrides") or []:
        if str(o).startswith("ablation="):
            return str(o).split("=", 1)[1]
    return None


def _from_results(run_dir: Path, rec: Mapping[str, Any], name: str | None, seed: int | None) -> DetectorSpec:
    meta = {"run_dir": str(run_dir), "config_hash": rec.get("config_hash"), "run_hash": rec.get("run_hash"),
            "ablation": _ablation(rec), "data": rec.get("data")}
    if rec.get("kind") == "ensemble":
        path = rec.get("ensemble_file") or str(run_dir / "ensemble.pt")
        meta["member_seeds"] = rec.get("member_seeds")
        meta[ENSEMBLE_OF] = str(rec.get("detector"))
        return DetectorSpec(str(path), "ensemble", name or str(rec.get("detector")), None, meta)
    ckpt = rec.get("best_ckpt") or rec.get("last_ckpt")
    if not ckpt or not Path(ckpt).is_file():
        raise SiftError(f"{run_dir}: results.json names no existing checkpoint ({ckpt!r})")
    s = seed if seed is not None else rec.get("seed")
    return DetectorSpec(str(ckpt), "checkpoint", name or str(rec.get("detector")), None if s is None else int(s), meta)


def resolve_detectors(entries: Iterable[Any]) -> list[DetectorSpec]:
    """Turn ``cfg.detectors`` entries (paths, globs, ``{path, name, seed}``) into :class:`DetectorSpec` s."""
    from sift.checkpoints import check_local, is_remote, load_checkpoint
    from sift.detectors.ensemble import ENSEMBLE_FILE_KEY

    specs: list[DetectorSpec] = []
    for entry in entries:
        if isinstance(entry, Mapping):
            raw, name, seed = str(entry["path"]), entry.get("name"), entry.get("seed")
        else:
            raw, name, seed = str(entry), None, None
        if is_remote(raw):
            check_local(raw, "detector")
        paths = sorted(glob.glob(raw)) if any(c in raw for c in "*?[") else [raw]
        if not paths:
            raise SiftError(f"detector {raw!r}: no such file or folder")
        for p in map(Path, paths):
            if p.is_dir():
                if (p / "results.json").is_file():
                    recs = [(p, json.loads((p / "results.json").read_text()))]
                else:
                    recs = [(r.parent, json.loads(r.read_text())) for r in sorted(p.rglob("results.json"))]
                    recs = [(d, r) for d, r in recs if r.get("kind") != "member" and r.get("status") == "done"
                            and r.get("detector") is not None]
                    if not recs:
                        raise SiftError(f"{p}: no sift-train run (results.json) in this folder")
                specs += [_from_results(d, r, name, seed) for d, r in recs]
            elif p.is_file():
                info = load_checkpoint(p, what="detector checkpoint or ensemble file")
                if isinstance(info, dict) and ENSEMBLE_FILE_KEY in info:
                    ens = info[ENSEMBLE_FILE_KEY]
                    specs.append(DetectorSpec(str(p), "ensemble", name or ens["name"], None,
                                              {"file": str(p), ENSEMBLE_OF: ens.get("of")}))
                    continue
                if not (isinstance(info, dict) and "sift_detector" in info):
                    raise SiftError(f"{p}: not a sift detector checkpoint or ensemble file")
                rec_path = p.parent.parent / "results.json"
                rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {}
                s = seed if seed is not None else rec.get("seed", 0)
                meta = {"file": str(p), "ablation": _ablation(rec), "config_hash": rec.get("config_hash")}
                specs.append(DetectorSpec(str(p), "checkpoint", name or info["sift_detector"]["name"],
                                          None if s is None else int(s), meta))
            else:
                raise SiftError(f"detector {p}: no such file or folder")
    return specs


# ------------------------------------------------------------------------------------------- report
def report_from_predictions(predictions: Sequence[Predictions], pairs: Pairs, out_dir: str | Path,
                            options: ReportOptions | None = None, *, extra_sections: Sequence[Section] = (),
                            meta: Mapping[str, Any] | None = None, write: bool = True,
                            table: PredictionTable | None = None) -> list[Section]:
    """Build every registered section (:mod:`sift.evaluation.sections.registry`) from in-memory predictions,
    append ``extra_sections`` and write ``report.md``/``results.json`` to ``out_dir``.

    ``predictions`` may mix splits; :class:`~sift.evaluation.engine.ReportContext` sorts them: runs on
    ``options.split`` are evaluated; runs on ``options.calib_split`` (default ``"calib"``: validation items held
    out from checkpoint selection and thresholds) calibrate SGR — without them SGR is computed in-sample and the
    report says it is not a certificate; runs on ``options.select_split`` (``"val"``) freeze the thresholds of
    seed ensembles built here; runs on ``transfer`` (or any split whose ``meta['transfer_setting']`` is set) give
    the transfer AUROCs, by ``meta['transfer_setting']`` (default ``"transfer"``). Runs with
    ``meta['train_on']``/``meta['test_on']`` go to transfer matrices (one per detector and ``meta['matrix']``
    setting); those with ``meta['in_dist_of']`` (a transfer run's own in-distribution test split) also give the
    like-for-like transfer gap of that setting. With ``options.slice_ids`` (trace ids of the matched-text slice)
    the detectors and controls get a matched-slice table. ``table``: the aligned table of ``predictions`` and
    ``pairs`` if the caller has it (built here otherwise).
    """
    from sift.evaluation.sections.registry import build_sections

    o = options if options is not None else ReportOptions()
    ctx = ReportContext(list(predictions), pairs, Path(out_dir), o, table)
    sections = build_sections(ctx) + list(extra_sections)
    if not sections:
        raise SiftError(f"nothing to report: no predictions on split {o.split!r} and no transfer matrices")
    if write:
        info = {"split": o.split, "calib_split": o.calib_split if ctx.calib else None,
                "select_split": o.select_split, "n_resamples": o.n_resamples, "bootstrap_seed": o.seed,
                "runs": {k: [{"seed": p.seed, "n": len(p), "threshold": p.threshold} for p in v]
                         for k, v in ctx.test.items()},
                **dict(meta or {})}
        write_report(out_dir, sections, meta=info, title=o.title)
    return sections


# ------------------------------------------------------------------------------------------- the task
def _cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    v = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if v is None else v


def _datamodule(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    from sift.training import instantiate_node

    data = OmegaConf.create(OmegaConf.to_container(cfg.data, resolve=True))
    for k in ("trajectory_dir", "corpus_dir"):
        if cfg.get(k) is not None:
            data[k] = str(cfg[k])
    dm = instantiate_node(data)
    if hasattr(dm, "prepare_data"):
        dm.prepare_data()
    dm.setup("test")
    return dm


def _transfer_name(cfg: Any) -> str:
    if cfg.get("transfer_name"):
        return str(cfg.transfer_name)
    d = cfg.get("data") or {}
    if d.get("holdout_domain"):
        return f"cross-domain ({d.holdout_domain})"
    if d.get("holdout_model"):
        return f"cross-model ({d.holdout_model})"
    return "transfer"


def _has_split(dm: Any, split: str) -> bool:
    try:
        return len(dm.dataset(split)) > 0
    except Exception:
        return False


def _load_saved(entries: Iterable[Any]) -> tuple[list[Predictions], Pairs | None]:
    preds: list[Predictions] = []
    pairs = None
    for entry in entries:
        raw = str(entry)
        paths = sorted(glob.glob(raw)) if any(c in raw for c in "*?[") else [raw]
        if not paths:
            raise SiftError(f"predictions {raw!r}: no such file or folder")
        for p in map(Path, paths):
            files = sorted(p.glob("*.npz")) if p.is_dir() else [p]
            if not p.exists():
                raise SiftError(f"predictions {p}: no such file or folder")
            for f in files:
                if f.name == PAIRS_FILE:
                    pairs = load_pairs(f)
                else:
                    preds.append(Predictions.load(f))
    return preds, pairs


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


def evaluate(cfg: Any) -> dict[str, Any]:
    """Run ``sift-evaluate`` as configured (see the module docstring); returns the results record."""
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    split, calib_split = str(cfg.get("split") or "test"), cfg.get("calib_split")
    select_split = cfg.get("select_split", "val")
    preds: list[Predictions] = []
    pairs: Pairs | None = None
    specs = resolve_detectors(cfg.get("detectors") or [])
    if specs:
        from sift.evaluation.collect import pairs_from_datamodule, predict

        dm = _datamodule(cfg)
        splits = [split] + [str(x) for x in (select_split, calib_split) if x and str(x) != split]
        splits = [s for i, s in enumerate(splits) if s not in splits[:i] and (s != CALIB_SPLIT or _has_split(dm, s))]
        tname = _transfer_name(cfg)
        if cfg.get("transfer", True) and _has_split(dm, "transfer") and "transfer" not in splits:
            splits.append("transfer")
        pdir = out_dir / "predictions"
        for spec in specs:
            det = spec.load(str(cfg.get("device") or "cpu"))
            for s in splits:
                meta = {k: v for k, v in spec.meta.items() if v is not None}
                meta["source"] = spec.path
                if s == "transfer":
                    meta["transfer_setting"] = tname
                p = predict(det, dm, s, name=spec.name, seed=spec.seed, meta=meta)
                tag = "ens" if spec.seed is None else f"seed{spec.seed}"
                ab = meta.get("ablation")
                p.save(pdir / _safe(f"{spec.name}{'__' + ab if ab else ''}__{tag}__{s}.npz"))
                preds.append(p)
            print(f"sift-evaluate: {spec.name} seed={spec.seed} ({spec.kind}) -> {len(splits)} splits")
        corpus = cfg.get("corpus_dir") or (cfg.data.get("corpus_dir") if "data" in cfg else None)
        pairs = Pairs.from_corpus(corpus) if corpus else pairs_from_datamodule(dm)
        save_pairs(pairs, pdir / PAIRS_FILE)
    saved, saved_pairs = _load_saved(cfg.get("predictions") or [])
    preds += saved
    if pairs is None:
        if cfg.get("corpus_dir"):
            pairs = Pairs.from_corpus(cfg.corpus_dir)
        elif saved_pairs is not None:
            pairs = saved_pairs
        else:
            raise SiftError("no verified pairs: give corpus_dir, or predictions folders with a pairs.npz")
    if not preds:
        raise SiftError("nothing to evaluate: give detectors=[...] (run folders, .ckpt, ensemble.pt) "
                        "or predictions=[...] (.npz files or folders)")
    extra = companion(cfg, out_dir)
    options = ReportOptions.of(
        sgr=cfg.sgr, bootstrap=cfg.bootstrap, split=split,
        calib_split=None if calib_split is None else str(calib_split),
        select_split=None if select_split is None else str(select_split),
        coverages=cfg.get("coverages") or DEFAULT_COVERAGES, reference=cfg.get("reference"),
        families=dict(cfg.families) if cfg.get("families") else None, title=str(cfg.get("title") or "sift evaluation"),
        slice_ids=_slice_ids(cfg))
    sections = report_from_predictions(
        preds, pairs, out_dir, options, extra_sections=extra,
        meta={"detectors": [s.__dict__ for s in specs],
              "predictions_from": [str(p) for p in cfg.get("predictions") or []]})
    return {"output_dir": str(out_dir), "sections": [s.key for s in sections],
            "report": str(out_dir / "report.md"), "results": str(out_dir / "results.json"),
            "n_predictions": len(preds)}


def _slice_ids(cfg: Any) -> set[str] | None:
    """The matched-text slice of the corpus the config names (None without a corpus)."""
    from sift.evaluation.control_rows import slice_ids_from_corpus

    corpus = cfg.get("corpus_dir") or (cfg.data.get("corpus_dir") if "data" in cfg and cfg.data else None)
    return slice_ids_from_corpus(corpus) if corpus and (Path(corpus) / "traces.jsonl").is_file() else None


def companion(cfg: Any, out_dir: Path) -> list[Section]:
    """The companion papers' sections (``sift.companion.report.companion_sections``) when ``cfg.companion`` is
    enabled; a missing implementation gives a note section instead of an error."""
    node = cfg.get("companion") if hasattr(cfg, "get") else None
    if not node or node.get("enabled", True) is False or str(node.get("name", "")) == "none":
        return []
    try:
        from sift.companion.report import companion_sections
    except ImportError as e:
        warnings.warn(f"companion sections requested but unavailable ({e})", stacklevel=2)
        return [Section("companion", "Companion analyses", f"_Not available in this installation: {e}_",
                        results={"error": str(e)})]
    return list(companion_sections(cfg, out_dir))
