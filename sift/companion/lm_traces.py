"""The companion families on a real-LM corpus (``sift-corpus source=hf``): traces laid out for ICE and the
System-1 audit with the same :class:`~sift.companion.organism.Prepared` record the organism uses.

The organism scores an answer by a restricted softmax over its domain's answer space at one position. A real LM
writes answers of several tokens and has no fixed answer space, so here:

* the **answer space** of a trace is its options' letters when the prompt lists options, else the distinct
  values the trace was tested against: its gold answer, its own answer, the cue's value and the values the
  verification interventions put in (``verification.edit_value`` / ``cue_value``);
* a candidate's **score** is the log-likelihood of ``" <candidate>"`` after the forced ``Answer:`` line start,
  plus the log-probability that the line ends there (newline, end of text or eos): without the end term a
  number would always be at least as likely as any longer number it starts ("1" vs "12"). The restricted
  softmax over the candidates' scores is the answer distribution. Teacher-forced on the trace's exact prompt
  and CoT ids (never re-tokenised); the candidate text is tokenised as the model's tokenizer writes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sift.errors import SiftError
from sift.lm.generation import cache_arg, cache_of, left_padded

OPTION_LINE = re.compile(r"^\(([A-Z])\)\s", re.M)
OPTION_TEXT = re.compile(r"^\(([A-Z])\)\s+(.*)$", re.M)


def answer_space(trace: dict) -> tuple[str, ...]:
    """The candidate answers of a real-LM trace (see the module docstring), sorted, gold always included."""
    labels = OPTION_LINE.findall(trace.get("prompt") or "")
    if labels:
        return tuple(sorted(set(labels)))
    ver = trace.get("verification") or {}
    vals = {trace.get("gold_answer"), trace.get("answer"), (trace.get("cue") or {}).get("value"),
            ver.get("edit_value"), ver.get("cue_value")}
    return tuple(sorted(str(v) for v in vals if v not in (None, "")))


def end_ids(tokenizer) -> list[int]:
    """Token ids that end an answer line: eos / the chat end marker, and tokens that are only a newline."""
    ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        i = tokenizer.convert_tokens_to_ids(t)
        if isinstance(i, int) and i != tokenizer.unk_token_id:
            ids.add(i)
    for text in ("\n", "\n\n"):
        enc = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(enc) == 1:
            ids.add(enc[0])
    return sorted(i for i in ids if i is not None)


class LMAnswerScorer:
    """Answer distributions of a real LM over candidate answers after many id sequences (batched, memoised).

    ``probs(seqs, space_ids)``: ``space_ids`` holds each candidate's token ids; one forward pass per sequence
    (left-padded batch, KV cache kept), then one short pass over the candidates' tokens with the cache repeated
    per candidate. Same interface as :class:`~sift.companion.organism.OrganismScorer`.
    """

    def __init__(self, source, batch_size: int = 8):
        self.src = source
        self.batch_size = batch_size
        self.ends = end_ids(source.tokenizer)
        self._cache_kw = cache_arg(source.model)
        self.cache: dict[tuple, np.ndarray] = {}
        self.n_forward = 0

    def _run(self, seqs: list[tuple[int, ...]], cands: tuple[tuple[int, ...], ...]) -> None:
        import torch

        model, pad = self.src.model, self.src.tokenizer.pad_token_id
        model.eval()
        dev = next(model.parameters()).device
        k, width_c = len(cands), max(map(len, cands))
        todo = sorted({s for s in seqs if (s, cands) not in self.cache}, key=len)
        with torch.no_grad():
            for st in range(0, len(todo), self.batch_size):
                chunk = todo[st:st + self.batch_size]
                ids, mask, pos = (t.to(dev) for t in left_padded(chunk, pad))
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
                first = torch.log_softmax(out.logits[:, -1].double(), -1)  # (B, V)
                past = cache_of(out)
                past.batch_repeat_interleave(k)
                tail = torch.full((len(chunk) * k, width_c), pad, dtype=torch.long, device=dev)
                for j, c in enumerate(cands):
                    tail[j::k, :len(c)] = torch.tensor(c, dtype=torch.long)
                tmask = torch.cat([mask.repeat_interleave(k, 0), torch.ones_like(tail)], 1)
                tpos = pos[:, -1:].repeat_interleave(k, 0) + 1 + torch.arange(width_c, device=dev)
                logp = torch.log_softmax(model(input_ids=tail, attention_mask=tmask, position_ids=tpos,
                                               **{self._cache_kw: past}).logits.double(), -1)  # (B*k, Lc, V)
                self.n_forward += len(chunk)
                for b, s in enumerate(chunk):
                    row = np.empty(k)
                    for j, c in enumerate(cands):
                        lp = logp[b * k + j]
                        ll = float(first[b, c[0]]) + sum(float(lp[t - 1, c[t]]) for t in range(1, len(c)))
                        ll += float(torch.logsumexp(lp[len(c) - 1, self.ends], 0))
                        row[j] = ll
                    self.cache[(s, cands)] = row

    def probs(self, seqs: Sequence[Sequence[int]], space_ids: Sequence[Sequence[int]], latent=None) -> np.ndarray:
        """(n, K) softmax over the candidates' scores after each sequence."""
        cands = tuple(tuple(int(i) for i in c) for c in space_ids)
        if not cands or any(len(c) == 0 for c in cands):
            raise SiftError("answer scorer: every candidate answer needs at least one token")
        keys = [tuple(int(i) for i in s) for s in seqs]
        self._run(keys, cands)
        z = np.array([self.cache[(s, cands)] for s in keys])
        z = z - z.max(1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(1, keepdims=True)


def line_steps(src, cot_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Token spans of the CoT's lines (a line ends after the token whose text holds its newline); blank lines
    are dropped."""
    spans, start, text_before = [], 0, ""
    for i in range(len(cot_ids)):
        text = src.decode(cot_ids[:i + 1])
        piece = text[len(text_before):]
        text_before = text
        if "\n" in piece or i == len(cot_ids) - 1:
            if src.decode(cot_ids[start:i + 1]).strip():
                spans.append((start, i + 1))
            start = i + 1
    return spans


class LMLayout:
    """A real LM's :class:`~sift.companion.organism.TraceLayout`: a CoT is its text, its steps are its lines
    (:func:`line_steps`), the answer is forced by the ``Answer:`` line start; the candidates are
    :func:`answer_space`'s (views of one item share them: a numeric space is the union over the item's traces
    given; an option is compared by its text)."""

    def __init__(self, src):
        self.src = src

    def read(self, cot_ids: list[int]) -> str:
        return self.src.decode(cot_ids)

    def answer_prefix(self, cot: str) -> list[int]:
        return self.src.answer_prefix(cot)

    def steps(self, cot_ids: list[int], cot: str) -> tuple[list[str], list[tuple[int, int]]]:
        lines = line_steps(self.src, cot_ids)
        return [self.src.decode(cot_ids[a:b]) for a, b in lines], lines

    def spaces(self, traces: Sequence[dict]) -> list[tuple[tuple[str, ...], list, tuple[str, ...] | None]]:
        union: dict[str, set] = {}
        for r in traces:
            if not OPTION_LINE.search(r.get("prompt") or ""):
                union.setdefault(r["base_item"], set()).update(answer_space(r))
        out = []
        for r in traces:
            options = dict(OPTION_TEXT.findall(r.get("prompt") or ""))
            space = answer_space(r) if options else tuple(sorted(union[r["base_item"]]))
            if r.get("gold_answer") is not None and str(r["gold_answer"]) not in space:
                raise SiftError(f"trace {r['trace_id']}: gold answer {r['gold_answer']!r} is not among its options "
                                f"{list(space)}")
            out.append((space, [tuple(self.src.encode(" " + v)) for v in space],
                        tuple(options[v].strip() for v in space) if options else None))
        return out


def content_mask_lm(p, src, span: str = "cot") -> np.ndarray:
    """Positions ICE may select on a real-LM trace: the CoT, and/or the prompt's tokens that are not special
    tokens (the chat template's markers; the instructions and the question stay); the ``Answer:`` tail never."""
    m = np.zeros(len(p.ids), bool)
    if span not in ("prompt", "cot", "both"):
        raise SiftError(f"companion.ice.span must be 'prompt', 'cot' or 'both', got {span!r}")
    if span in ("prompt", "both"):
        special = set(src.tokenizer.all_special_ids)
        m[:p.n_prompt] = [t not in special for t in p.ids[:p.n_prompt]]
    if span in ("cot", "both"):
        m[p.n_prompt:p.n_prompt + p.n_cot] = True
    return m


def value_ids(prepared: Sequence) -> set[int]:
    """Token ids of every candidate answer (kept out of ICE's retrieval-infill pool, as ICE blacklists labels)."""
    return {int(t) for p in prepared for c in p.space_ids for t in c}


def is_lm_corpus(corpus_dir: str | Path) -> bool:
    """Whether a corpus folder was built from real LMs (its manifest's ``source`` is ``real_lm``)."""
    import json

    path = Path(corpus_dir) / "manifest.json"
    if not path.is_file():
        return False
    return json.loads(path.read_text()).get("source") == "real_lm"


def corpus_models(corpus_dir: str | Path) -> tuple[dict[str, str], dict]:
    """family label → model of a real-LM corpus (a GGUF file resolved to its converted folder), and the
    source config it was built with."""
    import json

    from sift.lm.loading import resolve_model_path

    path = Path(corpus_dir) / "manifest.json"
    man = json.loads(path.read_text())
    models = man.get("models")
    if not models:
        raise SiftError(f"{path}: a real-LM corpus manifest without 'models' (rebuild the corpus)")
    return {f: resolve_model_path(m) for f, m in models.items()}, man.get("config") or {}


def corpus_items(corpus_dir: str | Path) -> dict:
    """item id → :class:`~sift.lm.items.LMItem` of a real-LM corpus, reloaded from the item sources, count and
    seed its manifest records (the item loaders are deterministic)."""
    from sift.lm.items import ItemSpec, load_item_specs

    conf = corpus_models(corpus_dir)[1]
    try:
        specs = [ItemSpec(**dict(s)) for s in conf["items"]]
        items = load_item_specs(specs, int(conf["n_items"]), int(conf.get("seed", 0)))
    except KeyError as e:
        raise SiftError(f"{Path(corpus_dir) / 'manifest.json'}: config lacks {e} (rebuild the corpus)") from None
    return {it.item_id: it for it in items}
