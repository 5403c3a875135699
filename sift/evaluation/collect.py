"""Collect the analysis inputs from a trained detector and a DataModule: :class:`Predictions` and :class:`Pairs`.

``predict(detector, datamodule, split, name, seed)`` runs the detector over the DataModule's ordered loader of
``split`` and records, per trace, P(faithful), the verified label and the metadata the analyses group by
(base item, domain, source model, condition), with the detector's frozen threshold.
``pairs_from_datamodule(datamodule)`` turns the DataModule's verified pair indices into trace-id pairs, for
DataModules without a corpus folder (e.g. the synthetic one); with a corpus use ``Pairs.from_corpus``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sift.errors import SiftError
from sift.evaluation.predictions import Pairs, Predictions

LOADERS = {"val": "val_dataloader", "calib": "calib_dataloader", "test": "test_dataloader",
           "transfer": "transfer_dataloader"}


def split_loader(datamodule: Any, split: str) -> Any:
    """The ordered loader of ``split`` (row i = example i of ``datamodule.dataset(split)``)."""
    if split == "train":
        return datamodule.train_flat_dataloader(shuffle=False)
    fn = LOADERS.get(split)
    if fn is None:
        raise SiftError(f"unknown split {split!r}; expected train, val, calib, test or transfer")
    if not hasattr(datamodule, fn):
        raise SiftError(f"{type(datamodule).__name__} has no {fn}() (split {split!r})")
    return getattr(datamodule, fn)()


def _names(datamodule: Any, attr: str, ids: np.ndarray, prefix: str) -> np.ndarray:
    names = getattr(datamodule, attr, None)
    if names:
        return np.array([names[i] if 0 <= i < len(names) else f"{prefix}{i}" for i in ids.tolist()], dtype=object)
    return np.array([f"{prefix}{i}" for i in ids.tolist()], dtype=object)


def trace_conditions(datamodule: Any, trace_ids: Sequence[str], env: np.ndarray) -> np.ndarray:
    """Condition per trace: ``datamodule.condition_of(trace_id)`` when the DataModule has it (the trajectory
    DataModule), else the environment name (``env_names[env]``; ids beyond it are ``"shifted"``), with trace
    ids ending in ``/altered`` marked ``"altered"`` (the synthetic DataModule's convention)."""
    if hasattr(datamodule, "condition_of"):
        return np.array([datamodule.condition_of(t) for t in trace_ids], dtype=object)
    names = list(getattr(datamodule, "env_names", None) or [])
    out = []
    for t, e in zip(trace_ids, env.tolist()):
        if str(t).endswith("/altered"):
            out.append("altered")
        else:
            out.append(names[e] if 0 <= e < len(names) else "shifted")
    return np.array(out, dtype=object)


def check_data_fits(detector: Any, datamodule: Any) -> None:
    """The DataModule gives the descriptor channels and pooled width the detector was trained on. The trajectory
    DataModule maps source models of different shapes onto the common shape of *its* models, so another model
    set can change both; a SiftError says so (rather than a shape error, or a silent misreading)."""
    want_c, have_c = list(getattr(detector, "channel_names", []) or []), getattr(datamodule, "channel_names", None)
    want_d, have_d = int(getattr(detector, "pooled_dim", 0) or 0), getattr(datamodule, "pooled_dim", None)
    problems = []
    if want_c and have_c is not None and list(have_c) != want_c:
        problems.append(f"{len(want_c)} channels ({want_c[0]} … {want_c[-1]}) were trained on, the data gives "
                        f"{len(have_c)}" + (f" ({have_c[0]} … {have_c[-1]})" if have_c else ""))
    if want_d and have_d is not None and int(have_d) != want_d:
        problems.append(f"pooled width {want_d} was trained on, the data gives {have_d}")
    if problems:
        shape = getattr(datamodule, "common_shape", None)
        where = (f" (the DataModule's common shape is {shape['num_layers']} layers × {shape['hidden_size']} over "
                 f"models {', '.join(shape['native'])})" if isinstance(shape, dict) else "")
        raise SiftError(f"detector {type(detector).__name__} does not fit this data: {'; '.join(problems)}{where}; "
                        f"evaluate on the source models (and drop_channels) it was trained with")


def predict(detector: Any, datamodule: Any, split: str = "test", name: str | None = None,
            seed: int | None = None, meta: dict[str, Any] | None = None) -> Predictions:
    """Per-trace predictions of ``detector`` (a :class:`~sift.detectors.DetectorModule`) on ``split``.

    ``name`` defaults to the detector's ``detector_name``; ``seed`` None marks an ensemble. The threshold is
    the detector's frozen ``threshold`` (never retuned here).
    """
    if hasattr(datamodule, "setup"):
        datamodule.setup("test")
    check_data_fits(detector, datamodule)
    out = detector.predict_loader(split_loader(datamodule, split))
    name = name or getattr(detector, "detector_name", None) or type(detector).__name__
    if not out:
        empty = np.zeros(0)
        return Predictions(name, seed, split, float(detector.threshold), empty.astype(str), empty.astype(str),
                           empty.astype(str), empty.astype(str), empty.astype(str), empty.astype(int), empty,
                           meta=dict(meta or {}))
    tid = [str(t) for t in out["trace_id"]]
    if len(set(tid)) != len(tid):
        raise SiftError(f"{split} split: trace ids are not unique (needed to match pairs)")
    env = out["env"].numpy().astype(int)
    return Predictions(
        detector=name, seed=seed, split=split, threshold=float(detector.threshold),
        trace_id=np.array(tid, dtype=object).astype(str), base_item=np.array(out["base_item"]).astype(str),
        domain=_names(datamodule, "domain_names", out["domain"].numpy().astype(int), "domain").astype(str),
        model=_names(datamodule, "model_names", out["model"].numpy().astype(int), "model").astype(str),
        condition=trace_conditions(datamodule, tid, env).astype(str),
        label=out["label"].numpy().astype(int), prob=out["prob"].numpy().astype(float),
        meta={"detector_class": type(detector).__name__, **(meta or {})})


def pairs_from_datamodule(datamodule: Any,
                          splits: Sequence[str] = ("val", "calib", "test", "transfer")) -> Pairs:
    """Verified pairs of the DataModule's ``splits`` (``datamodule.pairs(split)``) by trace id."""
    cols: dict[str, list] = {k: [] for k in ("axis", "kind", "source_id", "shifted_id", "phi_source",
                                              "phi_shifted", "base_item")}
    for split in splits:
        try:
            ps = datamodule.pairs(split)
        except (KeyError, SiftError):
            continue
        if not ps:
            continue
        ds = datamodule.dataset(split)
        for p in ps:
            src, dst = ds[p.source], ds[p.shifted]
            cols["axis"].append(p.axis)
            cols["kind"].append(p.kind)
            cols["source_id"].append(src.trace_id)
            cols["shifted_id"].append(dst.trace_id)
            cols["phi_source"].append(int(p.phi_source))
            cols["phi_shifted"].append(int(p.phi_shifted))
            cols["base_item"].append(src.base_item)
    return Pairs(**{k: np.array(v, dtype=int if k.startswith("phi") else str) for k, v in cols.items()})
