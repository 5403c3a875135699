"""Free generation with llama.cpp reading the ``.gguf`` file itself (optional: ``pip install 'sift[llamacpp]'``).

A Q4_K_M GGUF model is read by llama.cpp at its quantised size (about 4.5 bits per weight) instead of sift's
de-quantised float32/bfloat16 copy. Only free generation runs here; verification re-decodes, interventions and
hidden-state extraction stay in transformers on the de-quantised weights of the same file
(:class:`sift.corpus.sources.hf.LMSource` keeps an hf backend for them), so states and labels come from one model.

* Prompts enter as token ids (never re-tokenised text) and the exact generated ids come back, a trailing eos
  removed, in input order, as with :class:`sift.lm.generation.HFBackend`.
* Parallel sequences: ``batch_size`` prompts are decoded together, each in its own sequence (its own KV stream) of
  one llama.cpp context; every ``llama_decode`` call feeds one token of every row in flight, plus the prompt of a row
  that just took a free place (continuous batching, like sift's hf loop). When no prompt is left to take a place,
  the rows are kept on the lowest sequence ids (llama.cpp batches only consecutive sequences together).
* Greedy decoding is the arg max of llama.cpp's logits (the first on ties, as ``torch.argmax``); nothing else is
  applied (no repetition penalty, top-k or min-p).
* Sampling draws with :class:`sift.lm.generation.RowSampler` from llama.cpp's logits: the same per-prompt seeded
  streams (temperature, then top-p, one draw per step) as the hf backend, so a prompt's sample does not depend on
  its batch. The logits are llama.cpp's (quantised weights), so sampled and greedy continuations may differ from the
  hf backend's for the same seed, as vLLM's do.
"""

from __future__ import annotations

import atexit
import json
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sift.errors import SiftError

MISSING = ("the llamacpp backend needs llama-cpp-python: pip install 'sift[llamacpp]' (it compiles llama.cpp for "
           "this CPU)")
CTX_PAD = 256  # llama.cpp pads each sequence's context to a multiple of this


def gguf_path(model_name_or_path: str) -> str:
    """The ``.gguf`` file the llamacpp backend reads; anything else (a folder, a converted GGUF folder, a hub name, a
    file that is not GGUF) fails at once, naming the path."""
    from sift.lm.loading import RECORD, check_gguf, is_gguf

    path = Path(os.path.expanduser(str(model_name_or_path)))
    if path.is_file():
        if not is_gguf(path):
            raise SiftError(f"source.backend=llamacpp reads a .gguf file; {path} is not one (no GGUF magic bytes)")
        check_gguf(path)  # a truncated file fails here, naming both sizes
        return str(path)
    hint = ""
    if path.is_dir():
        try:
            src = json.loads((path / RECORD).read_text()).get("source")
        except (OSError, ValueError, AttributeError):
            src = None
        hint = f" (converted from {src}: pass that file)" if src else ""
        what = "a model folder"
    elif path.exists():
        what = "not a regular file"
    else:
        what = "not a local file (a hub name or a missing path)"
    raise SiftError(f"source.backend=llamacpp reads a .gguf file; {model_name_or_path} is {what}{hint}; pass the "
                    ".gguf file, or use source.backend=hf")


#: the parts of llama.cpp's C API the backend calls beyond ``llama_cpp.Llama`` (llama-cpp-python >= 0.3.17)
NEEDED = ("llama_init_from_model", "llama_get_memory", "llama_memory_clear", "llama_memory_seq_rm",
          "llama_memory_seq_cp", "llama_n_ctx_seq", "llama_max_parallel_sequences", "llama_batch_init")


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise SiftError(MISSING) from e
    fields = {f for f, *_ in getattr(llama_cpp.llama_context_params, "_fields_", [])}
    missing = [n for n in NEEDED if not hasattr(llama_cpp, n)] + [f for f in ("n_seq_max", "kv_unified")
                                                                  if f not in fields]
    if missing:
        raise SiftError(f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} is too old for the llamacpp "
                        f"backend (no {', '.join(missing)}): pip install -U 'sift[llamacpp]'")
    return llama_cpp


def _threads(n_threads: int | None) -> int:
    if n_threads:
        return int(n_threads)
    import torch

    return max(1, torch.get_num_threads())  # torch's count follows OMP_NUM_THREADS and torch.set_num_threads


def _close_if_alive(ref) -> None:
    backend = ref()
    if backend is not None:
        backend.close()


@dataclass
class _Row:
    """A prompt in flight: its index, the next position to write and the token to feed next."""

    index: int
    pos: int
    token: int | None = None


class LlamaCppBackend:
    """``generate(prompts, ...) -> list[list[int]]`` through llama.cpp on the ``.gguf`` file.

    ``batch_size``: sequences decoded together (at most llama.cpp's limit, 256); ``n_threads``: llama.cpp's threads
    (default: torch's thread count, i.e. ``OMP_NUM_THREADS`` or what a worker set); ``n_batch``: tokens per
    ``llama_decode`` call; ``device``: ``cpu``, or ``cuda`` to offload every layer (needs a CUDA build of
    llama-cpp-python; a CPU build ignores it). Extra ``llama_kwargs`` go to ``llama_cpp.Llama``.
    """

    kind = "llamacpp"

    def __init__(self, model_path: str, *, eos_id: int | Sequence[int] | None = None, batch_size: int = 8,
                 n_threads: int | None = None, n_batch: int = 2048, n_ubatch: int = 512, device: str = "cpu",
                 **llama_kwargs):
        self.path = gguf_path(model_path)
        llama_cpp = _import_llama_cpp()
        self._ll = llama_cpp
        self.batch_size = max(1, min(int(batch_size), int(llama_cpp.llama_max_parallel_sequences())))
        self.n_threads = _threads(n_threads)
        self.n_batch, self.n_ubatch = int(n_batch), min(int(n_ubatch), int(n_batch))
        kwargs = dict(n_ctx=CTX_PAD, n_batch=32, n_ubatch=32, n_threads=self.n_threads,
                      n_threads_batch=self.n_threads, logits_all=False, verbose=False)
        if str(device).startswith("cuda"):
            kwargs["n_gpu_layers"] = -1
        kwargs.update(llama_kwargs)
        try:
            # the model (weights memory-mapped from the file); generation runs in a context of its own (below)
            self.llm = llama_cpp.Llama(model_path=self.path, **kwargs)
        except (ValueError, RuntimeError) as e:
            raise SiftError(f"{self.path}: llama.cpp could not load the model ({e})") from e
        self.n_vocab = int(self.llm.n_vocab())
        if eos_id is None:
            eos_id = self.llm.token_eos()
        self.eos = [int(eos_id)] if isinstance(eos_id, int) else [int(e) for e in eos_id]
        self._ctx = None
        self._shape = (0, 0)  # (sequences, context per sequence) of the current context
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # freed before interpreter shutdown tears down llama_cpp (whose own finalisers then fail noisily)
        atexit.register(_close_if_alive, weakref.ref(self))

    # ------------------------------------------------------------------------------------------- context

    def _context(self, n_seq: int, per_seq: int):
        """A context with ``n_seq`` sequences of at least ``per_seq`` positions each, KV cache emptied."""
        ll = self._ll
        per_seq = -(-per_seq // CTX_PAD) * CTX_PAD
        if self._ctx is None or self._shape[0] < n_seq or self._shape[1] < per_seq:
            self._free_context()
            params = ll.llama_context_default_params()
            params.n_ctx = n_seq * per_seq
            params.n_batch, params.n_ubatch = self.n_batch, self.n_ubatch
            params.n_seq_max = n_seq
            params.n_threads = params.n_threads_batch = self.n_threads
            params.kv_unified = False  # one KV stream per sequence: a row attends over its own cells only
            params.no_perf = True
            ctx = ll.llama_init_from_model(self.llm.model, params)
            if not ctx:
                raise SiftError(f"{self.path}: llama.cpp could not create a context of {n_seq} sequences × "
                                f"{per_seq} positions (out of memory?); lower source.batch_size")
            self._ctx, self._shape = ctx, (n_seq, per_seq)
            have = int(ll.llama_n_ctx_seq(ctx))
            if have < per_seq:  # pragma: no cover - llama.cpp rounds up, never down
                raise SiftError(f"llama.cpp gave {have} positions per sequence, {per_seq} needed")
        ll.llama_memory_clear(ll.llama_get_memory(self._ctx), True)
        return self._ctx

    def _free_context(self) -> None:
        if self._ctx is not None:
            self._ll.llama_free(self._ctx)
            self._ctx, self._shape = None, (0, 0)

    def close(self) -> None:
        """Free the context, the batch and the model (the backend cannot generate afterwards)."""
        self._free_context()
        if getattr(self, "_batch", None) is not None:
            self._ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "llm", None) is not None:
            self.llm.close()
            self.llm = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order is not ours
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------------------------------- decoding

    def _decode(self, ctx, entries: list[tuple[int, int, int, bool]], greedy: bool) -> list:
        """Feed ``entries`` (token, position, sequence, wants logits) through ``llama_decode`` in calls of at most
        ``n_batch`` tokens; per entry that wants logits, in order: its arg max (greedy) or a copy of its logits."""
        import numpy as np

        ll, b, out = self._ll, self._batch, []
        for s in range(0, len(entries), self.n_batch):
            chunk = entries[s:s + self.n_batch]
            for j, (tok, pos, seq, want) in enumerate(chunk):
                b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, pos, 1, int(want)
                b.seq_id[j][0] = seq
            b.n_tokens = len(chunk)
            rc = ll.llama_decode(ctx, b)
            if rc != 0:
                raise SiftError(f"{self.path}: llama_decode returned {rc} (1: no room in the KV cache, <0: error)")
            for j, (*_, want) in enumerate(chunk):
                if want:
                    row = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, j), shape=(self.n_vocab,))
                    out.append(int(row.argmax()) if greedy else row.copy())
        return out

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0,
                 seeds: Sequence[int] | None = None) -> list[list[int]]:
        """New ids per prompt (eos excluded), in the order of ``prompts``; ``seeds`` (one per prompt) to sample."""
        import numpy as np
        import torch

        from sift.lm.generation import RowSampler

        if do_sample and (seeds is None or len(seeds) != len(prompts)):
            raise SiftError("sampling needs one seed per prompt (seeds=...)")
        if max_new_tokens < 1:
            raise SiftError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        if not prompts:
            return []
        prompts = [[int(t) for t in p] for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise SiftError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= self.n_vocab:
                raise SiftError(f"prompt {i} has a token id outside the model's vocabulary of {self.n_vocab}")
        sampler = RowSampler(seeds, temperature=temperature, top_p=top_p) if do_sample else None
        n_seq = min(self.batch_size, len(prompts))
        ctx = self._context(n_seq, max(len(p) for p in prompts) + max_new_tokens)
        mem = self._ll.llama_get_memory(ctx)
        out: list[list[int]] = [[] for _ in prompts]
        queue = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[::-1]  # shortest first (popped)
        rows: dict[int, _Row] = {}  # sequence id -> row in flight
        while queue or rows:
            entries, owners = [], []
            for seq in range(n_seq):  # sequences in increasing order: llama.cpp batches consecutive ones
                if seq in rows:
                    r = rows[seq]
                    entries.append((r.token, r.pos, seq, True))
                    r.pos += 1
                elif queue:
                    i = queue.pop()
                    self._ll.llama_memory_seq_rm(mem, seq, -1, -1)
                    p = prompts[i]
                    entries += [(t, k, seq, k == len(p) - 1) for k, t in enumerate(p)]
                    rows[seq] = _Row(i, len(p))
                else:
                    continue
                owners.append(seq)
            got = self._decode(ctx, entries, greedy=sampler is None)
            if sampler is not None:
                scores = torch.from_numpy(np.stack(got))
                got = sampler.choose(scores, [rows[s].index for s in owners]).tolist()
            for seq, t in zip(owners, got):
                r = rows[seq]
                if t not in self.eos:
                    out[r.index].append(t)
                    r.token = t
                if t in self.eos or len(out[r.index]) >= max_new_tokens:
                    del rows[seq]
            if not queue:
                self._compact(mem, rows)
        return out

    def _compact(self, mem, rows: dict[int, _Row]) -> None:
        """Move the rows in flight onto the lowest sequence ids (their KV streams copied), so that one batch of
        consecutive sequences carries them all."""
        free = sorted(s for s in range(max(rows, default=-1) + 1) if s not in rows)
        for dst in free:
            src = max(rows)
            if src < dst:
                break
            self._ll.llama_memory_seq_rm(mem, dst, -1, -1)
            self._ll.llama_memory_seq_cp(mem, src, dst, -1, -1)
            self._ll.llama_memory_seq_rm(mem, src, -1, -1)
            rows[dst] = rows.pop(src)
