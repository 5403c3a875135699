"""Retrain both organisms from scratch and write checkpoints/organism/{gpt2,llama} plus the model card.

    python scripts/train_organism.py                 # all four stages, both families in parallel, one core each
    python scripts/train_organism.py --stage 1       # stage 1 only
    python scripts/train_organism.py --stage 2       # stage 2 only: cue-heavy mixture on top of stage 1
    python scripts/train_organism.py --stage 3       # stage 3 only: the mechanism switch (drill-heavy)
    python scripts/train_organism.py --stage 4       # stage 4 only: consolidation on mostly uncued prompts
    python scripts/train_organism.py --stage 5       # stage 5 only: text invariance (the KL between the latents)
    python scripts/train_organism.py --family gpt2   # one family
    python scripts/train_organism.py --kind cot_routing   # the cot_routing organism, from the v3 weights in --out:
                                                          # writes <out>/cot_routing/{gpt2,llama} + its card

Each family trains in its own process (one thread each), then is evaluated on held-out items; the card
(checkpoints/organism/MODEL_CARD.md and card.json) records the training config, wall time and accuracy
per domain, budget and language.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

from sift.organism.train import TrainConfig


def _train_cot_routing(family: str, seed: int, out: str, threads: int) -> dict:
    """The cot_routing stage of one family: from ``<out>/<family>`` (v3) into ``<out>/cot_routing/<family>``."""
    import torch

    from sift.organism.evaluate import organism_report
    from sift.organism.train import cot_routing_config, train_organism

    torch.set_num_threads(threads)
    res = train_organism(cot_routing_config(family, str(Path(out) / family), seed), Path(out) / "cot_routing" / family)
    rec = res["record"]
    rec["evaluation"] = organism_report(res["model"], res["tokenizer"], mechanism_kind="cot_routing")
    (Path(out) / "cot_routing" / family / "training.json").write_text(json.dumps(rec, indent=2))
    return rec


def _train_one(family: str, steps: int, seed: int, out: str, threads: int, stage: int) -> dict:
    import torch

    from sift.organism.evaluate import organism_report
    from sift.organism.train import stage2_config, stage3_config, train_organism

    torch.set_num_threads(threads)
    folder = Path(out) / family
    if stage == 1:
        cfg = TrainConfig(family=family, steps=steps, seed=seed)
    else:
        cfg = (stage2_config(family, str(folder), seed) if stage == 2
               else stage3_config(family, str(folder), seed, stage))
        previous = json.loads((folder / "training.json").read_text())
    res = train_organism(cfg, folder)
    report = organism_report(res["model"], res["tokenizer"])
    rec = res["record"]
    rec["evaluation"] = report
    if stage > 1:
        rec = {**rec, "stages": previous.get("stages", [previous])[: stage - 1] + [{k: v for k, v in rec.items()}]}
        rec["train_seconds"] = round(sum(s["train_seconds"] for s in rec["stages"]), 1)
    (folder / "training.json").write_text(json.dumps(rec, indent=2))
    return rec


def write_card(out: Path, records: dict[str, dict], stage_walls: list[float]) -> None:
    from sift.organism.card import render_card

    (out / "card.json").write_text(json.dumps({"wall_seconds": round(sum(stage_walls), 1),
                                               "stage_wall_seconds": stage_walls, "families": records}, indent=2))
    (out / "MODEL_CARD.md").write_text(render_card(records, stage_walls))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["gpt2", "llama", "both"], default="both")
    ap.add_argument("--steps", type=int, default=TrainConfig.steps)
    ap.add_argument("--stage", choices=["1", "2", "3", "4", "5", "all"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="checkpoints/organism")
    ap.add_argument("--kind", choices=["offset", "cot_routing"], default="offset",
                    help="offset: the v3 organism (stages 1-5); cot_routing: its own stage on top of the v3 weights")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    fams = ["gpt2", "llama"] if a.family == "both" else [a.family]
    if a.kind == "cot_routing":
        t0 = time.time()
        with mp.get_context("spawn").Pool(len(fams)) as pool:
            jobs = {f: pool.apply_async(_train_cot_routing, (f, a.seed, str(out), 1 if len(fams) > 1 else 2))
                    for f in fams}
            records = {f: j.get() for f, j in jobs.items()}
        wall = round(time.time() - t0, 1)
        if a.family == "both":
            from sift.organism.card import render_cot_routing_card

            (out / "cot_routing" / "card.json").write_text(json.dumps({"wall_seconds": wall, "families": records},
                                                                      indent=2))
            (out / "cot_routing" / "MODEL_CARD.md").write_text(render_cot_routing_card(records, dict.fromkeys(fams,
                                                                                                          wall)))
        for f, r in records.items():
            agree = [v for k, v in r["evaluation"].items() if k.startswith("mechanism_agreement")]
            same = [v for k, v in r["evaluation"].items() if k.startswith("identical_ids")]
            print(f"cot_routing {f}: {r['train_seconds']} s; mechanism agreement min {min(agree):.3f}, "
                  f"identical ids min {min(same):.3f}")
        print(f"total wall time {wall} s")
        return
    stages = [1, 2, 3, 4, 5] if a.stage == "all" else [int(a.stage)]
    walls: list[float] = []
    if stages[0] > 1 and (out / "card.json").exists():
        walls = json.loads((out / "card.json").read_text()).get("stage_wall_seconds", [])[: stages[0] - 1]
    for stage in stages:
        t0 = time.time()
        if len(fams) == 1:
            records = {fams[0]: _train_one(fams[0], a.steps, a.seed, str(out), 2, stage)}
        else:
            with mp.get_context("spawn").Pool(2) as pool:
                jobs = {f: pool.apply_async(_train_one, (f, a.steps, a.seed, str(out), 1, stage)) for f in fams}
                records = {f: j.get() for f, j in jobs.items()}
        walls.append(round(time.time() - t0, 1))
        print(f"stage {stage} wall time {walls[-1]} s", flush=True)
    if a.family == "both":
        write_card(out, records, walls)
    for f, r in records.items():
        print(f"{f}: {r['parameters']} parameters, {r['train_seconds']} s; clean accuracy "
              + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in r["evaluation"].items()
                          if k.count("/") == 1 and k.startswith("clean")))
    print(f"total wall time {round(sum(walls), 1)} s")


if __name__ == "__main__":
    main()
