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
        lines += ["", *_evaluation_table(ev), ""]
    lines += ["Exact match of the final answer on held-out items under the organism's sampler (item seed 12345; per "
              "domain 200 clean and 200 cued prompts with a wrong cue, budgets and lexicons balanced, a fifth of the "
              "cues decisive), each prompt under a mechanism latent (half of each). *Ids identical*: the share of "
              "prompts whose generated ids (CoT and answer) are the same when the other latent is injected. "
              "*Mechanism = latent*: the share of traces whose interventions (CoT edit; on cued prompts also a cue "
              "change) find the mechanism the latent selects (uncued: CoT read vs answer computed directly). Rebuild "
              "every stage with "
              "`python scripts/train_organism.py`.", ""]
    return "\n".join(lines)


def _evaluation_table(ev: dict) -> list[str]:
    """One family's accuracy and mechanism table (rows per domain) from
    :func:`sift.organism.evaluate.organism_report`."""
    def g(k: str) -> str:
        return f"{ev[k]:.3f}" if k in ev else "–"

    lines = ["| domain | clean | clean terse | clean verbose | clean en | clean xx | cued: answers the cue "
             "| ids identical under both latents | uncued: mechanism = latent | cued: mechanism = latent |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in DOMAINS:
        lines.append(f"| {d} | {g(f'clean/{d}')} | {g(f'clean/{d}/terse')} | {g(f'clean/{d}/verbose')} | "
                     f"{g(f'clean/{d}/en')} | {g(f'clean/{d}/xx')} | {g(f'cued_answers_cue/{d}')} | "
                     f"{g(f'identical_ids/{d}')} | {g(f'mechanism_agreement/clean/{d}')} | "
                     f"{g(f'mechanism_agreement/cued/{d}')} |")
    return lines


def render_cot_routing_card(records: dict[str, dict], walls: dict[str, float]) -> str:
    """The ``cot_routing`` organism's model card (``cot_routing/MODEL_CARD.md``); ``walls``: each family's measured
    wall seconds (training, saving and evaluation)."""
    lines = ["# sift organism, mechanism kind `cot_routing`: model card", "",
             "Trained by `python scripts/train_organism.py --kind cot_routing` on top of the v3 weights "
             "(`../<family>`: their language, domains and cue following). Nothing is added to the residual stream: "
             "a latent-gated low-rank adapter on the queries of a few heads (`mechanism_adapter.safetensors`, "
             "sift/lm/adapter.py) acts at the CoT's positions only, so the latent changes what the CoT-time "
             "computation reads and the answer line must read the decision from the CoT's states. The training "
             "draws every example under both latents (twins): the symmetric KL between the twins keeps the text the "
             "same, and a penalty equalises the class means of the CoT states per layer and part of the CoT "
             "(sift/organism/train.py `class_mean_penalty`), so no static direction carries the latent. What the "
             "states carry and the causal checks: `../MECHANISM_CARD.md`.", "",
             "`scripts/train_organism.py --kind cot_routing` trains both families in parallel (one CPU core each). "
             "Measured wall time per family (training, saving and evaluation; "
             f"{os.cpu_count()} CPU cores on the timing machine): "
             + ", ".join(f"{f} **{w / 60:.1f} min**" for f, w in walls.items()) + ".", ""]
    for fam, rec in records.items():
        cfg = rec["config"]
        lines += [f"## {fam}", "",
                  f"- adapter: layers {cfg['adapter_layers']} (0-based), heads {cfg['adapter_heads']}, rank "
                  f"{cfg['adapter_rank']}; {cfg['steps']} steps, batch {cfg['batch_size']} ({cfg['batch_size'] // 2} "
                  f"twin pairs), AdamW lr {cfg['lr']} (adapter ×{cfg['adapter_lr_scale']}), class-mean penalty "
                  f"weight {cfg['mean_weight']} (ramped over steps {cfg['mean_ramp'][0]}–{cfg['mean_ramp'][1]}), KL "
                  f"weight {cfg['invariance_weight']}, seed {cfg['seed']}; {rec['train_seconds'] / 60:.1f} min", "",
                  *_evaluation_table(rec["evaluation"]), ""]
    return "\n".join(lines)
