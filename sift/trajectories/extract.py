"""One teacher-forced forward pass per batch over exactly ``prompt_ids + generated_ids``, for any HF causal LM.

What is read from the pass (DESIGN.md §5):

* ``H[ℓ]`` for ℓ = 1..L at the CoT tokens: block outputs. ``hidden_states[1:L]`` of HF's
  ``output_hidden_states=True`` are the outputs of blocks 1..L−1, but HF's last element has the final norm
  applied (GPT-2 ``ln_f``, Llama ``norm``), so block L's own output is taken with a forward hook on the last
  block (pre-norm). :func:`find_blocks` locates the block list of any HF decoder.
* the head-averaged attention of one layer (default: the last) of each CoT token over the prompt positions.
  It is captured inside the same pass: the model's attention function is wrapped for the duration of the
  call; the model keeps its own kernel (sdpa, flash …) for its output, and for the captured layer only the
  weights are recomputed with the model's own eager formula. Models whose attention does not go through
  transformers' ``AttentionInterface`` fall back to eager ``output_attentions=True``.
* the log-probability of the answer token (its logits only: ``logits_to_keep`` when the model supports it).

Batches are padded on the left (default) or right; position ids follow the attention mask, so padded and
unpadded passes give the same states (up to float rounding).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from sift.errors import SiftError
from sift.trajectories import descriptors as D


@dataclass
class ExtractConfig:
    """Extraction settings; every field enters the cache key (except batch_size, which does not change results)."""

    t_max: int = 64  # at most this many (binned) steps per trace
    attention_layer: int = -1  # layer (1..L, or negative from the end) whose attention gives attention stability
    padding_side: str = "left"
    batch_size: int = 64  # traces per forward pass
    shard_size: int = 512  # traces per cache shard
    state_dtype: str = "float16"  # dtype of the stored (binned) final-layer states used by the answer probe
    interventions: list[str] = field(default_factory=lambda: ["cot_deleted", "first_step_edit", "step_dropped"])
    value_pattern: str = r"-?\d+|true|false|True|False"  # a token whose stripped text matches is a "value"
    step_pattern: str = r";|\."  # a token whose stripped text matches (or that holds a newline) ends a step

    def validate(self) -> None:
        from sift.trajectories.interventions import INTERVENTIONS

        if self.t_max < 1:
            raise SiftError(f"t_max must be ≥ 1, got {self.t_max}")
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


def descriptor_channels(n_layers: int) -> list[str]:
    """Names of the stored per-step channels (early commitment is added later, by the DataModule)."""
    return ([f"velocity/l{i}" for i in range(1, n_layers)] + [f"drift/l{i}" for i in range(1, n_layers + 1)]
            + ["attention_stability"])


SCALAR_NAMES = ["mean_velocity", "mean_drift", "attention_stability"]


def _text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def find_blocks(model) -> torch.nn.ModuleList:
    """The decoder's list of transformer blocks (a ModuleList of ``num_hidden_layers`` same-type modules)."""
    n = getattr(_text_config(model), "num_hidden_layers", None)
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n and n and len({type(m) for m in mod}) == 1:
            return mod
    raise SiftError(f"{type(model).__name__}: cannot find its list of {n} transformer blocks")


def model_dims(model) -> dict[str, int]:
    """Layers, width and vocabulary size of a model (as recorded in caches)."""
    cfg = _text_config(model)
    emb = model.get_input_embeddings()
    return {"num_layers": int(cfg.num_hidden_layers), "hidden_size": int(cfg.hidden_size),
            "vocab_size": int(emb.num_embeddings)}


# ---------------------------------------------------------------------------------------------- attention capture

@dataclass
class _Capture:
    targets: dict[int, int]  # id(attention submodule) -> layer index
    q_start: int = 0  # only queries from this position on are needed
    weights: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, S − q_start, S] head-averaged


_ACTIVE: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("sift_attention_capture", default=None)


def _module_eager(module):
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _generic_eager


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    rep = query.shape[1] // key.shape[1]
    if rep > 1:
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    w = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        w = w + attention_mask
    w = torch.softmax(w.float(), dim=-1).to(query.dtype)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), w


def _additive_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """An eager-style additive mask from whatever the model's kernel was given (None, bool 4D or 2D, float)."""
    Sq, Sk = query.shape[-2], key.shape[-2]
    neg = torch.finfo(query.dtype).min
    if mask is not None and mask.dtype != torch.bool and mask.ndim == 4:
        return mask[..., :Sk]
    causal = torch.ones(Sq, Sk, dtype=torch.bool, device=query.device).tril(Sk - Sq)[None, None]
    if mask is None:
        keep = causal
    elif mask.ndim == 2:  # [B, Sk] padding mask (flash-style)
        keep = causal & mask.bool()[:, None, None, :Sk]
    else:
        keep = mask[..., :Sk]
    return torch.zeros(keep.shape, dtype=query.dtype, device=query.device).masked_fill(~keep, neg)


def _rows(mask: torch.Tensor | None, qs: int) -> torch.Tensor | None:
    """The mask rows of queries ``qs:`` (4D masks only; 2D padding masks and None have no query axis)."""
    return mask[:, :, qs:] if mask is not None and mask.ndim == 4 and mask.shape[-2] > 1 else mask


def _wrap(original, impl: str):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        base = original if original is not None else _module_eager(module)
        out = base(module, query, key, value, attention_mask, *args, **kwargs)
        cap = _ACTIVE.get()
        if cap is None or id(module) not in cap.targets:
            return out
        qs = min(cap.q_start, query.shape[-2] - 1)
        w = out[1] if impl == "eager" and isinstance(out, tuple) and out[1] is not None else None
        if w is not None:
            w = w[:, :, qs:]
        else:  # recompute the weights of the needed queries only, with the model's own eager formula
            kw = {k: v for k, v in kwargs.items() if k not in ("is_causal",)}
            q = query[:, :, qs:]
            _, w = _module_eager(module)(module, q, key, value, _additive_mask(_rows(attention_mask, qs), q, key),
                                         *args, **kw)
        cap.weights[cap.targets[id(module)]] = w.float().mean(1)
        return out

    attention._sift_wrapper = True  # type: ignore[attr-defined]
    return attention


@contextlib.contextmanager
def capture_attention(model, layers: Sequence[int], q_start: int = 0) -> Iterator[_Capture]:
    """Capture head-averaged attention weights of ``layers`` (0-based block indices) during one forward call,
    for the queries at positions ≥ ``q_start`` (``weights[layer]`` is ``[B, S − q_start, S]``)."""
    from transformers.modeling_utils import AttentionInterface

    blocks = find_blocks(model)
    cap = _Capture({id(m): i for i in layers for m in blocks[i].modules()}, q_start=q_start)
    impl = getattr(_text_config(model), "_attn_implementation", None) or "eager"
    mapping = AttentionInterface._global_mapping
    had = impl in mapping
    original = mapping.get(impl)
    if not getattr(original, "_sift_wrapper", False):
        mapping[impl] = _wrap(original, impl)
    token = _ACTIVE.set(cap)
    try:
        yield cap
    finally:
        _ACTIVE.reset(token)
        if had:
            mapping[impl] = original
        else:
            mapping.pop(impl, None)


# -------------------------------------------------------------------------------------------------- batch packing

@dataclass
class Packed:
    ids: torch.Tensor  # [B, S]
    mask: torch.Tensor  # [B, S] long
    offset: torch.Tensor  # [B] index of each row's first real token


def pack(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "left") -> Packed:
    """Pad token-id lists into one batch (``side`` = left or right)."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    offset = torch.zeros(len(seqs), dtype=torch.long)
    for i, s in enumerate(seqs):
        o = width - len(s) if side == "left" else 0
        ids[i, o:o + len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, o:o + len(s)] = 1
        offset[i] = o
    return Packed(ids, mask, offset)


def model_inputs(model, p: Packed, device) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and (when the model takes them) mask-following position ids."""
    kw = {"input_ids": p.ids.to(device), "attention_mask": p.mask.to(device)}
    if "position_ids" in _forward_params(model):
        kw["position_ids"] = (p.mask.cumsum(-1) - 1).clamp_min(0).to(device)
    return kw


def _forward_params(model) -> set[str]:
    cached = getattr(model, "_sift_forward_params", None)
    if cached is None:
        cached = set(inspect.signature(model.forward).parameters)
        try:
            model._sift_forward_params = cached
        except Exception:  # pragma: no cover
            pass
    return cached


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
        self.blocks = find_blocks(model)
        layer = cfg.attention_layer
        self.attn_layer = (layer - 1) if layer > 0 else self.L + layer  # 0-based block index
        if not 0 <= self.attn_layer < self.L:
            raise SiftError(f"attention_layer {layer} out of range for a {self.L}-layer model ({name})")
        self.use_interface = True
        self.channels = descriptor_channels(self.L)
        self.state_dtype = getattr(torch, cfg.state_dtype)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def _forward(self, p: Packed, logits_positions: torch.Tensor | None, q_start: int = 0):
        """Run the model once; returns (hidden_states, last block output, attention [B, S−q_start, S], logits)."""
        last: dict[str, torch.Tensor] = {}

        def hook(_m, _inp, out):
            last["h"] = out[0] if isinstance(out, (tuple, list)) else out

        kw = model_inputs(self.model, p, self.device)
        kw["output_hidden_states"] = True
        if logits_positions is not None and "logits_to_keep" in _forward_params(self.model):
            kw["logits_to_keep"] = logits_positions.to(self.device)
        handle = self.blocks[-1].register_forward_hook(hook)
        try:
            if self.use_interface:
                with capture_attention(self.model, [self.attn_layer], q_start) as cap:
                    out = self.model(**kw)
                attn = cap.weights.get(self.attn_layer)
                if attn is None:  # the model bypasses AttentionInterface: fall back to eager attentions
                    self.use_interface = False
                    return self._forward(p, logits_positions, q_start)
            else:
                if getattr(_text_config(self.model), "_attn_implementation", "eager") != "eager":
                    self.model.set_attn_implementation("eager")
                out = self.model(**kw, output_attentions=True)
                attn = out.attentions[self.attn_layer][:, :, q_start:].float().mean(1)
        finally:
            handle.remove()
        if "logits_to_keep" not in kw and logits_positions is not None:
            logits = out.logits[:, logits_positions.to(out.logits.device)]
        else:
            logits = out.logits
        return out.hidden_states, last["h"], attn, logits

    @torch.no_grad()
    def extract(self, records: Sequence[dict]) -> dict[str, Any]:
        """Descriptors of one batch of trace records (see :func:`sift.trajectories.descriptors`).

        Returns ``desc`` ``[ΣN, C0]`` and ``final`` ``[ΣN, d]`` (binned steps of all traces, concatenated),
        ``n_bins``/``n_tokens`` ``[B]``, ``pooled`` ``[B, d]``, ``prompt_final`` ``[B, d]`` (block L's output at
        the last prompt token: what the prompt alone gives, for the prompt-only control), ``scalars`` ``[B, 3]``
        and ``answer_logp`` ``[B]`` (NaN where the trace has no answer token).
        """
        B = len(records)
        seqs = [list(r["prompt_ids"]) + list(r["generated_ids"]) for r in records]
        for r, s in zip(records, seqs):
            if s and max(s) >= self.vocab:
                raise SiftError(f"trace {r.get('trace_id', '?')}: token id {max(s)} ≥ vocabulary size {self.vocab} of "
                                f"{self.name}; the corpus was generated by another model")
        p = pack(seqs, self.pad_id, self.cfg.padding_side)
        S = p.ids.shape[1]
        P = torch.tensor([len(r["prompt_ids"]) for r in records])
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
        q_start = int(pos.min())
        hs, h_last, attn, logits = self._forward(p, uniq, q_start)

        dev = h_last.device
        pos = pos.to(dev)
        rows = torch.arange(B, device=dev)[:, None]
        layers = list(hs[1:self.L]) + [h_last]
        H = torch.stack([h[rows, pos].float() for h in layers], dim=1)  # [B, L, Tm, d]
        valid_d = valid.to(dev)
        if not torch.isfinite(H.sum()):  # cheap test first; then find the trace
            bad = ~torch.isfinite(H).all(-1).all(1) & valid_d
            b = int(bad.any(1).nonzero()[0]) if bad.any() else None
        else:
            b = None
        if b is not None:
            raise SiftError(f"{self.name}: non-finite hidden states for trace {records[b].get('trace_id', b)} "
                            f"(check the model weights and dtype)")
        Pm = int(P.max())
        j = torch.arange(Pm)[None]
        in_prompt = (j < P[:, None]).to(dev)
        cols = (p.offset[:, None] + j).clamp(max=S - 1).to(dev)  # prompt key positions [B, Pm]
        A = attn[rows, pos - q_start]  # [B, Tm, S]
        A = torch.gather(A, 2, cols[:, None, :].expand(B, Tm, Pm)) * in_prompt[:, None, :]
        A = D.normalise_attention(A)  # [B, Tm, Pm]: attention over the prompt, renormalised

        vel = D.velocity(H, valid_d)
        dr = D.drift(H, valid_d)
        a = D.attention_stability(A, valid_d)
        scalars = D.trace_means(vel, dr, a, valid_d)
        desc = torch.cat([vel, dr, a[..., None]], dim=-1)
        T_d = T.to(dev)
        desc_b, n_bins = D.bin_steps(desc, T_d, self.cfg.t_max)
        final_b, _ = D.bin_steps(H[:, -1], T_d, self.cfg.t_max)
        keep = torch.arange(desc_b.shape[1], device=dev)[None] < n_bins[:, None]
        if self.state_dtype == torch.float16 and final_b.abs().max() > torch.finfo(torch.float16).max:
            raise SiftError(f"{self.name}: final-layer states exceed the float16 range (max |h| = "
                            f"{float(final_b.abs().max()):.3g}); set extraction.state_dtype=bfloat16 or float32")
        pooled = (H[:, -1] * valid_d[..., None]).sum(1) / T_d.clamp_min(1)[:, None].to(H.dtype)
        prompt_final = h_last[torch.arange(B, device=dev), (p.offset + P - 1).clamp_min(0).to(dev)].float()

        lp = torch.log_softmax(logits.float(), dim=-1)  # [B, U, V]
        ans_lp = lp[torch.arange(B, device=lp.device), inverse.to(lp.device), a_tok.to(lp.device)]
        ans_lp = torch.where(has_ans.to(lp.device), ans_lp, torch.full_like(ans_lp, float("nan")))
        return {
            "desc": desc_b[keep].cpu(), "final": final_b[keep].to(self.state_dtype).cpu(),
            "n_bins": n_bins.cpu(), "n_tokens": T, "pooled": pooled.cpu(), "prompt_final": prompt_final.cpu(),
            "scalars": scalars.cpu(),
            "answer_logp": ans_lp.cpu(),
        }

    @torch.no_grad()
    def extract_many(self, records: Sequence[dict]) -> dict[str, Any]:
        """:meth:`extract` over micro-batches of ``batch_size`` (length-sorted to limit padding), plus the
        counterfactual profiles; results in the input order."""
        from sift.trajectories.interventions import intervention_profiles

        order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["generated_ids"]))
        parts = []
        for s in range(0, len(order), self.cfg.batch_size):
            chunk = [records[i] for i in order[s:s + self.cfg.batch_size]]
            parts.append(self.extract(chunk))
        out = _concat_in_order(parts, order)
        out["profile"] = intervention_profiles(self, records, out["answer_logp"])
        return out


def _concat_in_order(parts: list[dict], order: list[int]) -> dict[str, Any]:
    """Concatenate per-batch results and undo the length sort (ragged ``desc``/``final`` by ``n_bins``)."""
    n_bins = torch.cat([p["n_bins"] for p in parts])
    inv = torch.empty(len(order), dtype=torch.long)
    inv[torch.tensor(order)] = torch.arange(len(order))
    out: dict[str, Any] = {k: torch.cat([p[k] for p in parts])[inv] for k in ("n_tokens", "pooled", "prompt_final", "scalars",
                                                                         "answer_logp")}
    out["n_bins"] = n_bins[inv]
    starts = torch.cat([torch.zeros(1, dtype=torch.long), n_bins.cumsum(0)])
    for k in ("desc", "final"):
        flat = torch.cat([p[k] for p in parts])
        pieces = [flat[starts[j]:starts[j + 1]] for j in inv.tolist()]
        out[k] = torch.cat(pieces) if pieces else flat
    return out


@torch.no_grad()
def prompt_final_states(model, prompts: Sequence[Sequence[int]], pad_id: int = 0, batch_size: int = 256,
                        padding_side: str = "left") -> torch.Tensor:
    """Block L's output (pre final norm, as in :meth:`Extractor.extract`) at the last token of each prompt:
    ``[N, d]`` float32, in input order. One forward pass over the prompts only (causal attention makes it
    equal to the state inside the full trace)."""
    blocks = find_blocks(model)
    device = next(model.parameters()).device
    out = torch.zeros(len(prompts), model_dims(model)["hidden_size"])
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        p = pack([prompts[i] for i in idx], pad_id, padding_side)
        last: dict[str, torch.Tensor] = {}

        def hook(_m, _inp, o):
            last["h"] = o[0] if isinstance(o, (tuple, list)) else o

        h = blocks[-1].register_forward_hook(hook)
        try:
            model(**model_inputs(model, p, device))
        finally:
            h.remove()
        lens = torch.tensor([len(prompts[i]) for i in idx])
        pos = (p.offset + lens - 1).clamp_min(0).to(last["h"].device)
        out[torch.tensor(idx)] = last["h"][torch.arange(len(idx), device=pos.device), pos].float().cpu()
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

