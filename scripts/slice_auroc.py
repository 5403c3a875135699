"""One detector run's AUROC on every split and on each split's matched slice, from its best checkpoint.

    sift-train detector=text_sift data.trajectory_dir=T paths.output_dir=RUN ...
    python scripts/slice_auroc.py RUN                      # prints a JSON line per split
    python scripts/slice_auroc.py RUN --json out.json

The slice is the corpus's stored ``matched_slice`` flag (``sift.corpus.audit``), read from the run's corpus; the
AUROC is sift's one kernel (``sift.metrics.classification.auroc_kernel``). This is how ``docs/controls.md``
measured ``text_sift`` on the organism-v2 corpus (the check that it reads what the linear controls miss).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def slice_aurocs(run_dir: str | Path, splits: tuple[str, ...] = ("val", "calib", "test")) -> dict:
    """{split: {auroc, n, slice_auroc, slice_n, slice_items}} of the run's best checkpoint."""
    import numpy as np
    from omegaconf import OmegaConf

    from sift.corpus.audit import in_matched_slice
    from sift.detectors.module import load_detector
    from sift.errors import SiftError
    from sift.evaluation.collect import predict
    from sift.metrics.classification import auroc_kernel
    from sift.training import load_results, setup_data
    from sift.trajectories.cache import read_manifest

    run_dir = Path(run_dir)
    rec = load_results(run_dir)
    if rec is None:
        raise SiftError(f"{run_dir}: no results.json (not a finished sift-train run)")
    ckpt = rec.get("best_ckpt") or rec.get("last_ckpt")
    cfg = OmegaConf.create(rec["config"])
    det = load_detector(ckpt, trusted=[str(cfg.detector._target_)])
    dm = setup_data(cfg)
    corpus = getattr(dm, "corpus_dir", None)
    if corpus is None:  # the corpus the trajectories were extracted from
        corpus = read_manifest(cfg.data.trajectory_dir)["corpus"]["dir"]
    corpus = Path(corpus)
    flags = {}
    with open(corpus / "traces.jsonl") as f:
        for line in f:
            r = json.loads(line)
            flags[str(r["trace_id"])] = in_matched_slice(r)
    out = {"run": str(run_dir), "detector": rec.get("detector"), "training": rec.get("training", {}).get("reason")}
    for s in splits:
        p = predict(det, dm, s)
        if not len(p):
            continue
        m = np.array([flags.get(str(t), False) for t in p.trace_id])
        y, prob = np.asarray(p.label, int), np.asarray(p.prob, float)
        out[s] = {"auroc": round(float(auroc_kernel(prob, y)), 4), "n": int(len(y)),
                  "slice_auroc": round(float(auroc_kernel(prob[m], y[m])), 4) if m.any() else None,
                  "slice_n": int(m.sum()), "slice_items": int(len(set(p.base_item[m].tolist())))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--json", default=None, help="also write the result here")
    a = ap.parse_args(argv)
    from sift.errors import SiftError

    try:
        res = slice_aurocs(a.run_dir)
    except SiftError as e:
        print(f"slice_auroc: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
