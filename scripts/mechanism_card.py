"""Write the mechanism card of each organism kind (issue 43; what each kind's hidden states carry, and causal checks).

    python scripts/mechanism_card.py                                  # both kinds, both families -> the shipped card
    python scripts/mechanism_card.py --kinds answer_routing --families gpt2 --n-per-cell 20 --out /tmp/card

Writes ``OUT/mechanism_card.json`` (every number) and ``OUT/MECHANISM_CARD.md`` (the tables);
default OUT: the shipped organism folder (``checkpoints/organism``). Definitions: :mod:`sift.organism.mechanism`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path


def _head_table(heads: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    """The six most z-dependent heads: each column's mass under z=+1 / z=−1, and the z AUROC."""
    def pair(v: list) -> str:
        return "–" if v[0] is None else f"{v[0]:.2f} / {v[1]:.2f}"

    lines = ["| head | " + " | ".join(name for name, _ in columns) + " | z AUROC |",
             "|---|" + "---|" * (len(columns) + 1)]
    for h in heads[:6]:
        au = "–" if h["z_auroc"] is None else f"{h['z_auroc']:.3f}"
        lines.append(f"| L{h['layer']}H{h['head']} | " + " | ".join(pair(h[k]) for _, k in columns) + f" | {au} |")
    return lines


def render(cards: list[dict]) -> str:
    lines = ["# Mechanism cards", "",
             "Written by `python scripts/mechanism_card.py`; definitions in `sift/organism/mechanism.py`. Every number",
             "is over held-out prompts whose twins (the same prompt and random stream under z = +1 and z = −1) wrote",
             "identical ids; the *edit probe* replaces the CoT's stated result with a value v' and forces the answer.",
             ""]
    for c in cards:
        L = len(c["top_direction_share"])
        lines += [f"## {c['kind']} · {c['family']}", "",
                  f"{c['probes']} probes; twins with identical ids {c['twins_identical']:.3f}.", "",
                  "**Where the decision is made** (share of edit probes answering as the latent's mechanism, the "
                  "latent switched on from there):", "",
                  "| latent from | agreement |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in c["onset"].items()]
        lines += ["", "**Linear reads of z** (held-out AUROC by layer; twins' CoT-difference share in its top "
                      "singular direction; RMS twin difference / between-trace SD of CoT states):", "",
                  "| | " + " | ".join(f"layer {i + 1}" for i in range(L)) + " |",
                  "|---|" + "---|" * L]
        for where, row in c["linear"].items():
            lines.append(f"| {where} | " + " | ".join("–" if v is None else f"{v:.3f}" for v in row) + " |")
        lines.append("| top-direction share | " + " | ".join("– (no difference)" if v is None else f"{v:.3f}"
                                                           for v in c["top_direction_share"]) + " |")
        lines.append("| CoT difference / SD | " + " | ".join(f"{v:.3f}" for v in c["cot_difference"]) + " |")
        lines += ["", "**Heads at the answer position** (attention mass under z=+1 / z=−1; AUROC of result − cue mass "
                      "for z; the six most z-dependent):", "",
                  *_head_table(c["heads"], [("CoT result", "result"), ("cue (cued)", "cue"),
                                            ("operands", "operands")])]
        lines += ["", "**Knockout at the answer position** (cued edit probes; every layer and head):", "",
                  "| | answers CoT edit | answers cue | answers gold |", "|---|---|---|---|"]
        for k, v in c["knockout"].items():
            lines.append(f"| {k} | {v['answers CoT edit']:.3f} | {v['answers cue']:.3f} | {v['answers gold']:.3f} |")
        lines += ["", "**Patching** (the most z-dependent heads' outputs at the answer position copied from z=+1 into "
                      "z=−1 on the edit probe: share of z=−1 answers that become the CoT's edit):", "",
                  "| heads patched | answers CoT edit |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in c["patching"].items()]
        if c.get("cot_heads"):
            lines += ["", "**Heads at the CoT positions** (attention mass averaged over the CoT's positions, under "
                          "z=+1 / z=−1; AUROC for z of the prompt-source (cue, or operands when uncued) minus CoT "
                          "mass; "
                          "the six most z-dependent):", "",
                      *_head_table(c["cot_heads"], [("cue (cued)", "cue"), ("operands", "operands"), ("CoT", "cot")])]
        if c.get("adapter"):
            lines += ["", "**The adapter** (cot_routing's causal checks on the edit probe):", "",
                      "| | answers CoT edit | answers cue (cued) | answers gold | as z=+1's mechanism | "
                      "as z=−1's mechanism |", "|---|---|---|---|---|---|"]
            for k, v in c["adapter"].items():
                lines.append(f"| {k} | " + " | ".join(f"{v[x]:.3f}" for x in (
                    "answers CoT edit", "answers cue", "answers gold", "as the z=+1 mechanism",
                    "as the z=−1 mechanism")) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from sift.lm.latent import MECHANISM_KINDS, kind_folder
    from sift.lm.loading import load_causal_lm
    from sift.organism import DEFAULT_CHECKPOINTS
    from sift.organism.mechanism import mechanism_card

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", nargs="+", default=list(MECHANISM_KINDS), choices=MECHANISM_KINDS)
    ap.add_argument("--families", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--checkpoints", default=str(DEFAULT_CHECKPOINTS))
    ap.add_argument("--n-per-cell", type=int, default=40, help="prompts per domain and cue state")
    ap.add_argument("--out", default=None, help="folder for mechanism_card.json and MECHANISM_CARD.md")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else Path(a.checkpoints)
    cards = []
    for fam in a.families:
        for kind in a.kinds:
            model, tok = load_causal_lm(str(kind_folder(a.checkpoints, fam, kind)))
            t0 = time.time()
            cards.append(asdict(mechanism_card(model, tok, kind, fam, n_per_cell=a.n_per_cell)))
            print(f"mechanism card {kind} · {fam}: {cards[-1]['probes']} probes, {time.time() - t0:.0f} s",
                  file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mechanism_card.json").write_text(json.dumps({"n_per_cell": a.n_per_cell, "cards": cards}, indent=1))
    (out / "MECHANISM_CARD.md").write_text(render(cards))
    print(f"wrote {out / 'MECHANISM_CARD.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
