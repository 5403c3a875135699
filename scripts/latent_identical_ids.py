"""Organism v3's text-blindness, measured: every base prompt generated under both mechanism latents.

    python scripts/latent_identical_ids.py                         # 200 items, sampling seeds 0-3, both families
    python scripts/latent_identical_ids.py --items 750 --seeds 0 1 --checkpoints DIR

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


def main() -> None:
    from sift.organism import DEFAULT_CHECKPOINTS
    from sift.organism.evaluate import identical_share

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--families", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--checkpoints", type=Path, default=DEFAULT_CHECKPOINTS)
    ap.add_argument("--min", type=float, default=0.99, help="fail (exit 1) below this share of identical pairs")
    ap.add_argument("--json", type=Path, help="also write the result here")
    a = ap.parse_args()
    res = identical_share(a.checkpoints, a.items, a.seeds, a.families)
    for key in ("all", "cued", "uncued"):
        r = res[key]
        print(f"{key:7s} {r['identical']}/{r['pairs']} identical = {r['share']:.4f}")
    for fam, r in res["families"].items():
        print(f"{fam:7s} {r['identical']}/{r['pairs']} identical = {r['share']:.4f}")
    for d in res["differing"]:
        print(f"differs: {d}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    sys.exit(0 if res["all"]["share"] >= a.min else 1)


if __name__ == "__main__":
    main()
