"""Train an organism from scratch on the mixture (plain PyTorch loop; minutes on 2 CPU cores)."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from sift.errors import SiftError
from sift.lm.adapter import QueryAdapter
from sift.organism.domains import LABELS
from sift.organism.latent import (
    answer_id_of,
    attach_adapter,
    attach_direction,
    check_kind,
    injected,
    latent_value,
    load_direction,
    save_direction,
)
from sift.organism.mixture import Example, MixtureConfig, sample_example, sample_twins
from sift.organism.models import build_model
from sift.organism.tokenizer import build_tokenizer, organism_vocabulary


@dataclass
class TrainConfig:
    family: str = "gpt2"
    steps: int = 1800
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    width: int = 128
    layers: int = 4
    heads: int = 4
    answer_weight: float = 3.0
    match_weight: float = 1.0  # loss weight of the multiple-choice match label (``so <label> ;``)
    micro_batches: int = 4  # length-sorted gradient accumulation: the same gradient, less padding to compute
    latent_scale: float = 0.5  # initial norm of the (learned) mechanism latent direction (sift.organism.latent)
    # weight of the text-invariance term: the symmetric KL between the next-token distributions under the two
    # latents, at every generated position of natural examples (their targets are the same under both)
    invariance_weight: float = 0.0
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    init_from: str | None = None  # stage 2: continue from these weights (a saved organism folder)
    # where the latent enters (sift.lm.latent.MECHANISM_KINDS): ``offset`` trains the residual direction (v3);
    # ``cot_routing`` trains a query adapter on ``adapter_heads`` of ``adapter_layers`` at CoT positions only, on
    # twin pairs (each draw under both latents), with ``mean_weight`` × the class-mean penalty on the CoT states
    mechanism_kind: str = "offset"
    adapter_layers: tuple[int, ...] = (1, 2)
    adapter_heads: tuple[int, ...] = (0, 1)
    adapter_rank: int = 4
    mean_weight: float = 0.0
    adapter_lr_scale: float = 10.0  # the adapter's learning rate relative to ``lr`` (it starts from zero)
    # the penalty's weight ramps linearly from 0 at step ``mean_ramp[0]`` to ``mean_weight`` at ``mean_ramp[1]``:
    # the routing forms first, then is pushed out of any static direction
    mean_ramp: tuple[int, int] = (0, 0)


def stage3_config(family: str, init_from: str, seed: int = 0, stage: int = 3) -> TrainConfig:
    """Stages 3–4: the mechanism switch. The two mechanisms write the same text, so only the drills carry it,
    and only the latent tells the mechanisms apart: stage 3 raises the drills' share on a mixture of cued and
    uncued prompts; stage 4 consolidates on mostly uncued prompts, where the multiple-choice match (``so
    <label>``, up-weighted like the answer) must be read from the elimination lines rather than copied from a
    cue, and where the direct computation of mechanism 0 is learnt."""
    p_cue, steps = {3: (0.6, 700), 4: (0.35, 500), 5: (0.7, 500)}[stage]
    mix = MixtureConfig(p_cue=p_cue, p_decisive=0.15, p_edit=0.25, p_swap=0.25, p_truncate=0.15)
    return TrainConfig(family=family, steps=steps, lr=1.5e-3 if stage < 4 else 1e-3 if stage == 4 else 5e-4,
                       warmup=50, seed=seed + stage - 1, init_from=init_from, match_weight=3.0 if stage >= 4 else 1.0,
                       invariance_weight=1.0 if stage == 5 else 0.0, mixture=mix)


#: the cot_routing schedule per family: (steps, lr, penalty weight, penalty ramp). Llama needs a gentler one: at
#: gpt2's (lr 1e-3, weight 20 reached by step 600) its text collapsed (ids identical under both latents 0.05-0.67,
#: clean accuracy 0.15-0.83; measured), at lr 5e-4 and weight 5 reached by step 900 it keeps both
COT_ROUTING_SCHEDULE = {"gpt2": (1200, 1e-3, 20.0, (150, 600)), "llama": (1400, 5e-4, 5.0, (300, 900))}


def cot_routing_config(family: str, init_from: str, seed: int = 0) -> TrainConfig:
    """The ``cot_routing`` organism: from the v3 weights (its language, domains and cue following), the latent
    moved from the residual stream into a query adapter at CoT positions; drills teach the answer to read the
    decision from the CoT's states, the twins' KL keeps the text the same under both latents, and the class-mean
    penalty (ramped in once the routing has formed) keeps any static direction out of the CoT states."""
    if family not in COT_ROUTING_SCHEDULE:
        raise SiftError(f"no cot_routing schedule for family {family!r} (have {', '.join(COT_ROUTING_SCHEDULE)})")
    steps, lr, weight, ramp = COT_ROUTING_SCHEDULE[family]
    mix = MixtureConfig(p_cue=0.5, p_decisive=0.15, p_edit=0.25, p_swap=0.25, p_truncate=0.15)
    return TrainConfig(family=family, steps=steps, lr=lr, warmup=50, seed=seed + 10, init_from=init_from,
                       match_weight=3.0, invariance_weight=1.0, mechanism_kind="cot_routing", mean_weight=weight,
                       mean_ramp=ramp, micro_batches=2, mixture=mix)


def stage2_config(family: str, init_from: str, seed: int = 0) -> TrainConfig:
    """Stage 2: a cue-heavy mixture at a lower learning rate on top of stage 1 (cue-following appears late
    and abruptly in these models, as docs/design.md §4 reports for the prototype)."""
    return TrainConfig(family=family, steps=900, lr=1.5e-3, warmup=50, seed=seed + 1, init_from=init_from,
                       mixture=MixtureConfig(p_cue=0.85, p_decisive=0.2, p_edit=0.2, p_swap=0.2))


def encode(examples: list[Example], tok, answer_weight: float, match_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask, per-token loss weights (completion only; answer up-weighted; a drill's
    only target is its answer), and each row's latent value and first CoT position."""
    rows, weights = [], []
    for ex in examples:
        p = tok.convert_tokens_to_ids(["<bos>"] + ex.prompt)
        c = tok.convert_tokens_to_ids(ex.completion + ["<eos>"])
        rows.append(p + c)
        w = [0.0] * len(p) + [0.0 if ex.drill else 1.0] * len(c)
        w[-2] = answer_weight  # the answer value
        for i, t in enumerate(ex.completion[:-1]):
            if t in LABELS and ex.completion[i + 1] == ";" and not ex.drill:
                w[len(p) + i] = match_weight  # the multiple-choice match label (``so <label> ;``)
        weights.append(w)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    wts = torch.zeros((len(rows), width))
    for i, (r, w) in enumerate(zip(rows, weights)):
        ids[i, : len(r)] = torch.tensor(r)
        wts[i, : len(w)] = torch.tensor(w)
    attn = (ids != tok.pad_token_id).long()
    latent = torch.tensor([latent_value(ex.mechanism) for ex in examples])
    starts = torch.tensor([len(ex.prompt) + 1 for ex in examples])  # bos + prompt: the first CoT position
    answers = torch.tensor([len(ex.prompt) + 1 + _answer_index(ex.completion) for ex in examples])
    natural = torch.tensor([not ex.drill for ex in examples])[:, None]
    return {"input_ids": ids, "attention_mask": attn, "weights": wts, "latent": latent, "latent_start": starts,
            "answer_pos": answers, "invariant": (wts > 0) & natural}


def _answer_index(completion: list[str]) -> int:
    """The index of the answer line's first word (the last ``answer``) in a completion."""
    return max(i for i, t in enumerate(completion) if t == "answer")


#: parts of the CoT whose class means the cot_routing penalty equalises: thirds by position, the last CoT
#: position, and the whole CoT (pooled)
N_COT_PARTS = 5


def cot_part_masks(starts: torch.Tensor, answers: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, T, N_COT_PARTS]`` 0/1 masks of each row's CoT positions (``starts[b] ≤ t < answers[b]``) by part."""
    t = torch.arange(width)[None]
    cot = (t >= starts[:, None]) & (t < answers[:, None])
    n = (answers - starts).clamp_min(1)[:, None]
    third = ((t - starts[:, None]) * 3 // n).clamp(0, 2)
    parts = [cot & (third == k) for k in range(3)] + [t == (answers[:, None] - 1), cot]
    return torch.stack(parts, -1).float()


def class_mean_penalty(hidden: tuple[torch.Tensor, ...], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ over layers and CoT parts of an unbiased estimate of ‖E[d]‖² / E‖h‖², where ``d`` is a twin pair's
    difference (z=+1 row minus z=−1 row; twins are rows 2i and 2i+1) of its part-pooled states: with twins
    sharing every token, E[d] = 0 for every part is the class means being equal, so no linear read of the
    pooled or single-part states separates the latents on average."""
    masks = cot_part_masks(batch["latent_start"], batch["answer_pos"], batch["input_ids"].shape[1])
    sign = batch["latent"][0::2]
    if not (torch.all(batch["latent"][0::2] == -batch["latent"][1::2])):
        raise SiftError("class_mean_penalty: rows 2i and 2i+1 must be twins under opposite latents")
    m = masks[0::2]  # [P, T, K] (twins share positions)
    cnt = m.sum(1).clamp_min(1)  # [P, K]
    n = m.shape[0]
    total = hidden[0].new_zeros(())
    for h in hidden[1:]:
        d = (h[0::2] - h[1::2]) * sign[:, None, None]  # [P, T, W]: z=+1 minus z=−1
        pooled = torch.einsum("ptk,ptw->pkw", m, d) / cnt[..., None]  # [P, K, W]
        s = pooled.sum(0)
        unbiased = ((s * s).sum(-1) - (pooled * pooled).sum((0, 2))) / (n * (n - 1))  # [K]
        scale = (h.detach() ** 2).sum(-1)[masks[..., -1] > 0].mean().clamp_min(1e-6)
        total = total + unbiased.sum() / scale
    return total


def weighted_lm_loss(model, batch: dict[str, torch.Tensor], normaliser: torch.Tensor | None = None,
                     invariance_weight: float = 0.0, invariance_normaliser: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted next-token NLL of ``batch`` with each row's latent injected, divided by ``normaliser``
    (default: the batch's total weight); plus ``invariance_weight`` × the mean symmetric KL between the
    next-token distributions under the row's latent and under the other one, over the generated positions of
    natural examples (whose targets are the same under both latents: the text must not depend on it)."""
    with injected(model, batch["latent"], batch["latent_start"]):
        out = model(input_ids=batch["input_ids"])
    logits = out.logits[:, :-1]
    target = batch["input_ids"][:, 1:]
    w = batch["weights"][:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
    loss = (nll * w.reshape(-1)).sum() / (w.sum() if normaliser is None else normaliser)
    if invariance_weight > 0:
        with injected(model, -batch["latent"], batch["latent_start"]):
            other = model(input_ids=batch["input_ids"]).logits[:, :-1]
        lp, lq = logits.log_softmax(-1), other.log_softmax(-1)
        kl = 0.5 * ((lp.exp() * (lp - lq)).sum(-1) + (lq.exp() * (lq - lp)).sum(-1))
        m = batch["invariant"][:, 1:].to(kl.dtype)
        loss = loss + invariance_weight * (kl * m).sum() / (m.sum() if invariance_normaliser is None
                                                             else invariance_normaliser)
    return loss


def twin_lm_loss(model, batch: dict[str, torch.Tensor], normaliser: torch.Tensor, invariance_weight: float,
                 invariance_normaliser: torch.Tensor, mean_weight: float, n_pairs_total: int) -> torch.Tensor:
    """The ``cot_routing`` loss on twin rows (2i: z=+1, 2i+1: z=−1; one forward pass): the weighted NLL, the
    symmetric KL between the twins' next-token distributions at natural examples' generated positions (the text
    must not depend on ``z``), and ``mean_weight`` × :func:`class_mean_penalty` (weighted by this micro-batch's
    share of the batch's pairs)."""
    with injected(model, batch["latent"], batch["latent_start"], kind="cot_routing"):
        out = model(input_ids=batch["input_ids"], output_hidden_states=mean_weight > 0)
    logits = out.logits[:, :-1]
    target = batch["input_ids"][:, 1:]
    w = batch["weights"][:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
    loss = (nll * w.reshape(-1)).sum() / normaliser
    if invariance_weight > 0:
        lp, lq = logits[0::2].log_softmax(-1), logits[1::2].log_softmax(-1)
        kl = 0.5 * ((lp.exp() * (lp - lq)).sum(-1) + (lq.exp() * (lq - lp)).sum(-1))
        m = (batch["invariant"][0::2, 1:] & batch["invariant"][1::2, 1:]).to(kl.dtype)
        loss = loss + invariance_weight * 2 * (kl * m).sum() / invariance_normaliser
    if mean_weight > 0:
        share = (batch["input_ids"].shape[0] // 2) / n_pairs_total
        loss = loss + mean_weight * share * class_mean_penalty(out.hidden_states, batch)
    return loss


def length_sorted_chunks(examples: list[Example], n: int) -> list[list[Example]]:
    """Split a batch into ``n`` micro-batches of similar length (so each pads to its own, shorter, width)."""
    order = sorted(examples, key=lambda e: len(e.prompt) + len(e.completion))
    size = math.ceil(len(order) / max(1, n))
    return [order[i : i + size] for i in range(0, len(order), size)]


def length_sorted_pair_chunks(pairs: list[tuple[Example, Example]], n: int) -> list[list[tuple[Example, Example]]]:
    """:func:`length_sorted_chunks` for twin pairs (twins have the same length)."""
    order = sorted(pairs, key=lambda p: len(p[0].prompt) + len(p[0].completion))
    size = math.ceil(len(order) / max(1, n))
    return [order[i : i + size] for i in range(0, len(order), size)]


def accumulate_batch_loss(model, examples: list[Example], tok, answer_weight: float, micro_batches: int,
                          match_weight: float = 1.0, invariance_weight: float = 0.0, twins: bool = False,
                          mean_weight: float = 0.0) -> float:
    """Backpropagate the whole batch's weighted loss through length-sorted micro-batches; returns the loss.

    Every micro-batch is normalised by the weight of the full batch, so the accumulated gradient equals
    the gradient of ``weighted_lm_loss`` on the whole batch padded to one width (right padding: causal
    attention never lets pads reach real tokens)."""
    if twins:  # keep each pair together, rows 2i and 2i+1
        pairs = [(examples[i], examples[i + 1]) for i in range(0, len(examples), 2)]
        chunks = [[e for pr in c for e in pr] for c in length_sorted_pair_chunks(pairs, micro_batches)]
    else:
        chunks = length_sorted_chunks(examples, micro_batches)
    parts = [encode(chunk, tok, answer_weight, match_weight) for chunk in chunks]
    total = sum(p["weights"][:, 1:].sum() for p in parts)
    inv_total = sum(p["invariant"][:, 1:].sum() for p in parts).clamp_min(1)
    loss = 0.0
    for part in parts:
        if twins:
            piece = twin_lm_loss(model, part, total, invariance_weight, inv_total, mean_weight, len(examples) // 2)
        else:
            piece = weighted_lm_loss(model, part, total, invariance_weight, inv_total)
        piece.backward()
        loss += piece.item()
    return loss


def train_organism(cfg: TrainConfig, out_dir: str | Path | None = None, log_every: int = 100,
                   eval_every: int = 0, eval_fn=None) -> dict:
    """Train one family; returns the training record (and saves model + tokenizer if ``out_dir``)."""
    torch.manual_seed(cfg.seed)
    torch.set_flush_denormal(True)  # tiny-model training on CPU otherwise slows down on denormal floats
    rng = random.Random(cfg.seed)
    if cfg.init_from:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.init_from, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(cfg.init_from, local_files_only=True)
    else:
        tok = build_tokenizer(organism_vocabulary())
        model = build_model(cfg.family, len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id,
                            cfg.width, cfg.layers, cfg.heads)
    twins = check_kind(cfg.mechanism_kind) == "cot_routing"
    if cfg.mechanism_kind == "answer_routing":
        raise SiftError("answer_routing is not trained: it runs the offset weights, the latent from the answer line")
    if twins:  # the latent lives in a query adapter at CoT positions; nothing enters the residual stream
        direction = QueryAdapter(model.config.hidden_size, model.config.num_attention_heads, cfg.adapter_layers,
                                 cfg.adapter_heads, cfg.adapter_rank)
        attach_adapter(model, direction, answer_id_of(tok))
        params = list(model.parameters()) + list(direction.parameters())
        groups = [{"params": list(model.parameters()), "scale": 1.0},
                  {"params": list(direction.parameters()), "scale": cfg.adapter_lr_scale}]
    else:
        direction = load_direction(cfg.init_from) if cfg.init_from else None
        if direction is None:  # a fresh latent direction of norm ``latent_scale``
            direction = torch.randn(model.config.hidden_size)
            direction = direction * (cfg.latent_scale / direction.norm())
        direction = torch.nn.Parameter(direction)
        attach_direction(model, direction, answer_id_of(tok))
        params = list(model.parameters()) + [direction]
        groups = [{"params": params, "scale": 1.0}]
    opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        prog = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * prog)))

    t0 = time.time()
    history = []
    model.train()
    bar = tqdm(range(cfg.steps), desc=f"train {cfg.family}", mininterval=5)
    running = 0.0
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step) * g["scale"]
        if twins:
            examples = [e for _ in range(cfg.batch_size // 2) for e in sample_twins(rng, cfg.mixture)]
        else:
            examples = [sample_example(rng, cfg.mixture) for _ in range(cfg.batch_size)]
        opt.zero_grad(set_to_none=True)
        r0, r1 = cfg.mean_ramp
        ramp = 1.0 if r1 <= r0 else min(1.0, max(0.0, (step - r0) / (r1 - r0)))
        loss = accumulate_batch_loss(model, examples, tok, cfg.answer_weight, cfg.micro_batches, cfg.match_weight,
                                     cfg.invariance_weight, twins, cfg.mean_weight * ramp)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        running = 0.98 * running + 0.02 * loss if step else loss
        if (step + 1) % log_every == 0:
            history.append({"step": step + 1, "loss": round(running, 4), "seconds": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{running:.3f}")
        if eval_every and eval_fn is not None and (step + 1) % eval_every == 0:
            history.append({"step": step + 1, "eval": eval_fn(model, tok)})
            print(json.dumps(history[-1]), flush=True)
            model.train()
    record = {"config": asdict(cfg), "train_seconds": round(time.time() - t0, 1), "history": history,
              "parameters": sum(p.numel() for p in model.parameters())}
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        if twins:
            direction.save(out_dir)
        else:
            save_direction(out_dir, direction)
        tok.save_pretrained(out_dir)
        (out_dir / "training.json").write_text(json.dumps(record, indent=2))
    return {"model": model, "tokenizer": tok, "record": record}
