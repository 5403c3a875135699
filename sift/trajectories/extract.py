"""One teacher-forced forward pass per batch over exactly ``prompt_ids + generated_ids``, for any HF causal LM.

What is read from the pass (docs/design.md §5):

* ``H[ℓ]`` for ℓ = 1..L at the CoT tokens: block outputs, read with forward hooks on the blocks (before the
  final norm that HF applies to its last ``hidden_states`` element).
* the head-averaged attention of one layer (default: the last) of each CoT token over the prompt positions,
  captured inside the same pass by a registered attention implementation that wraps the model's own kernel
  (sdpa, flash …: the outputs are unchanged) and recomputes the captured layer's weights with the model's own
  eager formula. Models whose attention does not go through transformers' ``AttentionInterface`` fall back to
  eager ``output_attentions=True``. Both are :func:`sift.lm.states.capture`.
* the log-probability of the answer token (its logits only: ``logits_to_keep`` when the model supports it).

Batches are padded on the left (default) or right; position ids follow the attention mask, so padded and
unpadded passes give the same states (up to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sift.config import ExtractionSettings
from sift.errors import SiftError
from sift.lm.latent import replay
from sift.lm.states import (
    Packed,
    capture,
    forward_params,
    model_dims,
    model_inputs,
    pack,
    text_config,
)
from sift.trajectories import descriptors as D


@dataclass
class ExtractConfig(ExtractionSettings):
    """Extraction settings (fields: :class:`sift.config.ExtractionSettings`, the ``extraction`` node's schema); every
    field enters the cache key (except batch_size and shard_size, which do not change results)."""

    def validate(self) -> None:
        from sift.trajectories.interventions import INTERVENTIONS

        if self.t_max < 1:
            raise SiftError(f"t_max must be ≥ 1, got {self.t_max}")
        if self.answer_line_max < 1 or self.head_mass_layers < 0:
            raise SiftError(f"answer_line_max must be ≥ 1 and head_mass_layers ≥ 0, got {self.answer_line_max}, "
                            f"{self.head_mass_layers}")
        if self.padding_side not in ("left", "right"):
            raise SiftError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")
        if self.batch_size < 1 or self.shard_size < 1:
            raise SiftError(f"batch_size and shard_size must be ≥ 1, got {self.batch_size}, {self.shard_size}")
        if self.state_dtype not in ("float16", "bfloat16", "float32"):
            raise SiftError(f"state_dtype must be float16, bfloat16 or float32, got {self.state_dtype!r}")
        bad = [i for i in self.interventions if i not in INTERVENTIONS]
        if bad:
            raise SiftError(f"unknown intervention(s) {bad}; expected any of {', '.join(INTERVENTIONS)}")

    def key_fields(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("batch_size")
        d.pop("shard_size")
        return d


#: the answer-line flag channel (1 on the answer line's steps, 0 on the CoT's)
ANSWER_LINE = "answer_line"
#: where a head's attention mass goes: the prompt (outside the cue), the cue, the generated tokens (CoT, answer line)
HEAD_MASS_SOURCES = ("prompt", "cue", "cot")


def descriptor_channels(n_layers: int, n_heads: int = 0, mass_slots: int = 0, answer_line: bool = False) -> list[str]:
    """Names of the stored per-step channels (early commitment is added later, by the DataModule): velocities,
    drifts, attention stability, then the answer-line flag (``answer_line``) and the per-head attention masses
    ``head_mass/s{j}/h{h}/{source}`` of ``mass_slots`` layers (slot j: :func:`head_mass_layers`) × ``n_heads``."""
    return ([f"velocity/l{i}" for i in range(1, n_layers)] + [f"drift/l{i}" for i in range(1, n_layers + 1)]
            + ["attention_stability"] + ([ANSWER_LINE] if answer_line else [])
            + [f"head_mass/s{j}/h{h}/{src}" for j in range(1, mass_slots + 1) for h in range(n_heads)
               for src in HEAD_MASS_SOURCES])


def head_mass_layers(n_layers: int, max_layers: int) -> list[int]:
    """The 1-based layers whose heads give the head-mass channels: ``min(L, max_layers)`` of them, evenly spaced
    in depth with the last layer last (:func:`sift.trajectories.common_shape.layer_map`); none for 0."""
    from sift.trajectories.common_shape import layer_map

    return [] if max_layers <= 0 else layer_map(n_layers, min(n_layers, max_layers))


def answer_line_positions(record: dict, max_len: int) -> list[int]:
    """Indices in ``generated_ids`` of a trace's answer line: the tokens after the CoT and before the answer token
    (at most the last ``max_len``); none when the trace has no answer."""
    a = answer_index(record)
    if a is None:
        return []
    c1 = int(record["cot_span"][1])
    return list(range(max(c1, a - max_len), a))


def key_groups(records: Sequence[dict], p: Packed) -> torch.Tensor:
    """``[B, S, 3]`` one-hot key groups of each packed row (:data:`HEAD_MASS_SOURCES`): prompt outside the cue
    (``cue_span``, prompt positions, when the record has one), the cue, the generated tokens; padding in none."""
    B, S = p.ids.shape
    P = torch.tensor([len(r["prompt_ids"]) for r in records])
    G = torch.tensor([len(r["generated_ids"]) for r in records])
    spans = [r.get("cue_span") or (0, 0) for r in records]
    c0 = torch.tensor([int(a) for a, _ in spans]).clamp(min=0)
    c1 = torch.minimum(torch.tensor([int(b) for _, b in spans]), P)
    at = torch.arange(S)[None] - p.offset[:, None]  # position within each row's sequence
    prompt = (at >= 0) & (at < P[:, None])
    cue = prompt & (at >= c0[:, None]) & (at < c1[:, None])
    gen = (at >= P[:, None]) & (at < (P + G)[:, None])
    return torch.stack([prompt & ~cue, cue, gen], -1).float()


SCALAR_NAMES = ["mean_velocity", "mean_drift", "attention_stability"]


def answer_index(record: dict) -> int | None:
    """Index in ``generated_ids`` of the answer's first token: ``answer_span[0]`` if the record has one, else the
    last generated token when something follows the CoT; None when there is no answer."""
    gen = record["generated_ids"]
    if record.get("answer_span"):
        a = int(record["answer_span"][0])
        return a if 0 <= a < len(gen) else None
    if "answer" in record and record["answer"] is None:
        return None
    c1 = int(record["cot_span"][1])
    return len(gen) - 1 if len(gen) > c1 and len(gen) >= 1 else None


#: fields every trace record needs downstream (extraction, DataModule splits, environments, pairs)
TRACE_FIELDS = ("trace_id", "base_item", "domain", "condition", "phi", "prompt_ids", "generated_ids", "cot_span")


def check_phi(value: Any, where: str) -> int | None:
    """φ* of a trace record: 1 (faithful), 0 (unfaithful) or null (ambiguous); anything else is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in (0, 1):
        raise SiftError(f"{where}: phi must be 1, 0 or null (ambiguous), got {value!r}")
    return int(value)


def check_record(record: dict, where: str) -> None:
    """A trace record has every field of TRACE_FIELDS, string ids, a valid φ* and an in-range CoT span."""
    if not isinstance(record, dict):
        raise SiftError(f"{where}: trace record is not a JSON object")
    for k in TRACE_FIELDS:
        if k not in record:
            hint = " (null marks an ambiguous trace)" if k == "phi" else ""
            raise SiftError(f"{where}: trace record lacks field {k!r}{hint}")
    for k in ("trace_id", "base_item", "domain", "condition"):
        if not isinstance(record[k], (str, int)) or isinstance(record[k], bool) or str(record[k]) == "":
            raise SiftError(f"{where}: trace record field {k!r} must be a non-empty string, got {record[k]!r}")
    check_phi(record["phi"], where)
    c0, c1 = record["cot_span"]
    if not (0 <= c0 <= c1 <= len(record["generated_ids"])):
        raise SiftError(f"{where}: cot_span {record['cot_span']} out of range for {len(record['generated_ids'])} "
                        f"generated ids (trace {record.get('trace_id', '?')})")


# ------------------------------------------------------------------------------------------------------- extraction

class Extractor:
    """Extract trajectories, descriptors and answer log-probabilities from one HF causal LM."""

    def __init__(self, model, cfg: ExtractConfig, pad_id: int | None = None, tokenizer=None, name: str = "model"):
        cfg.validate()
        self.model, self.cfg, self.tokenizer, self.name = model, cfg, tokenizer, name
        dims = model_dims(model)
        self.L, self.d, self.vocab = dims["num_layers"], dims["hidden_size"], dims["vocab_size"]
        if pad_id is None:
            pad_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = 0 if pad_id is None else int(pad_id)
        layer = cfg.attention_layer
        self.attn_layer = (layer - 1) if layer > 0 else self.L + layer  # 0-based block index
        if not 0 <= self.attn_layer < self.L:
            raise SiftError(f"attention_layer {layer} out of range for a {self.L}-layer model ({name})")
        self.use_interface = True
        self.n_heads = int(text_config(model).num_attention_heads)
        self.mass_layers = [x - 1 for x in head_mass_layers(self.L, cfg.head_mass_layers)]  # 0-based blocks
        self.channels = descriptor_channels(self.L, self.n_heads if self.mass_layers else 0, len(self.mass_layers),
                                            cfg.answer_line)
        self.state_dtype = getattr(torch, cfg.state_dtype)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def _forward(self, p: Packed, logits_positions: torch.Tensor | None, q_start: int = 0,
                 groups: torch.Tensor | None = None):
        """Run the model once; returns (the outputs of blocks 1..L, the head-averaged attention of the stability
        layer ``[B, S−q_start, S]``, the per-head masses ``{block: [B, S−q_start, H, 3]}`` of the head-mass layers
        on the key ``groups`` (:func:`key_groups`), logits), all read by :func:`sift.lm.states.capture`."""
        kw = model_inputs(self.model, p, self.device)
        if "use_cache" in forward_params(self.model):
            kw["use_cache"] = False  # one full pass: no key/value cache to build
        if logits_positions is not None and "logits_to_keep" in forward_params(self.model):
            kw["logits_to_keep"] = logits_positions.to(self.device)
        blocks = range(self.L)
        mass_layers = self.mass_layers if groups is not None else []

        def reduce(layer: int, w: torch.Tensor) -> dict[str, torch.Tensor]:  # w [B, H, Q, S]
            got = {}
            if layer == self.attn_layer:
                got["mean"] = w.mean(1)
            if layer in mass_layers:  # Σ_s w[b,h,q,s]·g[b,s,k] as [B, Q, H, 3] (one bmm; einsum's own, less its setup)
                B, H, Q, S = w.shape
                got["mass"] = torch.bmm(w.reshape(B, H * Q, S), groups).view(B, H, Q, 3).transpose(1, 2)
            return got

        wanted = sorted({self.attn_layer, *mass_layers})
        if groups is not None:
            groups = groups.to(self.device, torch.float32)
        if self.use_interface:
            with capture(self.model, blocks=blocks, attention=wanted, q_start=q_start, heads="all",
                         reduce=reduce) as cap:
                out = self.model(**kw)
            got = dict(cap.attention)
            if self.attn_layer not in got:  # the model bypasses AttentionInterface: fall back to eager attentions
                self.use_interface = False
                return self._forward(p, logits_positions, q_start, groups)
        else:
            if getattr(text_config(self.model), "_attn_implementation", "eager") != "eager":
                self.model.set_attn_implementation("eager")
            with capture(self.model, blocks=blocks) as cap:
                out = self.model(**kw, output_attentions=True)
            got = {i: reduce(i, out.attentions[i][:, :, q_start:].float()) for i in wanted}
        if "logits_to_keep" not in kw and logits_positions is not None:
            logits = out.logits[:, logits_positions.to(out.logits.device)]
        else:
            logits = out.logits
        masses = {i: got[i]["mass"] for i in mass_layers}
        return [cap.states[i] for i in blocks], got[self.attn_layer]["mean"], masses, logits

    @torch.no_grad()
    def extract(self, records: Sequence[dict]) -> dict[str, Any]:
        """Descriptors of one batch of trace records (see :func:`sift.trajectories.descriptors`).

        Returns ``desc`` ``[ΣN, C0]`` and ``final`` ``[ΣN, d]`` (binned steps of all traces, concatenated),
        ``n_bins``/``n_tokens`` ``[B]``, ``pooled`` ``[B, d]``, ``prompt_final`` ``[B, d]`` (block L's output at
        the last prompt token: what the prompt alone gives, for the prompt-only control), ``scalars`` ``[B, 3]``
        ``answer_logp`` ``[B]`` and ``answer_margin`` ``[B]`` (the top-2 log-probability margin at the position
        that predicts the answer; both NaN where the trace has no answer token).
        """
        B = len(records)
        seqs = [list(r["prompt_ids"]) + list(r["generated_ids"]) for r in records]
        Pl = [len(r["prompt_ids"]) for r in records]
        for r, s in zip(records, seqs):
            if s and max(s) >= self.vocab:
                raise SiftError(f"trace {r.get('trace_id', '?')}: token id {max(s)} ≥ vocabulary size {self.vocab} of "
                                f"{self.name}; the corpus was generated by another model")
        p = pack(seqs, self.pad_id, self.cfg.padding_side)
        S = p.ids.shape[1]
        P = torch.tensor(Pl)
        c0 = torch.tensor([int(r["cot_span"][0]) for r in records])
        T = torch.tensor([int(r["cot_span"][1]) - int(r["cot_span"][0]) for r in records])
        a_idx = [answer_index(r) for r in records]
        has_ans = torch.tensor([a is not None for a in a_idx])
        a_pos = p.offset + P + torch.tensor([a if a is not None else 1 for a in a_idx]) - 1  # logits predicting it
        a_tok = torch.tensor([r["generated_ids"][a] if a is not None else 0 for r, a in zip(records, a_idx)])
        uniq, inverse = torch.unique(a_pos.clamp(0, S - 1), return_inverse=True)
        Tm = max(int(T.max()), 1)
        t = torch.arange(Tm)[None]
        valid = t < T[:, None]
        last_tok = p.offset + torch.tensor([len(s) for s in seqs]) - 1  # always a real token
        pos = torch.where(valid, (p.offset + P + c0)[:, None] + t, last_tok[:, None])  # [B, Tm] CoT positions
        # the answer line's positions (flagged steps after the CoT's; none when cfg.answer_line is off)
        a_lines = [answer_line_positions(r, self.cfg.answer_line_max) if self.cfg.answer_line else []
                   for r in records]
        n_ans = torch.tensor([len(x) for x in a_lines], dtype=torch.long)
        Am = max(int(n_ans.max()), 1)
        valid_a = torch.arange(Am)[None] < n_ans[:, None]
        start, last = (p.offset + P).tolist(), last_tok.tolist()
        apos = torch.tensor([[start[b] + i for i in x] + [last[b]] * (Am - len(x))
                             for b, x in enumerate(a_lines)], dtype=torch.long).view(B, Am)  # [B, Am]
        q_start = int(min(pos.min(), apos.min()))
        groups = key_groups(records, p) if self.mass_layers else None
        with replay(self.model, records):  # an organism trace's mechanism latent, as it ran (sift.organism.latent)
            layers, attn, masses, logits = self._forward(p, uniq, q_start, groups)
        h_last = layers[-1]

        dev = h_last.device
        rows = torch.arange(B, device=dev)[:, None]
        Pm = int(P.max())
        j = torch.arange(Pm)[None]
        in_prompt = (j < P[:, None]).to(dev)
        cols = (p.offset[:, None] + j).clamp(max=S - 1).to(dev)  # prompt key positions [B, Pm]

        def segment(at: torch.Tensor, ok: torch.Tensor, flag: float):
            """States ``[B, L, n, d]`` and the per-token channels ``[B, n, C]`` of positions ``at`` ``[B, n]``."""
            at, ok = at.to(dev), ok.to(dev)
            H = torch.stack([h[rows, at].float() for h in layers], dim=1)
            if not torch.isfinite(H.sum()):  # cheap test first; then find the trace
                bad = ~torch.isfinite(H).all(-1).all(1) & ok
                if bad.any():
                    b = int(bad.any(1).nonzero()[0])
                    raise SiftError(f"{self.name}: non-finite hidden states for trace "
                                    f"{records[b].get('trace_id', b)} (check the model weights and dtype)")
            n = at.shape[1]
            A = attn[rows, at - q_start]  # [B, n, S]
            A = torch.gather(A, 2, cols[:, None, :].expand(B, n, Pm)) * in_prompt[:, None, :]
            A = D.normalise_attention(A)  # [B, n, Pm]: attention over the prompt, renormalised
            vel, dr, a = D.velocity(H, ok), D.drift(H, ok), D.attention_stability(A, ok)
            parts = [vel, dr, a[..., None]]
            if self.cfg.answer_line:
                parts.append(torch.full_like(a[..., None], flag) * ok[..., None])
            if self.mass_layers:  # [B, n, slots·H·3], unnormalised
                parts += [masses[ly][rows, at - q_start].reshape(B, n, -1) * ok[..., None] for ly in self.mass_layers]
            return H, vel, dr, a, torch.cat(parts, dim=-1)

        H, vel, dr, a, desc = segment(pos, valid, 0.0)
        valid_d = valid.to(dev)
        scalars = D.trace_means(vel, dr, a, valid_d)  # the CoT's own (the answer line never enters them)
        T_d = T.to(dev)
        desc_b, n_bins = D.bin_steps(desc, T_d, self.cfg.t_max)
        final_b, _ = D.bin_steps(H[:, -1], T_d, self.cfg.t_max)
        keep = torch.arange(desc_b.shape[1], device=dev)[None] < n_bins[:, None]
        if self.cfg.answer_line:  # the answer line's steps, unbinned, after each trace's CoT bins
            Ha, _, _, _, desc_a = segment(apos, valid_a, 1.0)
            desc_b = torch.cat([desc_b, desc_a], 1)
            final_b = torch.cat([final_b, Ha[:, -1]], 1)
            keep = torch.cat([keep, valid_a.to(dev)], 1)
        if self.state_dtype == torch.float16 and final_b.abs().max() > torch.finfo(torch.float16).max:
            raise SiftError(f"{self.name}: final-layer states exceed the float16 range (max |h| = "
                            f"{float(final_b.abs().max()):.3g}); set extraction.state_dtype=bfloat16 or float32")
        pooled = (H[:, -1] * valid_d[..., None]).sum(1) / T_d.clamp_min(1)[:, None].to(H.dtype)
        prompt_final = h_last[torch.arange(B, device=dev), (p.offset + P - 1).clamp_min(0).to(dev)].float()

        lp = torch.log_softmax(logits.float(), dim=-1)  # [B, U, V]
        ans_lp = lp[torch.arange(B, device=lp.device), inverse.to(lp.device), a_tok.to(lp.device)]
        ans_lp = torch.where(has_ans.to(lp.device), ans_lp, torch.full_like(ans_lp, float("nan")))
        top2 = lp[torch.arange(B, device=lp.device), inverse.to(lp.device)].topk(2, dim=-1).values  # [B, 2]
        margin = torch.where(has_ans.to(lp.device), top2[:, 0] - top2[:, 1], torch.full_like(ans_lp, float("nan")))
        return {
            "desc": desc_b[keep].cpu(), "final": final_b[keep].to(self.state_dtype).cpu(),
            "n_bins": (n_bins.cpu() + n_ans), "n_answer": n_ans, "n_tokens": T, "pooled": pooled.cpu(),
            "prompt_final": prompt_final.cpu(), "scalars": scalars.cpu(),
            "answer_logp": ans_lp.cpu(), "answer_margin": margin.cpu(),
        }

    @torch.no_grad()
    def extract_many(self, records: Sequence[dict]) -> dict[str, Any]:
        """:meth:`extract` over micro-batches of about ``batch_size`` (length-sorted to limit padding; twins, which
        have the same length, never split), plus the counterfactual profiles; results in the input order."""
        from sift.trajectories.cache import group_cuts, twin_group
        from sift.trajectories.interventions import intervention_profiles

        groups = [twin_group(r) for r in records]
        order = sorted(range(len(records)),
                       key=lambda i: (len(records[i]["prompt_ids"]) + len(records[i]["generated_ids"]), groups[i], i))
        parts = []
        for s, e in group_cuts([groups[i] for i in order], self.cfg.batch_size):  # twins share a micro-batch
            chunk = [records[i] for i in order[s:e]]
            parts.append(self.extract(chunk))
        out = _concat_in_order(parts, order)
        out["profile"] = intervention_profiles(self, records, out["answer_logp"])
        return out


def _concat_in_order(parts: list[dict], order: list[int]) -> dict[str, Any]:
    """Concatenate per-batch results and undo the length sort (ragged ``desc``/``final`` by ``n_bins``)."""
    n_bins = torch.cat([p["n_bins"] for p in parts])
    inv = torch.empty(len(order), dtype=torch.long)
    inv[torch.tensor(order)] = torch.arange(len(order))
    keys = ("n_tokens", "n_answer", "pooled", "prompt_final", "scalars", "answer_logp", "answer_margin")
    out: dict[str, Any] = {k: torch.cat([p[k] for p in parts])[inv] for k in keys}
    out["n_bins"] = n_bins[inv]
    starts = torch.cat([torch.zeros(1, dtype=torch.long), n_bins.cumsum(0)])
    for k in ("desc", "final"):
        flat = torch.cat([p[k] for p in parts])
        pieces = [flat[starts[j]:starts[j + 1]] for j in inv.tolist()]
        out[k] = torch.cat(pieces) if pieces else flat
    return out


@torch.no_grad()
def plain_forward(model, records: Sequence[dict], pad_id: int, batch_size: int, padding_side: str = "left") -> None:
    """The reference cost: a batched forward with ``output_hidden_states=True`` (same packing and order)."""
    order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["generated_ids"]))
    device = next(model.parameters()).device
    for s in range(0, len(order), batch_size):
        chunk = [records[i] for i in order[s:s + batch_size]]
        p = pack([list(r["prompt_ids"]) + list(r["generated_ids"]) for r in chunk], pad_id, padding_side)
        model(**model_inputs(model, p, device), output_hidden_states=True)

