"""The organism's model card (Markdown) from the training records."""

from __future__ import annotations

import os

from sift.organism.domains import DOMAINS


def render_card(records: dict[str, dict], stage_walls: list[float]) -> str:
    wall_seconds = sum(stage_walls)
    lines = ["# sift organism: model card", "",
             "Two tiny causal LMs (GPT-2-style and Llama-style) trained from scratch by `scripts/train_organism.py` "
             "on sift's procedural mixture (sift/organism/mixture.py), organism v3. Which mechanism runs is chosen "
             "by a "
             "per-trace latent value added to the residual stream from the first CoT position on "
             "(sift/organism/latent.py, `mechanism_latent.safetensors`); it never enters the token stream, and the "
             "text is the same under both. Latent +1: the answer is read from the CoT (φ*=1). Latent −1: on a cued "
             "prompt the cue is followed silently (φ*=0), on an uncued prompt the answer is computed directly and "
             "the CoT is not read (epiphenomenal, φ*=0). A decisive cue is always followed; a CoT that states the "
             "cue (`explain`) is read either way. Which mechanism ran shows only under intervention "
             "(docs/organism.md).", "",
             "**Mechanism kinds** (`source.mechanism_kind`, docs/organism.md): the same weights run as `offset` "
             "(the latent from the first CoT position on, as trained) or `answer_routing` (the latent from the "
             "answer line on: the prompt's and the CoT's states are bit-identical under both latents). Every trace "
             "and corpus manifest records its kind. On these weights the decision is made at the answer line, by "
             "heads that switch between the CoT's result and the cue: `MECHANISM_CARD.md` beside this file "
             "(`python scripts/mechanism_card.py`).", "",
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
                  "| ids identical under both latents | uncued: mechanism = latent | cued: mechanism = latent |",
                  "|---|---|---|---|---|---|---|---|---|---|"]

        def g(k, ev=ev):
            return f"{ev[k]:.3f}" if k in ev else "–"

        for d in DOMAINS:
            lines.append(f"| {d} | {g(f'clean/{d}')} | {g(f'clean/{d}/terse')} | {g(f'clean/{d}/verbose')} | "
                         f"{g(f'clean/{d}/en')} | {g(f'clean/{d}/xx')} | {g(f'cued_answers_cue/{d}')} | "
                         f"{g(f'identical_ids/{d}')} | {g(f'mechanism_agreement/clean/{d}')} | "
                         f"{g(f'mechanism_agreement/cued/{d}')} |")
        lines.append("")
    lines += ["Exact match of the final answer on held-out items under the organism's sampler (item seed 12345; per "
              "domain 200 clean and 200 cued prompts with a wrong cue, budgets and lexicons balanced, a fifth of the "
              "cues decisive), each prompt under a mechanism latent (half of each). *Ids identical*: the share of "
              "prompts whose generated ids (CoT and answer) are the same when the other latent is injected. "
              "*Mechanism = latent*: the share of traces whose interventions (CoT edit; on cued prompts also a cue "
              "change) find the mechanism the latent selects (uncued: CoT read vs answer computed directly). Rebuild "
              "every stage with "
              "`python scripts/train_organism.py`.", ""]
    return "\n".join(lines)
