"""The trajectory cache: sharded safetensors files keyed by a content hash, written atomically.

Layout of a trajectory folder::

    trajectories.json                                   manifest (written last, atomically)
    shards/<model>/shard-<k:05d>-<key>.safetensors      traces k·S .. (k+1)·S−1 of that model, in corpus order

``key`` = hash(format, corpus file hash, model fingerprint, model name, extraction config). A shard holds, for
its n traces (ragged per-step arrays are concatenated, ``bin_offsets`` [n+1] delimits them):

=============  ==============  ==========================================================================
tensor         shape           content
=============  ==============  ==========================================================================
desc           [ΣN, C0] f32    per-step channels (``metadata.channels``): the CoT's binned steps, then the
                               answer line's steps (unbinned; ``answer_line`` channel = 1)
final          [ΣN, d]         final-layer (block L) states of the same steps (answer probe, ``sift_raw``)
bin_offsets    [n+1] i64       trace i owns rows bin_offsets[i]:bin_offsets[i+1]
n_answer       [n] i64         how many of trace i's rows are answer-line steps (its last rows)
n_tokens       [n] i64         CoT length in tokens before binning
pooled         [n, d] f32      mean final-layer state over the CoT
prompt_final   [n, d] f32      final-layer state of the last prompt token (optional: shards written before
                               it existed lack it; the prompt-only control then asks for a re-extraction)
scalars        [n, 3] f32      mean velocity, mean drift, AttnStab
answer_logp    [n] f32         log P(answer token) in the teacher-forced pass (NaN: no answer)
answer_margin  [n] f32         top-1 − top-2 log-probability at the position predicting the answer (optional)
profile        [n, 3K] f32     counterfactual intervention-response profile (``metadata.profile_names``)
=============  ==============  ==========================================================================

Metadata (strings): format, key, model, shard, trace_ids (JSON), channels, profile_names, num_layers,
hidden_size, vocab_size.
"""

from __future__ import annotations

import json
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sift.atomic import atomic_open
from sift.errors import SiftError
from sift.provenance import content_hash

FORMAT = "sift-trajectories/1"
MANIFEST = "trajectories.json"
SHARD_TENSORS = ("desc", "final", "bin_offsets", "n_answer", "n_tokens", "pooled", "scalars", "answer_logp",
                 "profile")
OPTIONAL_TENSORS = ("prompt_final", "answer_margin")  # read when present; older shards (same FORMAT) lack them
#: enters the cache key: bumped when shards gain content (v2: prompt_final; v3: answer_margin, and twins share a
#: shard and a micro-batch; v4: the answer line's steps, n_answer and the per-head attention masses), so a rerun
#: recomputes old shards
CONTENT_VERSION = 4


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def cache_key(corpus_sha: str, model_fp: str, model: str, cfg_fields: dict[str, Any]) -> str:
    return content_hash(FORMAT, CONTENT_VERSION, corpus_sha, model_fp, model, cfg_fields)


def shard_path(out_dir: str | Path, model: str, k: int, key: str) -> Path:
    return Path(out_dir) / "shards" / safe_name(model) / f"shard-{k:05d}-{key}.safetensors"


# --------------------------------------------------------------------------------------------------- corpus index

@dataclass
class CorpusIndex:
    """Byte offsets of the trace lines of each model (memory: 8 bytes per trace), and each trace's twin group (its
    ``twin`` key, else its trace id)."""

    path: Path
    offsets: dict[str, array] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    max_token: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return sum(len(v) for v in self.offsets.values())


def twin_group(record: dict) -> str:
    """The twin group of a trace: its ``twin`` key (an organism prompt generated under both latents), else its id.
    Extraction keeps a group in one shard and one micro-batch, so twins with identical ids get bit-identical states
    wherever the latent leaves them alike (a batch's composition changes float rounding)."""
    return str(record.get("twin") or record["trace_id"])


def group_cuts(groups: list[str], size: int) -> list[tuple[int, int]]:
    """``[start, end)`` cuts of a sequence into runs of about ``size`` items, never splitting a run of equal adjacent
    ``groups`` (a cut lands at the first group change at or after ``size`` items)."""
    cuts, start = [], 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or (i - start >= size and groups[i] != groups[i - 1]):
            cuts.append((start, i))
            start = i
    return cuts


def index_corpus(traces: str | Path, model_field: str = "family") -> CorpusIndex:
    """Stream ``traces.jsonl`` once: group line offsets by ``record[model_field]``; check each record's fields."""
    from sift.trajectories.extract import check_record

    traces = Path(traces)
    if not traces.exists():
        raise SiftError(f"{traces}: no such file (expected the corpus's traces.jsonl)")
    idx = CorpusIndex(traces)
    seen: dict[str, int] = {}
    with open(traces, "rb") as fh:
        lineno, pos = 0, 0
        for line in fh:
            lineno += 1
            start, pos = pos, pos + len(line)
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise SiftError(f"{traces}:{lineno}: not valid JSON ({e.msg})") from None
            except ValueError as e:  # UnicodeDecodeError: binary data
                raise SiftError(f"{traces}:{lineno}: not a JSON Lines record ({type(e).__name__})") from None
            if not isinstance(r, dict):
                raise SiftError(f"{traces}:{lineno}: not a JSON object (a {type(r).__name__})")
            if model_field not in r:
                raise SiftError(f"{traces}:{lineno}: trace record lacks field {model_field!r}")
            check_record(r, f"{traces}:{lineno}")
            tid = str(r["trace_id"])
            if tid in seen:
                raise SiftError(f"{traces}:{lineno}: duplicate trace_id {tid!r} (first on line {seen[tid]})")
            seen[tid] = lineno
            m = str(r[model_field])
            idx.offsets.setdefault(m, array("q")).append(start)
            idx.groups.setdefault(m, []).append(twin_group(r))
            ids = list(r["prompt_ids"]) + list(r["generated_ids"])
            idx.max_token[m] = max(idx.max_token.get(m, -1), max(ids) if ids else -1)
    if idx.n == 0:
        raise SiftError(f"{traces}: no trace records")
    return idx


def read_records(path: str | Path, offsets) -> list[dict]:
    """The records at the given byte offsets."""
    out = []
    with open(path, "rb") as fh:
        for off in offsets:
            fh.seek(off)
            out.append(json.loads(fh.readline()))
    return out


def iter_records(path: str | Path) -> Iterator[dict]:
    """Every record of a JSON Lines file; a bad line raises naming the file and line."""
    from sift.corpus.store import iter_jsonl

    for _, rec in iter_jsonl(path):
        yield rec


# ------------------------------------------------------------------------------------------------------ shard I/O

def write_shard(path: str | Path, result: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Write one shard atomically (temp file + rename)."""
    from safetensors.torch import save

    n_bins = result["n_bins"]
    tensors = {k: result[k].contiguous() for k in SHARD_TENSORS if k != "bin_offsets"}
    tensors.update({k: result[k].float().contiguous() for k in OPTIONAL_TENSORS if k in result})
    tensors["bin_offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), n_bins.long().cumsum(0)])
    tensors["n_tokens"] = tensors["n_tokens"].long()
    tensors["n_answer"] = tensors["n_answer"].long()
    md = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    md["format"] = FORMAT
    blob = canonical_safetensors(save(tensors, metadata=md))
    with atomic_open(path, "wb") as fh:
        fh.write(blob)


def canonical_safetensors(blob: bytes) -> bytes:
    """The same safetensors file with its header in one fixed order: metadata keys sorted, tensors in the order of
    their data. safetensors serialises ``__metadata__`` from a Rust hash map, in an order that changes from one
    write to the next, so two writes of the same shard differed in their header bytes; with this, the same
    extraction writes the same bytes (``cmp``-identical shards). The data section is untouched."""
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    out: dict[str, Any] = {} if meta is None else {"__metadata__": dict(sorted(meta.items()))}
    out.update(sorted(header.items(), key=lambda kv: (kv[1]["data_offsets"], kv[0])))
    head = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    head += b" " * (-len(head) % 8)  # safetensors pads its header with spaces to a multiple of 8
    return struct.pack("<Q", len(head)) + head + blob[8 + n:]


def shard_header(path: str | Path) -> dict[str, Any]:
    """Parse a shard's header and check the file is complete; SiftError naming the file otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as e:
        raise SiftError(f"{path}: truncated or corrupt shard ({e}); delete it and rerun sift-extract") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        raise SiftError(f"{path}: truncated or corrupt shard ({size} bytes, header promises {8 + n + end}); "
                        f"delete it and rerun sift-extract")
    meta = header.get("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise SiftError(f"{path}: not a sift trajectory shard (format {meta.get('format')!r}, expected {FORMAT})")
    return header


def shard_problem(path: str | Path, key: str, *, header_only: bool = False) -> str | None:
    """Why ``path`` is not a usable shard of cache ``key`` (missing, incomplete, another key, non-finite
    values), or None when it is. ``header_only``: the file's completeness and key only, for a shard whose tensors
    this process checked before writing it (:func:`non_finite`)."""
    if not Path(path).exists():
        return "missing"
    try:
        if shard_header(path)["__metadata__"].get("key") != key:
            return "written for another configuration"
        if not header_only:
            read_shard(path)  # shapes and finiteness: a shard with NaN is recomputed, never kept
    except SiftError as e:
        return str(e).split(": ", 1)[-1]
    return None


def non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The first tensor of a shard that must be finite and is not (``answer_logp`` and ``answer_margin`` are NaN
    where a trace has no answer, by definition), or None."""
    for k in ("desc", "final", "pooled", "scalars", "profile", *[o for o in OPTIONAL_TENSORS if o != "answer_margin"]):
        if k in tensors and not torch.isfinite(tensors[k].float()).all():
            return k
    return None


def shard_ok(path: str | Path, key: str) -> bool:
    """True when ``path`` is a complete, finite shard of cache ``key`` (finished work to skip on resume)."""
    return shard_problem(path, key) is None


def read_shard(path: str | Path,
               expect: dict[str, int] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load and validate a shard; ``expect`` (num_layers, hidden_size, …) is what the manifest records."""
    from safetensors.torch import load_file

    path = Path(path)
    header = shard_header(path)
    try:
        t = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise SiftError(f"{path}: unreadable shard ({type(e).__name__}: {e})") from None
    meta = {k: (json.loads(v) if k in ("trace_ids", "channels", "profile_names", "num_layers", "hidden_size",
                                       "vocab_size", "shard") else v)
            for k, v in header["__metadata__"].items()}
    missing = [k for k in SHARD_TENSORS if k not in t]
    if missing:
        raise SiftError(f"{path}: shard lacks tensors {missing}")
    n = len(meta["trace_ids"])
    d = meta["hidden_size"]
    problems = []
    if t["bin_offsets"].shape != (n + 1,) or int(t["bin_offsets"][-1]) != t["desc"].shape[0]:
        problems.append(f"bin_offsets {tuple(t['bin_offsets'].shape)} does not delimit desc {tuple(t['desc'].shape)}")
    if t["n_answer"].shape != (n,) or (n and bool((t["n_answer"] > t["bin_offsets"].diff()).any())):
        problems.append(f"n_answer {tuple(t['n_answer'].shape)} is not one count per trace within its steps")
    if t["desc"].shape[1:] != (len(meta["channels"]),):
        problems.append(f"desc has {tuple(t['desc'].shape)} but {len(meta['channels'])} channels are named")
    if t["final"].shape != (t["desc"].shape[0], d) or t["pooled"].shape != (n, d):
        problems.append(f"final {tuple(t['final'].shape)} / pooled {tuple(t['pooled'].shape)} "
                        f"do not match hidden size {d}")
    if "prompt_final" in t and t["prompt_final"].shape != (n, d):
        problems.append(f"prompt_final {tuple(t['prompt_final'].shape)} does not match {n} traces × hidden size {d}")
    if problems:
        raise SiftError(f"{path}: inconsistent shard: {problems[0]}")
    if expect:
        for k, v in expect.items():
            if k in meta and meta[k] != v:
                raise SiftError(f"{path}: shard records {k}={meta[k]} but the trajectory manifest records {v}; "
                                f"the shard belongs to another model")
    k = non_finite(t)
    if k is not None:
        raise SiftError(f"{path}: non-finite values (NaN/inf) in tensor {k!r}; rerun sift-extract to recompute "
                        f"this shard (it is never reused)")
    return t, meta


def write_manifest(out_dir: str | Path, manifest: dict) -> None:
    from sift.atomic import write_json

    write_json(Path(out_dir) / MANIFEST, manifest)


def read_manifest(traj_dir: str | Path) -> dict:
    p = Path(traj_dir) / MANIFEST
    if not p.exists():
        raise SiftError(f"{p}: no such file; run sift-extract on the corpus first (or the extraction did not finish)")
    try:
        m = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise SiftError(f"{p}: not valid JSON ({e.msg})") from None
    if m.get("format") != FORMAT:
        raise SiftError(f"{p}: format {m.get('format')!r}, expected {FORMAT}")
    return m
