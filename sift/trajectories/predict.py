"""Extraction as a Lightning ``Trainer.predict`` loop, so it shards over GPUs and nodes with DDP unchanged.

* :class:`ShardDataModule` plans one predict "batch" per cache shard (all shards of all models, in a fixed
  order) and hands rank r the shards r, r+W, r+2W … (``use_distributed_sampler=False``). Each rank checks its
  own shards and skips the complete ones, so the plan is identical on every rank and a rerun resumes.
* :class:`ExtractionModule` wraps the HF model(s); ``predict_step`` reads the shard's traces from the JSONL
  (by byte offset: memory stays flat as the corpus grows) and returns the shard's descriptors.
* :class:`ShardWriter` (a ``BasePredictionWriter``) writes each shard atomically as it is produced.

:func:`extract_corpus` runs it all and writes ``trajectories.json`` once every shard exists.
"""

from __future__ import annotations

import time
import warnings
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader, Dataset, Sampler

from sift import __version__
from sift.errors import SiftError
from sift.lm.states import model_dims
from sift.lm.weights import release_memory
from sift.provenance import file_sha256, model_fingerprint
from sift.trajectories import cache as C
from sift.trajectories.extract import SCALAR_NAMES, ExtractConfig, Extractor
from sift.trajectories.interventions import profile_names


@dataclass(frozen=True, eq=False)
class ShardTask:
    model: str
    index: int
    offsets: array  # byte offsets of the shard's lines in traces.jsonl
    path: str
    key: str


class ShardDataset(Dataset):
    """Item i = the records of shard task i (or a skip marker when the shard is already complete)."""

    def __init__(self, corpus: str | Path, tasks: list[ShardTask]):
        self.corpus, self.tasks = str(corpus), tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, i: int) -> dict[str, Any]:
        task = self.tasks[i]
        if C.shard_ok(task.path, task.key):
            return {"task": task, "records": None}
        return {"task": task, "records": C.read_records(self.corpus, task.offsets)}


class RankSampler(Sampler[int]):
    """Round-robin split of shard tasks over ranks (no padding, no duplicates)."""

    def __init__(self, n: int, rank: int = 0, world: int = 1):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        return iter(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


def _first(batch):
    return batch


class ShardDataModule(pl.LightningDataModule):
    def __init__(self, corpus: str | Path, tasks: list[ShardTask]):
        super().__init__()
        self.dataset = ShardDataset(corpus, tasks)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # records are plain lists; the extractor builds its tensors on the model's device

    def predict_dataloader(self) -> DataLoader:
        rank = self.trainer.global_rank if self.trainer else 0
        world = self.trainer.world_size if self.trainer else 1
        return DataLoader(self.dataset, batch_size=None, sampler=RankSampler(len(self.dataset), rank, world),
                          collate_fn=_first, num_workers=0)


class ExtractionModule(pl.LightningModule):
    """Wraps one HF causal LM per corpus model; ``predict_step`` returns one shard's descriptors."""

    def __init__(self, models: dict[str, torch.nn.Module], tokenizers: dict[str, Any], cfg: ExtractConfig,
                 names: dict[str, str] | None = None):
        super().__init__()
        self.slots = {m: f"m{i}" for i, m in enumerate(models)}
        self.models = torch.nn.ModuleDict({self.slots[m]: mod.eval() for m, mod in models.items()})
        self.cfg = cfg
        self.extractors = {m: Extractor(self.models[self.slots[m]], cfg, tokenizer=tokenizers.get(m),
                                        name=(names or {}).get(m, m)) for m in models}
        self.computed: list[tuple[str, int]] = []  # shards this process computed (for tests and logs)

    def predict_step(self, batch: dict[str, Any], batch_idx: int = 0) -> dict[str, Any]:
        task: ShardTask = batch["task"]
        if batch["records"] is None:
            return {"task": task, "skipped": True}
        self.computed.append((task.model, task.index))
        records = batch["records"]
        out = self.extractors[task.model].extract_many(records)
        out["trace_ids"] = [str(r.get("trace_id", f"{task.model}:{task.index}:{i}")) for i, r in enumerate(records)]
        out["task"] = task
        return out


class ShardWriter(BasePredictionWriter):
    """Writes every predicted shard to its cache file as soon as it is produced."""

    def __init__(self, meta: dict[str, dict[str, Any]], total: int = 0, progress: bool = False):
        super().__init__(write_interval="batch")
        self.meta = meta
        self.written: list[str] = []
        self.total, self.progress, self.t0 = total, progress, time.time()

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        if prediction.get("skipped"):
            return
        task: ShardTask = prediction["task"]
        bad = C.non_finite(prediction)
        if bad is not None:  # never written: a rerun computes it again (its header-only check below relies on this)
            raise SiftError(f"{task.path}: non-finite values (NaN/inf) in tensor {bad!r} of {task.model}'s shard "
                            f"{task.index}; nothing was written (check the model weights and dtype)")
        meta = {**self.meta[task.model], "shard": task.index, "trace_ids": prediction["trace_ids"], "key": task.key}
        C.write_shard(task.path, prediction, meta)
        self.written.append(task.path)
        if self.progress:  # one line per shard: readable in logs, unlike a redrawn bar
            print(f"[extract] shard {task.model}/{task.index} written ({len(self.written)} computed of "
                  f"{self.total} shards, {time.time() - self.t0:.0f} s)", flush=True)


# --------------------------------------------------------------------------------------------------- orchestration

def _load(path: str, dtype: str | None):
    from sift.lm.loading import load_causal_lm

    return load_causal_lm(path, dtype=dtype)


def plan_shards(index: C.CorpusIndex, out_dir: Path, keys: dict[str, str], shard_size: int) -> list[ShardTask]:
    """Shards of about ``shard_size`` traces per model, in corpus order with each twin group gathered at its first
    trace and never split across shards (:func:`sift.trajectories.cache.group_cuts`)."""
    tasks = []
    for m in sorted(index.offsets):
        offs, groups = index.offsets[m], index.groups[m]
        first: dict[str, int] = {}
        for i, g in enumerate(groups):
            first.setdefault(g, i)
        order = sorted(range(len(offs)), key=lambda i: (first[groups[i]], i))
        for k, (s, e) in enumerate(C.group_cuts([groups[i] for i in order], shard_size)):
            part = array("q", (offs[i] for i in order[s:e]))
            tasks.append(ShardTask(m, k, part, str(C.shard_path(out_dir, m, k, keys[m])), keys[m]))
    return tasks


def _check_corpus_vs_model(corpus_dir: Path, index: C.CorpusIndex, m: str, path: str, dims: dict, tok) -> None:
    traces = corpus_dir / "traces.jsonl"
    if index.max_token[m] >= dims["vocab_size"]:
        raise SiftError(f"{traces}: traces of {m!r} use token id {index.max_token[m]} but model {path} "
                        f"has a vocabulary of {dims['vocab_size']}; the corpus was generated by another model")
    if tok is not None and len(tok) > dims["vocab_size"]:
        raise SiftError(f"{path}: tokenizer has {len(tok)} tokens but the model's embedding has {dims['vocab_size']}")
    mf = corpus_dir / "manifest.json"
    if mf.exists():
        import json

        try:
            rec = (json.loads(mf.read_text()).get("models") or {}).get(m) or {}
        except json.JSONDecodeError:
            rec = {}
        for k in ("vocab_size", "hidden_size", "num_layers"):
            if k in rec and rec[k] != dims[k]:
                raise SiftError(f"{mf}: corpus records {k}={rec[k]} for {m!r} but model {path} has {dims[k]}; "
                                f"the model does not match the corpus")


def check_corpus_manifest(corpus_dir: Path, n_traces: int) -> None:
    """The corpus's manifest.json (when present) must count the traces and pairs its files hold."""
    import json

    mf = corpus_dir / "manifest.json"
    if not mf.exists():
        return
    try:
        man = json.loads(mf.read_text())
    except json.JSONDecodeError as e:
        raise SiftError(f"{mf}: not valid JSON ({e.msg})") from None
    if "traces" in man and man["traces"] != n_traces:
        raise SiftError(f"{mf}: manifest counts {man['traces']} traces but {corpus_dir / 'traces.jsonl'} holds "
                        f"{n_traces}; the corpus files do not belong together (rebuild it with sift-corpus)")
    pairs = corpus_dir / "pairs.jsonl"
    if "pairs" in man and pairs.exists():
        with open(pairs) as fh:
            n_pairs = sum(1 for line in fh if line.strip())
        if man["pairs"] != n_pairs:
            raise SiftError(f"{mf}: manifest counts {man['pairs']} pairs but {pairs} holds {n_pairs}; the corpus "
                            f"files do not belong together (rebuild it with sift-corpus)")


def _check_cache_vs_model(out_dir: Path, m: str, path: str, dims: dict) -> None:
    mp = out_dir / C.MANIFEST
    if not mp.exists():
        return
    old = C.read_manifest(out_dir).get("models", {}).get(m)
    if not old:
        return
    for k in ("vocab_size", "hidden_size", "num_layers"):
        if old.get(k) != dims[k]:
            raise SiftError(f"{mp}: cache records {k}={old.get(k)} for {m!r} but model {path} has {dims[k]}; the model "
                            f"does not match this trajectory folder (use another output_dir or overwrite=true)")


@dataclass(eq=False)
class _ExtractionRun:
    """What one ``extract_corpus`` call shares across its models: the inputs, the Lightning settings, and what
    each model's extraction adds (cache keys, shard metadata, manifest entries, shard tasks, written shards)."""

    corpus_dir: Path
    out_dir: Path
    index: C.CorpusIndex
    corpus_sha: str
    cfg: ExtractConfig
    models: dict[str, str]
    dtype: str | None
    overwrite: bool
    trainer_kwargs: dict[str, Any]
    n_shards: int
    progress: bool
    callbacks: list | None
    keys: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    tasks: list = field(default_factory=list)
    written: list[str] = field(default_factory=list)


def _extract_model(run: _ExtractionRun, m: str, given: tuple[Any, Any] | None) -> tuple[list, bool]:
    """Extract model ``m``'s shards (loading it unless ``given``); fills ``run``'s ``keys``, ``meta``, ``info`` and
    ``tasks`` for it and returns (the shards this process computed, whether it is rank 0)."""
    cfg, path = run.cfg, run.models[m]
    model, tok = given or _load(path, run.dtype)
    dims = model_dims(model)
    _check_corpus_vs_model(run.corpus_dir, run.index, m, path, dims, tok)
    if not run.overwrite:
        _check_cache_vs_model(run.out_dir, m, path, dims)
    fp = model_fingerprint(path)
    # the weights' dtype changes the states (bfloat16 vs float32), so it is part of the cache key
    weights_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    run.keys[m] = C.cache_key(run.corpus_sha, fp, m, {**cfg.key_fields(), "weights_dtype": weights_dtype})
    ex_channels = Extractor(model, cfg, tokenizer=tok).channels
    run.meta[m] = {"model": m, "channels": ex_channels, "profile_names": profile_names(cfg.interventions), **dims}
    run.info[m] = {"path": str(path), "fingerprint": fp, "key": run.keys[m], **dims, "channels": ex_channels,
                   "scalar_names": SCALAR_NAMES, "profile_names": profile_names(cfg.interventions),
                   "n_traces": len(run.index.offsets[m])}
    mine = plan_shards(C.CorpusIndex(**{**vars(run.index), "offsets": {m: run.index.offsets[m]}}), run.out_dir,
                       run.keys, cfg.shard_size)
    run.tasks += mine
    module = ExtractionModule({m: model}, {m: tok}, cfg, names=run.models)
    writer = ShardWriter(run.meta, total=run.n_shards, progress=run.progress)
    writer.written = run.written  # one count across the models
    trainer = pl.Trainer(callbacks=[writer, *(run.callbacks or [])], **run.trainer_kwargs)
    trainer.predict(module, datamodule=ShardDataModule(run.corpus_dir / "traces.jsonl", mine),
                    return_predictions=False)
    trainer.strategy.barrier()
    return list(module.computed), trainer.is_global_zero


def extract_corpus(corpus_dir: str | Path, out_dir: str | Path, models: dict[str, str], cfg: ExtractConfig, *,
                   model_field: str = "family", families: list[str] | None = None, dtype: str | None = None,
                   trainer_kwargs: dict[str, Any] | None = None, overwrite: bool = False, progress: bool = False,
                   callbacks: list | None = None, loaded: dict[str, tuple[Any, Any]] | None = None) -> dict | None:
    """Extract every trace of ``corpus_dir`` into ``out_dir``; returns the manifest (None on ranks ≠ 0).

    ``models`` maps a value of ``record[model_field]`` to an HF model folder, .gguf file or cached hub name.
    ``loaded`` may give already loaded ``(model, tokenizer)`` pairs (tests, benchmarks). After a run,
    ``extract_corpus.last_run`` lists the shards this process computed and wrote.
    """
    cfg.validate()
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    t0 = time.time()
    index = C.index_corpus(corpus_dir / "traces.jsonl", model_field)
    check_corpus_manifest(corpus_dir, index.n)
    wanted = sorted(index.offsets) if families is None else list(families)
    missing = [m for m in wanted if m not in models]
    if missing:
        raise SiftError(f"{corpus_dir / 'traces.jsonl'}: traces of {missing} but `models` has no entry for them "
                        f"(models: {', '.join(models) or 'none'})")
    index.offsets = {m: index.offsets[m] for m in wanted if m in index.offsets}
    corpus_sha = file_sha256(corpus_dir / "traces.jsonl", limit=None)
    from sift.lm.loading import resolve_dtype

    on_gpu = str((trainer_kwargs or {}).get("accelerator", "cpu")) in ("gpu", "cuda")
    dtype = resolve_dtype(dtype, "cuda" if on_gpu else "cpu")
    kw = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_model_summary=False,
              enable_progress_bar=progress, use_distributed_sampler=False, inference_mode=True)
    kw.update(trainer_kwargs or {})
    warnings.filterwarnings("ignore", message=".*infer the batch indices.*")
    n_shards = sum(-(-len(offs) // cfg.shard_size) for offs in index.offsets.values())
    run = _ExtractionRun(corpus_dir, out_dir, index, corpus_sha, cfg, models, dtype, overwrite, kw, n_shards,
                         progress, callbacks)
    computed: list = []
    is_zero = True
    for m in index.offsets:  # one model in memory at a time: loaded, its shards extracted, freed
        given = (loaded or {}).get(m)
        got, is_zero = _extract_model(run, m, given)
        computed += got
        if given is None:  # the model loaded here died with _extract_model's frame (Lightning holds it until then);
            release_memory()  # a given one stays the caller's (a full collection costs 0.25 s on a loaded heap)
    info, tasks = run.info, run.tasks
    extract_corpus.last_run = {"computed": computed, "written": list(run.written)}  # type: ignore[attr-defined]
    if not is_zero:
        return None
    mine = set(run.written)  # checked in memory before the write: the header says the file is complete
    bad = [(t.path, why) for t in tasks
           if (why := C.shard_problem(t.path, t.key, header_only=t.path in mine)) is not None]
    if bad:
        raise SiftError(f"{bad[0][0]}: shard unusable after extraction ({bad[0][1]}; {len(bad)} of {len(tasks)} "
                        f"shards); rerun to resume")
    for m in info:
        info[m]["shards"] = [str(Path(t.path).relative_to(out_dir)) for t in tasks if t.model == m]
    from sift.provenance import provenance

    manifest = {
        "format": C.FORMAT, "sift_version": __version__,
        "corpus": {"dir": str(corpus_dir.resolve()), "traces": index.n, "sha256": corpus_sha},
        "model_field": model_field, "config": asdict(cfg), "models": info,
        "seconds": round(time.time() - t0, 2),
        "shards": {"total": len(tasks), "computed_by_rank0": len(computed)},
        "provenance": provenance(cfg.key_fields(), model_ids={m: models[m] for m in info}),
    }
    C.write_manifest(out_dir, manifest)
    return manifest
