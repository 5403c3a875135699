"""Retrain both organisms from scratch and write checkpoints/organism/{gpt2,llama} plus the model card.

    python scripts/train_organism.py                 # both families in parallel, one core each
    python scripts/train_organism.py --family gpt2   # one family

Each family trains in its own process (one thread each), then is evaluated on held-out items; the card
(checkpoints/organism/MODEL_CARD.md and card.json) records the training config, wall time and accuracy
per domain, budget and language.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from dataclasses import asdict
from pathlib import Path

from sift.organism.train import TrainConfig


def _train_one(family: str, steps: int, seed: int, out: str, threads: int) -> dict:
    import torch

    from sift.organism.evaluate import organism_report
    from sift.organism.train import train_organism

    torch.set_num_threads(threads)
    cfg = TrainConfig(family=family, steps=steps, seed=seed)
    res = train_organism(cfg, Path(out) / family)
    report = organism_report(res["model"], res["tokenizer"])
    rec = res["record"]
    rec["evaluation"] = report
    (Path(out) / family / "training.json").write_text(json.dumps(rec, indent=2))
    return rec


def write_card(out: Path, records: dict[str, dict], wall: float) -> None:
    from sift.organism.card import render_card

    (out / "card.json").write_text(json.dumps({"wall_seconds": wall, "families": records}, indent=2))
    (out / "MODEL_CARD.md").write_text(render_card(records, wall))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["gpt2", "llama", "both"], default="both")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="checkpoints/organism")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    fams = ["gpt2", "llama"] if a.family == "both" else [a.family]
    t0 = time.time()
    if len(fams) == 1:
        records = {fams[0]: _train_one(fams[0], a.steps, a.seed, str(out), 2)}
    else:
        with mp.get_context("spawn").Pool(2) as pool:
            jobs = {f: pool.apply_async(_train_one, (f, a.steps, a.seed, str(out), 1)) for f in fams}
            records = {f: j.get() for f, j in jobs.items()}
    wall = round(time.time() - t0, 1)
    if a.family == "both":
        write_card(out, records, wall)
    for f, r in records.items():
        print(f"{f}: {r['parameters']} parameters, {r['train_seconds']} s; clean accuracy "
              + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in r["evaluation"].items() if k.count("/") == 1 and k.startswith("clean")))
    print(f"total wall time {wall} s")


if __name__ == "__main__":
    main()
