"""Organism v3's text-blindness, measured: every base prompt generated under both mechanism latents.

    python scripts/latent_identical_ids.py                         # 200 items, sampling seeds 0-3, both families
    python scripts/latent_identical_ids.py --items 750 --seeds 0 1 --checkpoints DIR
    python scripts/latent_identical_ids.py --kinds cot_routing      # one mechanism kind (default: every kind)

For each base prompt of the corpus items (cued and uncued, the corpus's own base views) and each sampling seed,
the organism generates twice with the same random stream: once with the latent forced to mechanism 1 (the answer
is read from the CoT) and once to mechanism 0 (the cue is followed, or the answer computed directly). The script
prints the share of prompts whose generated ids (CoT and answer) are identical, overall, for cued and uncued
prompts and per family, and lists the first differing pairs. Exit status 1 when the share is below ``--min``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def identical_share(checkpoints, n_items: int, seeds: list[int], families: list[str], kind: str = "offset") -> dict:
    """Generate every base prompt of the first ``n_items`` corpus items under both mechanism latents with the same
    random stream (per sampling seed) and count identical generated ids, overall, cued/uncued and per family
    (``scripts/latent_identical_ids.py``), the latent entering as mechanism ``kind``."""

    from sift.corpus.conditions import base_view
    from sift.corpus.config import OrganismCorpusConfig
    from sift.corpus.sources.organism import corpus_items
    from sift.organism.latent import kind_folder, latent_value
    from sift.organism.source import OrganismSource

    cfg = OrganismCorpusConfig(n_items=n_items)
    items = corpus_items(cfg)
    views = [base_view(it, cfg.seed, cfg.cue) for it in items]
    out: dict = {"kind": kind, "items": len(items), "seeds": seeds, "families": {}, "differing": []}
    tot = {"all": [0, 0], "cued": [0, 0], "uncued": [0, 0]}
    for fam in families:
        src = OrganismSource.load(fam, kind_folder(checkpoints, fam, kind), kind)
        prompts = [src.prompt_ids(it, v) for it, v in zip(items, views)]
        fam_tot = [0, 0]
        for seed in seeds:
            streams = [f"{seed}:{it.item_id}" for it in items]  # the corpus's item streams under this seed
            gen = {m: src.generate(prompts, do_sample=True, streams=streams, latents=[latent_value(m)] * len(items))
                   for m in (0, 1)}
            for it, v, a, b in zip(items, views, gen[0], gen[1]):
                same = a == b
                cue_state = "cued" if v.cue_value is not None else "uncued"
                for key in ("all", cue_state):
                    tot[key][0] += same
                    tot[key][1] += 1
                fam_tot[0] += same
                fam_tot[1] += 1
                if not same and len(out["differing"]) < 10:
                    out["differing"].append({"family": fam, "seed": seed, "item": it.item_id,
                                             "mechanism_1": " ".join(src.words(b)),
                                             "mechanism_0": " ".join(src.words(a))})
        out["families"][fam] = {"identical": fam_tot[0], "pairs": fam_tot[1], "share": fam_tot[0] / fam_tot[1]}
    for key, (same, n) in tot.items():
        out[key] = {"identical": same, "pairs": n, "share": same / n if n else None}
    return out


def main() -> None:
    from sift.organism import DEFAULT_CHECKPOINTS
    from sift.organism.latent import MECHANISM_KINDS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--families", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    ap.add_argument("--min", type=float, default=0.99, help="fail (exit 1) below this share of identical pairs")
    ap.add_argument("--json", type=Path, help="also write the result here")
    ap.add_argument("--kinds", nargs="+", default=list(MECHANISM_KINDS), choices=MECHANISM_KINDS)
    a = ap.parse_args()
    ok, results = True, []
    for kind in a.kinds:
        res = identical_share(a.checkpoints, a.items, a.seeds, a.families, kind)
        results.append(res)
        for key in ("all", "cued", "uncued"):
            r = res[key]
            print(f"{kind} {key:7s} {r['identical']}/{r['pairs']} identical = {r['share']:.4f}")
        for fam, r in res["families"].items():
            print(f"{kind} {fam:7s} {r['identical']}/{r['pairs']} identical = {r['share']:.4f}")
        for d in res["differing"]:
            print(f"{kind} differs: {d}")
        ok &= res["all"]["share"] >= a.min
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
