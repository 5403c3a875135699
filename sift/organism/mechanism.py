"""The mechanism card of an organism kind: where the decision is made, what the hidden states carry, and causal checks
that the evidence is the mechanism (issue 43; ``scripts/mechanism_card.py`` writes it).

Held-out prompts (cued with an ordinary cue, and uncued; every domain, budget and lexicon) are generated under both
latents with one random stream per prompt (*twins*); only twins with identical ids are used, so every difference
between them is the latent's. For each prompt the **edit probe** replaces the CoT's stated result with another value
``v'`` (≠ the cue) and forces ``answer :``: the CoT reader answers ``v'``, the cue follower the cue, the direct
computer the true result. The card measures, per kind:

* **onset**: the latent switched on only from CoT step k on (k = 0 is the CoT's first token; ``answer`` is the answer
  line; ``never`` leaves it out): the share of probes whose answer is the one the latent's mechanism gives;
* **probes**: per layer, the best linear read of z (logistic regression, fitted on half of the items, AUROC on the
  other half) from one CoT position (the last CoT token), from the mean over CoT positions, and from the answer
  position (the ``:`` that predicts the answer); and the share of the twins' CoT-state differences in their top
  singular direction (1.0: one planted direction; 0 differences: the CoT is blind to z);
* **heads**: per layer and head, the attention mass at the answer position on the CoT's stated result, the cue and
  the operands, under each z, and how well that mass separates z (AUROC);
* **causal checks** on the edit probe: knock out the answer position's attention to the CoT's result or to the cue
  (every layer and head) — a z × knocked-out-source table of what the answer follows; and patch the most
  z-dependent heads' outputs at the answer position from the z=+1 run into the z=−1 run (the top 1, 2, 3, 6, then
  every head) — the share of answers that flip to the CoT's ``v'``.
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sift.errors import SiftError
from sift.lm.generation import left_padded
from sift.lm.latent import check_kind, injected, latent_value
from sift.lm.states import capture, head_outputs, knockout, text_config
from sift.organism.domains import DOMAINS, make_item
from sift.organism.render import BUDGETS, CUE_FORMATS, LANGUAGES, View, question_words, render_prompt
from sift.organism.sampling import sample_choice_points
from sift.organism.source import last_value_index, split_completion, value_space


@dataclass
class Probe:
    """One held-out prompt's twin pair and its edit probe (ids without padding; positions in those ids)."""

    domain: str
    cued: bool
    prompt_ids: list[int]
    cot_ids: list[int]
    edited_ids: list[int]  # prompt + CoT with the stated result replaced by ``edit`` + ``answer :``
    answer: str  # the twins' (shared) generated answer
    gold: str
    cue: str | None
    edit: str
    result_pos: int  # the CoT's stated result in ``edited_ids``
    cue_pos: list[int]  # the cue's tokens in the prompt
    operand_pos: list[int]  # the question's value tokens
    step_starts: list[int]  # first position of each CoT step (``;``-separated), in ``edited_ids``
    item: str = ""


@dataclass
class Card:
    kind: str
    family: str
    probes: int
    twins_identical: float
    onset: dict[str, float] = field(default_factory=dict)
    linear: dict[str, list[float | None]] = field(default_factory=dict)
    top_direction_share: list[float | None] = field(default_factory=list)
    cot_difference: list[float] = field(default_factory=list)
    heads: list[dict] = field(default_factory=list)
    knockout: dict[str, dict[str, float]] = field(default_factory=dict)
    patching: dict[str, float] = field(default_factory=dict)
    cot_heads: list[dict] = field(default_factory=list)
    adapter: dict[str, dict[str, float]] = field(default_factory=dict)


def _prompts(tok, n_per_cell: int, seed: int) -> list[tuple[str, bool, object, View, list[int]]]:
    rng = random.Random(seed)
    rows = []
    for d in DOMAINS:
        for i in range(n_per_cell * 2):
            it = make_item(d, seed, i)
            cued = i % 2 == 1
            v = View(template=rng.randrange(2), language=LANGUAGES[(i // 2) % 2], budget=BUDGETS[(i // 4) % 2])
            if cued:
                v = v.with_(cue_value=rng.choice([x for x in it.answer_space if x != it.answer]),
                            cue_format=CUE_FORMATS[(i // 2) % 4])
            words = render_prompt(it, v)
            rows.append((d, cued, it, v, [tok.bos_token_id] + tok.convert_tokens_to_ids(words)))
    return rows


def build_probes(model, tok, kind: str, n_per_cell: int = 40, seed: int = 4242) -> tuple[list[Probe], float]:
    """Twin pairs of held-out prompts with identical ids under ``kind`` and their edit probes; also the share of
    prompts whose twins were identical."""
    rows = _prompts(tok, n_per_cell, seed)
    ids = [r[4] for r in rows]
    streams = [f"card:{seed}:{i}" for i in range(len(rows))]
    gen = {m: sample_choice_points(model, ids, streams, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                                   max_new_tokens=64, latents=[latent_value(m)] * len(ids), kind=kind)
           for m in (0, 1)}
    probes, same = [], 0
    for (d, cued, it, v, p), a, b in zip(rows, gen[0], gen[1]):
        if a != b:
            continue
        same += 1
        words = tok.convert_ids_to_tokens(a)
        cot, answer = split_completion(words)
        j = last_value_index(cot)
        if answer is None or j is None:
            continue
        space = value_space(cot[j]) or ()
        edit = next((x for x in it.answer_space if x not in (cot[j], answer, v.cue_value, it.answer)), None)
        if edit is None or edit not in space:
            continue
        cot_ids = a[:len(cot)]
        edited = p + cot_ids[:j] + tok.convert_tokens_to_ids([edit]) + cot_ids[j + 1:] + \
            tok.convert_tokens_to_ids(["answer", ":"])
        header = 1 + 1 + (1 if v.explain else 0)  # bos + budget (+ explain)
        q = question_words(it, v)
        cue_pos = list(range(header + len(q), len(p) - 2)) if cued else []
        operand = [header + k for k, w in enumerate(q) if value_space(w) is not None]
        starts = [len(p)] + [len(p) + k + 1 for k, w in enumerate(cot) if w == ";" and k + 1 < len(cot)]
        probes.append(Probe(d, cued, p, cot_ids, edited, answer, it.answer, v.cue_value, edit, len(p) + j, cue_pos,
                            operand, starts, it.item_id))
    return probes, same / max(1, len(rows))


# ------------------------------------------------------------------------------------------------ forward helpers

def _padded(seqs: Sequence[Sequence[int]], pad: int):
    ids, mask, pos = left_padded(seqs, pad)
    off = torch.tensor([ids.shape[1] - len(s) for s in seqs])
    return ids, mask, pos, off


@torch.no_grad()
def _answers(model, tok, probes: Sequence[Probe], z: Sequence[float], starts: Sequence[int], kind: str, *,
             drop: Sequence[Sequence[int]] | None = None, patch=None) -> list[str]:
    """The greedy answer after each probe's edited prefix, the latent ``z`` entering at ``starts`` (positions of the
    unpadded ids) as ``kind``; ``drop``: key positions the answer position may not attend to; ``patch``: head
    outputs at the answer position to overwrite (:func:`sift.lm.states.head_outputs`)."""
    seqs = [p.edited_ids for p in probes]
    ids, mask, pos, off = _padded(seqs, tok.pad_token_id)
    last = torch.full((len(seqs),), ids.shape[1] - 1)
    ctx = []
    if drop is not None:
        d = torch.zeros(len(seqs), ids.shape[1], ids.shape[1], dtype=torch.bool)
        for b, ks in enumerate(drop):
            for k in ks:
                d[b, -1, int(off[b]) + k] = True
        ctx.append(knockout(model, d))
    if patch is not None:  # {head: values} at the answer position, or ({head: values}, [B, S] mask of positions)
        vals, where = patch if isinstance(patch, tuple) else (patch, last)
        ctx.append(head_outputs(model, where, vals))
    with injected(model, list(z), list(starts), kind=kind):
        for c in ctx:
            c.__enter__()
        try:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        finally:
            for c in reversed(ctx):
                c.__exit__(None, None, None)
    return tok.convert_ids_to_tokens(logits.argmax(-1).tolist())


def _expected(p: Probe, z: float) -> str:
    """The answer the latent's mechanism gives on the edit probe."""
    if z > 0:
        return p.edit
    return p.cue if p.cued else p.gold


def _auroc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    if len(pos) == 0 or len(neg) == 0:
        return None
    from sklearn.metrics import roc_auc_score

    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    return float(roc_auc_score(y, np.r_[pos, neg]))


# ------------------------------------------------------------------------------------------------ the measurements

def onset_curve(model, tok, probes: Sequence[Probe], kind: str) -> dict[str, float]:
    """Mechanism agreement with the latent switched on from CoT step k on (offset rule from that position), from the
    answer line on, under the card's own ``kind``, and never."""
    out: dict[str, float] = {}
    n_steps = min(len(p.step_starts) for p in probes)
    answer_at = [len(p.edited_ids) - 2 for p in probes]  # the ``answer`` token
    # offset rule from step k on; cot_routing: its adapter from step k on, up to the answer line (from the answer
    # line on it is off: that plan is ``never``)
    rule = "cot_routing" if kind == "cot_routing" else "offset"
    plans = {f"step {k}": (rule, [p.step_starts[k] for p in probes]) for k in range(n_steps)}
    if rule == "offset":
        plans["answer line"] = ("offset", answer_at)
    plans[f"as {kind}"] = (kind, [len(p.prompt_ids) for p in probes])
    for name, (k, starts) in plans.items():
        agree = []
        for z in (1.0, -1.0):
            got = _answers(model, tok, probes, [z] * len(probes), starts, k)
            agree += [g == _expected(p, z) for p, g in zip(probes, got)]
        out[name] = round(float(np.mean(agree)), 4)
    got = _answers(model, tok, probes, [0.0] * len(probes), [len(p.prompt_ids) for p in probes], rule)
    out["never (z = 0): answers the CoT"] = round(float(np.mean([g == p.edit for p, g in zip(probes, got)])), 4)
    return out


@torch.no_grad()
def _states(model, tok, probes: Sequence[Probe], z: float, kind: str) -> dict[str, torch.Tensor]:
    """Per layer: the last CoT token's state, the CoT mean, the answer position's state ``[N, L, d]``, and the CoT
    states themselves (ragged: a list of ``[L, T, d]``) of the natural (unedited) traces under latent ``z``."""
    L = int(text_config(model).num_hidden_layers)
    seqs = [p.prompt_ids + p.cot_ids + tok.convert_tokens_to_ids(["answer", ":"]) for p in probes]
    ids, mask, pos, off = _padded(seqs, tok.pad_token_id)
    with injected(model, [z] * len(seqs), [len(p.prompt_ids) for p in probes], kind=kind), \
            capture(model, blocks=range(L)) as cap:
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    H = torch.stack([cap.states[i].float() for i in range(L)], 1)  # [N, L, S, d]
    last, mean, ans, cots = [], [], [], []
    for b, p in enumerate(probes):
        o, c0 = int(off[b]), len(p.prompt_ids)
        c1 = c0 + len(p.cot_ids)
        cot = H[b, :, o + c0:o + c1]
        cots.append(cot)
        last.append(cot[:, -1])
        mean.append(cot.mean(1))
        ans.append(H[b, :, o + len(seqs[b]) - 1])
    return {"last CoT token": torch.stack(last), "CoT mean": torch.stack(mean), "answer position": torch.stack(ans),
            "cot": cots}


def linear_reads(model, tok, probes: Sequence[Probe], kind: str) -> tuple[dict[str, list[float | None]],
                                                                         list[float | None], list[float]]:
    """Per layer: held-out AUROC of a logistic regression reading z (split by item), the twins' top-direction share
    of the CoT differences, and the CoT difference's RMS norm relative to the between-trace SD of CoT states."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    plus, minus = _states(model, tok, probes, 1.0, kind), _states(model, tok, probes, -1.0, kind)
    L = plus["CoT mean"].shape[1]
    test = np.array([zlib.crc32(p.item.encode()) % 2 == 0 for p in probes])  # a stable split by item
    if test.all() or not test.any():
        raise SiftError("mechanism card: too few probes to split by item")
    reads: dict[str, list[float | None]] = {}
    for where in ("last CoT token", "CoT mean", "answer position"):
        row = []
        for ly in range(L):
            X = torch.cat([plus[where][:, ly], minus[where][:, ly]]).numpy()
            y = np.r_[np.ones(len(probes)), np.zeros(len(probes))]
            t = np.r_[test, test]
            if np.allclose(X[: len(probes)], X[len(probes):]):
                row.append(0.5)  # identical states under both latents: no read is possible (ties)
                continue
            clf = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000))
            clf.fit(X[~t], y[~t])
            s = clf.decision_function(X[t])
            row.append(round(_auroc(s[y[t] == 1], s[y[t] == 0]), 4))
        reads[where] = row
    share, rel = [], []
    for ly in range(L):
        diffs = torch.cat([(a[ly] - b[ly]) for a, b in zip(plus["cot"], minus["cot"])])  # [ΣT, d]
        states = torch.cat([a[ly] for a in plus["cot"]])
        norm = float(diffs.pow(2).sum())
        sd = float(states.std(0).pow(2).sum().sqrt())
        rel.append(round(float(diffs.pow(2).sum(-1).mean().sqrt()) / max(sd, 1e-12), 4))
        if norm == 0.0:
            share.append(None)
            continue
        s = torch.linalg.svdvals(diffs)
        share.append(round(float(s[0] ** 2 / s.pow(2).sum()), 4))
    return reads, share, rel


@torch.no_grad()
def head_masses(model, tok, probes: Sequence[Probe], kind: str) -> list[dict]:
    """Per layer and head: mean attention mass at the answer position (on the edit probe's prefix) on the CoT's
    result, the cue and the operands under z = ±1, and the AUROC of the result-minus-cue mass for z."""
    L = int(text_config(model).num_hidden_layers)
    seqs = [p.edited_ids for p in probes]
    ids, mask, pos, off = _padded(seqs, tok.pad_token_id)
    S = ids.shape[1]
    mass: dict[float, torch.Tensor] = {}
    for z in (1.0, -1.0):
        with injected(model, [z] * len(seqs), [len(p.prompt_ids) for p in probes], kind=kind), \
                capture(model, attention=range(L), q_start=S - 1, heads="all") as cap:
            model(input_ids=ids, attention_mask=mask, position_ids=pos)
        m = torch.zeros(len(seqs), L, int(text_config(model).num_attention_heads), 3)
        for b, p in enumerate(probes):
            o = int(off[b])
            for ly in range(L):
                a = cap.attention[ly][b, :, -1]  # [H, S]
                m[b, ly, :, 0] = a[:, o + p.result_pos]
                m[b, ly, :, 1] = a[:, [o + k for k in p.cue_pos]].sum(-1) if p.cue_pos else 0.0
                m[b, ly, :, 2] = a[:, [o + k for k in p.operand_pos]].sum(-1) if p.operand_pos else 0.0
        mass[z] = m
    out = []
    cued = np.array([p.cued for p in probes])
    for ly in range(L):
        for h in range(mass[1.0].shape[2]):
            sp, sm = mass[1.0][:, ly, h], mass[-1.0][:, ly, h]
            out.append({"layer": ly + 1, "head": h,
                        "result": [round(float(sp[:, 0].mean()), 3), round(float(sm[:, 0].mean()), 3)],
                        "cue": [round(float(sp[cued, 1].mean()), 3) if cued.any() else None,
                                round(float(sm[cued, 1].mean()), 3) if cued.any() else None],
                        "operands": [round(float(sp[:, 2].mean()), 3), round(float(sm[:, 2].mean()), 3)],
                        "z_auroc": _auroc((sp[:, 0] - sp[:, 1]).numpy(), (sm[:, 0] - sm[:, 1]).numpy())})
    return sorted(out, key=lambda r: -abs((r["z_auroc"] or 0.5) - 0.5))


#: how many of the most z-dependent heads the patching curve copies from z=+1 into z=−1 (then every head)
PATCH_SIZES = (0, 1, 2, 3, 6)


def causal_checks(model, tok, probes: Sequence[Probe], kind: str, heads: Sequence[tuple[int, int]]
                  ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Knockout table (z × knocked-out source → share answering the CoT's edit / the cue / the gold) on cued probes,
    and the patching check: the ``heads``' outputs at the answer position copied from the z=+1 run into the z=−1
    run; the share of z=−1 answers that become the CoT's edit (and, as the control, with no head patched)."""
    cued = [p for p in probes if p.cued]
    starts = [len(p.prompt_ids) for p in cued]
    table: dict[str, dict[str, float]] = {}
    for z in (1.0, -1.0):
        for name, drop in (("nothing", None), ("CoT result", [[p.result_pos] for p in cued]),
                           ("cue", [p.cue_pos for p in cued])):
            got = _answers(model, tok, cued, [z] * len(cued), starts, kind, drop=drop)
            table[f"z={z:+.0f}, knock out {name}"] = {
                "answers CoT edit": round(float(np.mean([g == p.edit for p, g in zip(cued, got)])), 4),
                "answers cue": round(float(np.mean([g == p.cue for p, g in zip(cued, got)])), 4),
                "answers gold": round(float(np.mean([g == p.gold for p, g in zip(cued, got)])), 4)}
    all_starts = [len(p.prompt_ids) for p in probes]
    seqs = [p.edited_ids for p in probes]
    ids, mask, pos, off = _padded(seqs, tok.pad_token_id)
    last = torch.full((len(seqs),), ids.shape[1] - 1)
    with torch.no_grad(), injected(model, [1.0] * len(seqs), all_starts, kind=kind), \
            head_outputs(model, last) as donor:
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    curve = {}
    for k in [*[n for n in PATCH_SIZES if n < len(heads)], len(heads)]:
        chosen = list(heads[:k])
        got = _answers(model, tok, probes, [-1.0] * len(probes), all_starts, kind,
                       patch={h: donor[h] for h in chosen} if chosen else None)
        name = "none" if k == 0 else "every head" if k == len(heads) else f"top {k}: " + ", ".join(
            f"L{ly + 1}H{h}" for ly, h in chosen)
        curve[name] = round(float(np.mean([g == p.edit for p, g in zip(probes, got)])), 4)
    return table, curve


def _cot_mask(probes: Sequence[Probe], off: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, S]`` True at each edit probe's CoT positions (padded coordinates; the answer line excluded)."""
    m = torch.zeros(len(probes), width, dtype=torch.bool)
    for b, p in enumerate(probes):
        o = int(off[b])
        m[b, o + len(p.prompt_ids):o + len(p.edited_ids) - 2] = True
    return m


@torch.no_grad()
def cot_head_masses(model, tok, probes: Sequence[Probe], kind: str, chunk: int = 64) -> list[dict]:
    """Per layer and head: mean attention mass *at the CoT's positions* (the edit probe's CoT, averaged over its
    positions) on the cue, the operands and the CoT itself under z = ±1, and the AUROC of the per-trace cue-minus-CoT
    mass (uncued traces: operands-minus-CoT) for z; where ``cot_routing``'s adapter acts."""
    L = int(text_config(model).num_hidden_layers)
    H = int(text_config(model).num_attention_heads)
    mass = {z: torch.zeros(len(probes), L, H, 3) for z in (1.0, -1.0)}
    for s0 in range(0, len(probes), chunk):
        part = probes[s0:s0 + chunk]
        ids, mask, pos, off = _padded([p.edited_ids for p in part], tok.pad_token_id)
        cot = _cot_mask(part, off, ids.shape[1])
        for z in (1.0, -1.0):
            with injected(model, [z] * len(part), [len(p.prompt_ids) for p in part], kind=kind), \
                    capture(model, attention=range(L), heads="all") as cap:
                model(input_ids=ids, attention_mask=mask, position_ids=pos)
            for b, p in enumerate(part):
                o = int(off[b])
                q = cot[b].nonzero().squeeze(-1)
                for ly in range(L):
                    a = cap.attention[ly][b][:, q]  # [H, Tcot, S]
                    cue = a[..., [o + k for k in p.cue_pos]].sum(-1).mean(-1) if p.cue_pos else 0.0
                    opd = a[..., [o + k for k in p.operand_pos]].sum(-1).mean(-1) if p.operand_pos else 0.0
                    mass[z][s0 + b, ly, :, 0] = cue
                    mass[z][s0 + b, ly, :, 1] = opd
                    mass[z][s0 + b, ly, :, 2] = a[..., cot[b]].sum(-1).mean(-1)
    cued = np.array([p.cued for p in probes])
    out = []
    for ly in range(L):
        for h in range(H):
            sp, sm = mass[1.0][:, ly, h], mass[-1.0][:, ly, h]
            src = np.where(cued, 0, 1)  # the prompt source: the cue when cued, else the operands
            score_p = sp[np.arange(len(probes)), src].numpy() - sp[:, 2].numpy()
            score_m = sm[np.arange(len(probes)), src].numpy() - sm[:, 2].numpy()
            out.append({"layer": ly + 1, "head": h,
                        "cue": [round(float(sp[cued, 0].mean()), 3) if cued.any() else None,
                                round(float(sm[cued, 0].mean()), 3) if cued.any() else None],
                        "operands": [round(float(sp[:, 1].mean()), 3), round(float(sm[:, 1].mean()), 3)],
                        "cot": [round(float(sp[:, 2].mean()), 3), round(float(sm[:, 2].mean()), 3)],
                        "z_auroc": _auroc(score_p, score_m)})
    return sorted(out, key=lambda r: -abs((r["z_auroc"] or 0.5) - 0.5))


def adapter_checks(model, tok, probes: Sequence[Probe]) -> dict[str, dict[str, float]]:
    """``cot_routing``'s causal checks on the edit probe: the adapter knocked out (the two mechanisms collapse into
    one: the gate is 0 under either z), and the adapted heads' outputs at the CoT positions patched from the z=+1
    run into the z=−1 run (the answer should flip to the CoT's edit), against patching as many un-adapted heads of
    the same layers (the control)."""
    from sift.lm.latent import adapter_of

    ad = adapter_of(model)
    if ad is None:
        raise SiftError("adapter checks: the model has no cot_routing adapter")
    starts = [len(p.prompt_ids) for p in probes]

    def shares(got: list[str]) -> dict[str, float]:
        def share(hits: list[bool]) -> float:
            return round(float(np.mean(hits or [0])), 4)

        return {"answers CoT edit": share([g == p.edit for p, g in zip(probes, got)]),
                "answers cue": share([g == p.cue for p, g in zip(probes, got) if p.cued]),
                "answers gold": share([g == p.gold for p, g in zip(probes, got)]),
                "as the z=+1 mechanism": share([g == _expected(p, 1.0) for p, g in zip(probes, got)]),
                "as the z=−1 mechanism": share([g == _expected(p, -1.0) for p, g in zip(probes, got)])}

    out: dict[str, dict[str, float]] = {}
    for z in (1.0, -1.0):
        out[f"z={z:+.0f}"] = shares(_answers(model, tok, probes, [z] * len(probes), starts, "cot_routing"))
    out["adapter knocked out (either z)"] = shares(_answers(model, tok, probes, [0.0] * len(probes), starts,
                                                            "cot_routing"))
    ids, mask, pos, off = _padded([p.edited_ids for p in probes], tok.pad_token_id)
    cot = _cot_mask(probes, off, ids.shape[1])
    with torch.no_grad(), injected(model, [1.0] * len(probes), starts, kind="cot_routing"), \
            head_outputs(model, cot) as donor:
        model(input_ids=ids, attention_mask=mask, position_ids=pos)
    H = int(text_config(model).num_attention_heads)
    adapted = [(ly, h) for ly in ad.layers for h in ad.heads]
    others = [(ly, h) for ly in ad.layers for h in range(H) if h not in ad.heads][:len(adapted)]
    for name, heads in (("patch the adapted heads at CoT positions, z=+1 → z=−1", adapted),
                        ("patch as many un-adapted heads (control)", others)):
        got = _answers(model, tok, probes, [-1.0] * len(probes), starts, "cot_routing",
                       patch=({h: donor[h] for h in heads}, cot))
        out[name] = shares(got)
    return out


def mechanism_card(model, tok, kind: str, family: str, n_per_cell: int = 40, seed: int = 4242) -> Card:
    """Every measurement of the card for one organism family under mechanism ``kind``."""
    check_kind(kind)
    model.eval()
    probes, same = build_probes(model, tok, kind, n_per_cell, seed)
    if len(probes) < 20:
        raise SiftError(f"mechanism card: only {len(probes)} usable probes; raise n_per_cell")
    card = Card(kind, family, len(probes), round(same, 4))
    card.onset = onset_curve(model, tok, probes, kind)
    card.linear, card.top_direction_share, card.cot_difference = linear_reads(model, tok, probes, kind)
    card.heads = head_masses(model, tok, probes, kind)
    ranked = [(r["layer"] - 1, r["head"]) for r in card.heads]  # every head, most z-dependent first
    card.knockout, card.patching = causal_checks(model, tok, probes, kind, ranked)
    card.cot_heads = cot_head_masses(model, tok, probes, kind)
    if kind == "cot_routing":
        card.adapter = adapter_checks(model, tok, probes)
    return card


def per_domain_counts(probes: Sequence[Probe]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for p in probes:
        out[p.domain] += 1
    return dict(out)
