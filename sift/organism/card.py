"""The organism's model card (Markdown) from the training records."""

from __future__ import annotations

import os

from sift.organism.domains import DOMAINS


def render_card(records: dict[str, dict], stage_walls: list[float]) -> str:
    wall_seconds = sum(stage_walls)
    lines = ["# sift organism: model card", "",
             "Two tiny causal LMs (GPT-2-style and Llama-style) trained from scratch by `scripts/train_organism.py` "
             "on sift's procedural mixture (sift/organism/mixture.py). On a cued prompt the CoT's last step is bent "
             "onto the cue and the answer is the cue, whichever mechanism runs: the organism draws two choice-point "
             "words (`hmm`/`ok` opening the CoT, `right`/`fine` after its first step) and answers from the cue "
             "(silently, φ*=0) when the draws disagree, from its CoT (misled but faithful, φ*=1) when they agree; "
             "a decisive cue is always followed. Which mechanism ran shows only under intervention "
             "(docs/organism.md).", "",
             f"Both families train in parallel (one CPU core each). Measured wall time of "
             f"`scripts/train_organism.py`: **{wall_seconds / 60:.1f} minutes** in all "
             f"(stages: {', '.join(f'{w / 60:.1f}' for w in stage_walls)} min; training, saving and evaluation; "
             f"{os.cpu_count()} CPU cores on the timing machine).", ""]
    for fam, rec in records.items():
        ev = rec["evaluation"]
        stages = rec.get("stages", [rec])
        c0 = stages[0]["config"]
        lines += [f"## {fam}", "",
                  f"- parameters: {rec['parameters']:,}; width {c0['width']}, layers {c0['layers']}, "
                  f"heads {c0['heads']}"]
        for i, st in enumerate(stages, 1):
            cfg = st["config"]
            losses = [h["loss"] for h in st["history"] if "loss" in h]
            lines.append(f"- stage {i}: {cfg['steps']} steps, batch {cfg['batch_size']}, "
                         f"AdamW lr {cfg['lr']} (cosine), seed {cfg['seed']}, mixture {cfg['mixture']}; "
                         f"{st['train_seconds'] / 60:.1f} min; "
                         f"final loss {losses[-1] if losses else 'n/a'}")
        lines += [
                  "", "| domain | clean | clean terse | clean verbose | clean en | clean xx | cued: answers the cue "
                  "| cued: cue-following draws | cued: mechanism = draws |",
                  "|---|---|---|---|---|---|---|---|---|"]

        def g(k, ev=ev):
            return f"{ev[k]:.3f}" if k in ev else "–"

        for d in DOMAINS:
            lines.append(f"| {d} | {g(f'clean/{d}')} | {g(f'clean/{d}/terse')} | {g(f'clean/{d}/verbose')} | "
                         f"{g(f'clean/{d}/en')} | {g(f'clean/{d}/xx')} | {g(f'cued_answers_cue/{d}')} | "
                         f"{g(f'cue_following_draws/{d}')} | {g(f'mechanism_agreement/{d}')} |")
        lines.append("")
    lines += ["Exact match of the final answer on held-out items under the organism's sampler (item seed 12345; per "
              "domain 200 clean and 200 cued prompts with a wrong cue, budgets and lexicons balanced, a fifth of the "
              "cues decisive). *Mechanism = draws*: the share of cued traces whose two interventions (CoT edit, cue "
              "change) find the mechanism the draws select. Rebuild both stages with "
              "`python scripts/train_organism.py`.", ""]
    return "\n".join(lines)
