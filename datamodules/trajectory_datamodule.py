"""The trajectory DataModule: cached descriptors + traces.jsonl/pairs.jsonl → TraceBatch loaders.

Splits are 60/15/25 by base item (every trace of an item in one split; deterministic from ``seed``). Only
labelled traces (φ* verified, not ambiguous) with a non-empty CoT become examples; the others are counted in
``summary``. Transfer: ``holdout_domain`` removes that domain's items from train/val/test and serves all of
its traces as the ``transfer`` split; ``holdout_model`` removes that model's traces from train/val/test and
serves its traces on the test-split items as ``transfer``.

Per-step channels ``x`` follow :mod:`datamodules.batch` (``velocity/l*``, ``drift/l*``, ``early_commitment``,
``attention_stability``); ``early_commitment`` is e_t from the answer probe of :mod:`sift.trajectories.probe`, fit
per source model (for this split, by the trajectory stage; cached in ``cache_dir``) on the
final-layer states of traces whose base item is in the train split (answers only: the probe never sees φ*).

The ``text_sift`` control's input travels beside them: ``token_ids`` / ``token_segment``, the model's token ids of
the prompt, the CoT and the answer per step (:mod:`datamodules.token_steps`): prompt and answer one token per
step up to ``token_prompt_steps`` / ``token_answer_steps`` (binned beyond), the CoT in exactly the descriptor
sequence's steps (step k of the CoT covers the tokens of descriptor step k).

Source models of different shapes (layers × width): every model is mapped, as it is loaded, onto the common
shape (L*, d*) = (fewest layers, smallest width) of the DataModule's models (:mod:`sift.trajectories.common_shape`;
the cache stays native). Descriptor channels are resampled on relative depth (target layer j reads source layer
⌊j·L/L* + ½⌋; the last maps to the last), so ``channel_names`` are those of L* layers; ``pooled`` and
``prompt_pooled`` go through a fixed random projection per model (orthonormal rows scaled by √(d/d*), seeded by
the model's name), so ``pooled_dim`` = d*. The projection is not learned: it preserves norms, not meaning, and
two models' projected states share no basis, so a width-dependent detector (e.g. the hidden-state probe) trained
on one model does not read another model's states in its basis — held-out-model transfer measures exactly that.
Answer probe, early commitment, scalars and profiles are computed per model at its native shape. A model already
of the common shape is unchanged (a one-shape DataModule gives the same tensors as without the mapping).
``common_shape`` (also in ``summary``) records the native shapes, the common one and which models were mapped.

Loaders:

* ``train_dataloader()`` — environment-balanced, for IRM/DANN. **Each step yields ``list[TraceBatch]``**, one
  batch per environment present in the training split, in increasing env id (``batch.env`` is constant within a
  batch; ``train_env_ids`` lists them). Each holds ``env_batch_size`` traces (default ``batch_size``) drawn
  without replacement from a per-epoch shuffle of that environment, wrapping around (small environments are
  revisited within an epoch). An epoch has ⌈N_train / (n_env · env_batch_size)⌉ steps. Shuffles depend on
  (seed, ``trainer.current_epoch``, env). The sampler yields ``(epoch, step)`` items, so Lightning's distributed
  sampler wrapper can split the steps over DDP ranks.
* ``train_flat_dataloader()`` — a plain shuffled TraceBatch loader over the train split (baselines).
* ``val_dataloader()``, ``calib_dataloader()``, ``test_dataloader()``, ``transfer_dataloader()`` — ordered
  TraceBatch loaders (``calib``: the ``calib_fraction`` share of the validation items, held out from
  checkpoint selection and thresholds for SGR calibration); example i
  of ``dataset(split)`` is row i in order, which is what :class:`~datamodules.batch.PairIndex` refers to.
* ``pairs(split, kind=None, axis=None)`` — verified pairs with both traces in the split;
  ``pair_dataloader(...)`` yields :class:`PairBatch` (source batch, shifted batch, the PairIndex list).

Environments (``env_by="condition"``): one per condition present among the traces (AXES order; ``model_family``
has no traces of its own: its variant is the other model, see ``model``); ``env_by="condition_model"`` makes
one per (condition, source model).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from datamodules.batch import EpochShuffleSampler, PairIndex, TraceBatch, TraceExample, collate, loader_generator
from datamodules.token_steps import token_steps
from sift.corpus import audit as A
from sift.corpus.axes import AXES
from sift.corpus.store import iter_jsonl
from sift.errors import SiftError
from sift.provenance import file_sha256
from sift.trajectories import cache as C
from sift.trajectories import features as F
from sift.trajectories.common_shape import ChannelLayout, ShapeMap, channel_layout, common_shape
from sift.trajectories.descriptors import early_commitment
from sift.trajectories.extract import check_phi, check_record
from sift.trajectories.probe import early_commitment_curves
from sift.trajectories.splits import item_splits

SPLITS = ("train", "val", "calib", "test", "transfer")
DOMAIN_ORDER = ("arithmetic", "modular", "boolean", "choice")


class PairBatch(NamedTuple):
    source: TraceBatch
    shifted: TraceBatch
    pairs: list[PairIndex]


class TraceDataset(Dataset):
    def __init__(self, examples: list[TraceExample]):
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> TraceExample:
        return self.examples[i]


class EnvStepDataset(Dataset):
    """Item ``(epoch, step)`` = the list of per-environment TraceBatches of that training step.

    With ``length_buckets = W > 1``, every group of W consecutive steps takes the same traces as without
    buckets, but each environment's W·b traces of the group are sorted by length before being cut into
    batches, and the group's steps are then shuffled (seeded): step k of a group holds the k-th shortest
    batch of every environment, so a step pads to a similar length everywhere (less padding to compute; the
    same traces per epoch and per group). ``length_buckets = 1`` keeps the plain shuffled order.
    """

    def __init__(self, examples: list[TraceExample], env_ids: list[int], env_batch_size: int, seed: int,
                 length_buckets: int = 1):
        self.examples, self.env_ids, self.b, self.seed = examples, env_ids, env_batch_size, seed
        self.buckets = max(1, int(length_buckets))
        self.members = {e: [i for i, ex in enumerate(examples) if ex.env == e] for e in env_ids}
        self.steps = max(1, math.ceil(len(examples) / (len(env_ids) * env_batch_size))) if env_ids else 0
        self._perm: dict[tuple[int, int, int], list[int]] = {}
        self._plan: tuple[int, list[dict[int, list[int]]]] | None = None

    def __len__(self) -> int:
        return self.steps

    def _order(self, epoch: int, env: int, rnd: int) -> list[int]:
        key = (epoch, env, rnd)
        if key not in self._perm:
            if len(self._perm) > 64:
                self._perm.clear()
            p = list(self.members[env])
            random.Random(f"{self.seed}:{epoch}:{env}:{rnd}").shuffle(p)
            self._perm[key] = p
        return self._perm[key]

    def _stream(self, epoch: int, env: int, start: int, stop: int) -> list[int]:
        """Positions ``start:stop`` of the environment's epoch stream (reshuffled rounds when it is small)."""
        n = len(self.members[env])
        return [self._order(epoch, env, p // n)[p % n] for p in range(start, stop)]

    def _epoch_plan(self, epoch: int) -> list[dict[int, list[int]]]:
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1]
        plan: list[dict[int, list[int]]] = []
        rng = random.Random(f"{self.seed}:{epoch}:length-buckets")
        for g0 in range(0, self.steps, self.buckets):
            size = min(self.buckets, self.steps - g0)
            cut = {}
            for e in self.env_ids:
                chunk = self._stream(epoch, e, g0 * self.b, (g0 + size) * self.b)
                chunk.sort(key=lambda i: self.examples[i].x.shape[0])  # stable: ties keep the shuffled order
                cut[e] = [chunk[k * self.b:(k + 1) * self.b] for k in range(size)]
            group = [{e: cut[e][k] for e in self.env_ids} for k in range(size)]
            rng.shuffle(group)
            plan += group
        self._plan = (epoch, plan)
        return plan

    def indices(self, epoch: int, step: int) -> dict[int, list[int]]:
        if self.buckets > 1:
            return self._epoch_plan(epoch)[step]
        return {e: self._stream(epoch, e, step * self.b, (step + 1) * self.b) for e in self.env_ids}

    def __getitem__(self, item: tuple[int, int]) -> list[TraceBatch]:
        epoch, step = item
        return [collate([self.examples[i] for i in idx]) for idx in self.indices(epoch, step).values()]


class EnvStepSampler(Sampler):
    """Yields ``(epoch, step)``; the epoch comes from ``epoch_fn`` (the trainer's) or counts its own passes."""

    def __init__(self, steps: int, epoch_fn=None):
        self.steps, self.epoch_fn = steps, epoch_fn
        self._passes = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else self._passes
        self._passes += 1
        return iter([(epoch, s) for s in range(self.steps)])

    def __len__(self) -> int:
        return self.steps


def _identity(x):
    return x


def _token_segments(r: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of a record's prompt (+ generated tokens before the CoT), CoT and answer (compact int arrays)."""
    gen = np.asarray(r.get("generated_ids") or [], dtype=np.int32)
    c0, c1 = (int(v) for v in r["cot_span"])
    prompt = np.concatenate([np.asarray(r.get("prompt_ids") or [], dtype=np.int32), gen[:c0]])
    return prompt, gen[c0:c1], gen[c1:]


@dataclass
class _Trace:
    trace_id: str
    base_item: str
    domain: str
    model: str
    condition: str
    phi: int | None
    answer: str | None
    text: list[float]
    control_text: str = ""  # prompt + CoT (text_bow control)
    surface: dict | None = None  # structured text features (surface control; sift.corpus.audit)
    # token ids of prompt (+ generated tokens before the CoT), CoT and answer (text_sift control)
    token_segments: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class TrajectoryDataModule(pl.LightningDataModule):
    """Trajectory datasets, splits, environments and pair indices from a ``sift-extract`` folder."""

    def __init__(self, trajectory_dir: str | Path, corpus_dir: str | Path | None = None, *, batch_size: int = 32,
                 env_batch_size: int | None = None, seed: int = 0, split: Sequence[float] = (0.6, 0.15, 0.25),
                 models: Sequence[str] | None = None, holdout_domain: str | None = None,
                 holdout_model: str | None = None, env_by: str = "condition", drop_channels: Sequence[str] = (),
                 probe_C: float = 1.0, probe_max_samples: int = 20_000, num_workers: int = 0,
                 length_buckets: int = 8, calib_fraction: float = 0.0, cache_dir: str | Path | None = None,
                 token_prompt_steps: int = 64, token_answer_steps: int = 8, answer_line: bool = True):
        super().__init__()
        if env_by not in ("condition", "condition_model"):
            raise SiftError(f"env_by must be 'condition' or 'condition_model', got {env_by!r}")
        if len(split) != 3 or abs(sum(split) - 1) > 1e-6 or min(split) < 0:
            raise SiftError(f"split must be three non-negative fractions summing to 1, got {list(split)}")
        if not 0.0 <= calib_fraction < 1.0:
            raise SiftError(f"calib_fraction must lie in [0, 1), got {calib_fraction}")
        self.calib_fraction = float(calib_fraction)
        self.trajectory_dir = Path(trajectory_dir)
        self.corpus_dir = Path(corpus_dir) if corpus_dir is not None else None
        self.batch_size, self.env_batch_size = batch_size, env_batch_size or batch_size
        self.seed, self.split_fractions = seed, tuple(split)
        self.models_filter = list(models) if models is not None else None
        self.holdout_domain, self.holdout_model = holdout_domain, holdout_model
        self.env_by, self.drop_channels = env_by, list(drop_channels)
        self.probe_C, self.probe_max_samples, self.num_workers = probe_C, probe_max_samples, num_workers
        self.length_buckets = length_buckets
        # text_sift's token steps (datamodules.token_steps): prompt and answer tokens one per step up to these caps
        # (binned beyond); the CoT takes the descriptor sequence's steps
        if token_prompt_steps < 1 or token_answer_steps < 1:
            raise SiftError(f"token_prompt_steps and token_answer_steps must be ≥ 1, got {token_prompt_steps}, "
                            f"{token_answer_steps}")
        self.token_prompt_steps, self.token_answer_steps = int(token_prompt_steps), int(token_answer_steps)
        # the answer line's steps (extraction.answer_line) in the sequences; false: the CoT's steps only
        self.answer_line = bool(answer_line)
        # derived caches (early-commitment curves) and their lock: never in the trajectory folder, which is input
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._ready = False

    # ------------------------------------------------------------------------------------------------------ setup
    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        man = C.read_manifest(self.trajectory_dir)
        corpus = self.corpus_dir or Path(man["corpus"]["dir"])
        traces_path, pairs_path = corpus / "traces.jsonl", corpus / "pairs.jsonl"
        if not traces_path.exists():
            raise SiftError(f"{traces_path}: no such file (corpus of {self.trajectory_dir / C.MANIFEST})")
        if file_sha256(traces_path, limit=None) != man["corpus"]["sha256"]:
            raise SiftError(f"{traces_path}: changed since {self.trajectory_dir / C.MANIFEST} was extracted from it; "
                            f"rerun sift-extract")
        models = [m for m in man["models"] if self.models_filter is None or m in self.models_filter]
        if not models:
            raise SiftError(f"{self.trajectory_dir / C.MANIFEST}: none of models {self.models_filter} was extracted "
                            f"(has {', '.join(man['models'])})")
        if self.holdout_model is not None and self.holdout_model not in models:
            raise SiftError(f"holdout_model {self.holdout_model!r} not among the extracted models {models}")
        info = {m: man["models"][m] for m in models}
        self._common_shape(info)
        first = info[models[0]]
        self.model_names = sorted(models)
        self._read_traces(traces_path, set(models))
        self._make_splits()
        self._load_descriptors(info)
        self._build(first)
        self.summary["common_shape"] = self.common_shape
        self._read_pairs(pairs_path)
        self._ready = True

    def _common_shape(self, info: dict) -> None:
        """The common shape (:mod:`sift.trajectories.common_shape`) and each model's map onto it."""
        shapes = {m: (int(i["num_layers"]), int(i["hidden_size"])) for m, i in info.items()}
        L, d = common_shape(shapes)
        layouts = {}
        for m in sorted(info):
            try:
                layouts[m] = channel_layout(info[m]["channels"])
            except SiftError as e:
                raise SiftError(f"{self.trajectory_dir / C.MANIFEST}: model {m!r}: {e}") from None
            if layouts[m].layers != shapes[m][0]:
                raise SiftError(f"{self.trajectory_dir / C.MANIFEST}: channels of {m!r} are not those of its "
                                f"{shapes[m][0]}-layer model")
        if len({lay.answer_line for lay in layouts.values()}) > 1:
            raise SiftError(f"{self.trajectory_dir / C.MANIFEST}: some models have answer-line steps and some do "
                            f"not; extract them all with the same extraction.answer_line")
        slots = min(lay.slots for lay in layouts.values())
        target = ChannelLayout(L, min(lay.heads for lay in layouts.values()) if slots else 0, slots,
                               next(iter(layouts.values())).answer_line)
        self.shape_maps = {m: ShapeMap(m, *shapes[m], L, d, layouts[m], target) for m in sorted(info)}
        # channel names: the cache's own for one shape (unchanged), else those of the common shape
        self._stored_channels = target.names() if len(set(layouts.values())) > 1 else None
        self.common_shape: dict[str, Any] = {"num_layers": L, "hidden_size": d,
                                             "native": {m: list(s) for m, s in sorted(shapes.items())},
                                             "mapped": sorted(m for m, mp in self.shape_maps.items()
                                                              if not mp.identity)}

    def _read_traces(self, path: Path, models: set[str]) -> None:
        field_ = C.read_manifest(self.trajectory_dir).get("model_field", "family")
        self.traces: dict[str, _Trace] = {}
        for lineno, r in iter_jsonl(path):
            where = f"{path}:{lineno}"
            check_record(r, where)  # ids, φ* ∈ {0, 1, null}: a wrong label must not become a silent 0
            m = str(r.get(field_))
            if m not in models:
                continue
            tid = str(r["trace_id"])
            if tid in self.traces:
                raise SiftError(f"{where}: duplicate trace_id {tid!r}")
            self.traces[tid] = _Trace(tid, str(r["base_item"]), str(r["domain"]), m, str(r["condition"]),
                                      check_phi(r["phi"], where), r.get("answer"), F.text_features(r),
                                      A.control_text(r), A.surface_features(r), _token_segments(r))
        # the surface control's columns: one categorical vocabulary over the whole corpus (every split)
        surf, self.surface_names, _ = A.surface_matrix([t.surface for t in self.traces.values()])
        self.surface_rows = dict(zip(self.traces, surf.tolist()))
        domains = {t.domain for t in self.traces.values()}
        if self.holdout_domain is not None and self.holdout_domain not in domains:
            raise SiftError(f"holdout_domain {self.holdout_domain!r} not in the corpus (domains: {sorted(domains)})")
        self.domain_names = [d for d in DOMAIN_ORDER if d in domains] + sorted(domains - set(DOMAIN_ORDER))
        conds = {t.condition for t in self.traces.values()}
        conds_sorted = [c for c in AXES if c in conds] + sorted(conds - set(AXES))
        if self.env_by == "condition":
            self.env_names = conds_sorted
        else:
            self.env_names = [f"{c}@{m}" for c in conds_sorted for m in self.model_names]

    def _env(self, t: _Trace) -> int:
        return self.env_names.index(t.condition if self.env_by == "condition" else f"{t.condition}@{t.model}")

    def _make_splits(self) -> None:
        items = {t.base_item for t in self.traces.values()
                 if self.holdout_domain is None or t.domain != self.holdout_domain}
        self.split_items = item_splits(items, self.seed, self.split_fractions, self.calib_fraction)
        item_split = {i: s for s, its in self.split_items.items() for i in its}
        self.trace_split: dict[str, str | None] = {}
        for t in self.traces.values():
            if self.holdout_domain is not None and t.domain == self.holdout_domain:
                s = "transfer"
            elif self.holdout_model is not None and t.model == self.holdout_model:
                s = "transfer" if item_split.get(t.base_item) == "test" else None
            else:
                s = item_split.get(t.base_item)
            self.trace_split[t.trace_id] = s

    def _load_descriptors(self, info: dict) -> None:
        """Descriptors, pooled states and scalars of every trace; the answer probe's curves e_t (fit for this
        split by the trajectory stage, :func:`sift.trajectories.probe.early_commitment_curves`) and early
        commitment."""
        self.desc: dict[str, dict[str, Any]] = {}
        for m in sorted(info):
            expect = {k: info[m][k] for k in ("num_layers", "hidden_size", "vocab_size")}
            for s in info[m]["shards"]:
                path = self.trajectory_dir / s
                t, meta = C.read_shard(path, expect)
                if meta["channels"] != info[m]["channels"]:
                    raise SiftError(f"{path}: channels {meta['channels']} differ from the manifest's")
                off = t["bin_offsets"].tolist()
                mp = self.shape_maps[m]  # onto the common shape (the same tensors where the model has it)
                desc, pooled, final = mp.channels(t["desc"]), mp.vectors(t["pooled"]), mp.vectors(t["final"].float())
                prompt_final = mp.vectors(t["prompt_final"]) if "prompt_final" in t else None
                n_ans = t["n_answer"].tolist()
                for i, tid in enumerate(meta["trace_ids"]):
                    if tid not in self.traces:
                        raise SiftError(f"{path}: trace {tid!r} is not in the corpus's traces.jsonl")
                    self.desc[tid] = {"desc": desc[off[i]:off[i + 1]].clone(), "n_answer": int(n_ans[i]),
                                      "states": final[off[i]:off[i + 1]].clone(),
                                      "n_tokens": int(t["n_tokens"][i]), "pooled": pooled[i].clone(),
                                      "scalars": t["scalars"][i].tolist(),
                                      "prompt_final": prompt_final[i].clone() if prompt_final is not None else None,
                                      "answer_logp": float(t["answer_logp"][i]), "profile": t["profile"][i].tolist(),
                                      "answer_margin": float(t["answer_margin"][i]) if "answer_margin" in t
                                      else None}
        missing = [tid for tid in self.traces if tid not in self.desc]
        if missing:
            raise SiftError(f"{self.trajectory_dir / C.MANIFEST}: {len(missing)} traces of the corpus have no cached "
                            f"trajectory (e.g. {missing[0]!r}); rerun sift-extract")
        traces = {tid: (t.model, t.base_item, t.answer) for tid, t in self.traces.items()}
        curves = early_commitment_curves(self.trajectory_dir, info, traces, self.split_items["train"],
                                         C_=self.probe_C, max_samples=self.probe_max_samples, seed=self.seed,
                                         cache_dir=self.cache_dir)
        for tid, d in self.desc.items():
            d["e"] = curves[tid]
            d["ec"] = early_commitment(d["e"][:len(d["e"]) - d["n_answer"]], d["n_tokens"])  # the CoT's steps

    def _build(self, info: dict) -> None:
        # velocity…, drift…, attention_stability[, answer_line, head_mass…]; early commitment goes before stability
        stored = list(self._stored_channels or info["channels"])
        ia = stored.index("attention_stability")
        all_channels = stored[:ia] + ["early_commitment"] + stored[ia:]
        keep = [i for i, c in enumerate(all_channels) if not any(c == d or c.startswith(d) for d in self.drop_channels)]
        self.channel_names = [all_channels[i] for i in keep]
        self.feature_names = F.feature_names(info["profile_names"]) + list(self.surface_names)
        self.feature_groups = F.feature_groups(self.feature_names)
        self.pooled_dim = int(self.common_shape["hidden_size"])
        self.summary: dict[str, Any] = {"ambiguous": 0, "empty_cot": 0, "unassigned": 0}
        buckets: dict[str, list[TraceExample]] = {s: [] for s in SPLITS}
        keep_t = torch.tensor(keep)
        for tid, tr in self.traces.items():
            s = self.trace_split[tid]
            d = self.desc[tid]
            if tr.phi is None:
                self.summary["ambiguous"] += 1
                continue
            if d["n_tokens"] == 0:
                self.summary["empty_cot"] += 1
                continue
            if s is None:
                self.summary["unassigned"] += 1
                continue
            x = torch.cat([d["desc"][:, :ia], d["e"][:, None], d["desc"][:, ia:]], dim=1)[:, keep_t]
            n_cot = x.shape[0] - d["n_answer"]
            states = d["states"]
            if not self.answer_line:  # CoT positions only (the answer line's steps are the last n_answer rows)
                x, states = x[:n_cot], states[:n_cot]
            sc = d["scalars"]
            feats = F.assemble(tr.text, d["n_tokens"], d["answer_logp"], [sc[0], sc[1], d["ec"], sc[2]], d["profile"],
                               d["answer_margin"])
            feats += self.surface_rows[tid]
            p_ids, c_ids, a_ids = tr.token_segments
            tok, seg = token_steps(p_ids, c_ids, a_ids, cot_steps=n_cot, prompt_steps=self.token_prompt_steps,
                                   answer_steps=self.token_answer_steps)
            buckets[s].append(TraceExample(
                x=x.float().contiguous(), label=int(tr.phi), env=self._env(tr),
                domain=self.domain_names.index(tr.domain), model=self.model_names.index(tr.model),
                pooled=d["pooled"].float(),
                features=torch.tensor(feats, dtype=torch.float32), trace_id=tid, base_item=tr.base_item,
                prompt_pooled=d["prompt_final"].float() if d["prompt_final"] is not None else None,
                text=tr.control_text, token_ids=tok, token_segment=seg, states=states.float()))
        del self.desc
        if not buckets["train"]:  # nothing to fit: fail here, not inside a detector's first batch
            sm = self.summary
            raise SiftError(f"{self.trajectory_dir}: the training split has no labelled trace ({len(self.traces)} "
                            f"traces: {sm['ambiguous']} ambiguous (φ* null), {sm['empty_cot']} with an empty CoT, "
                            f"{sm['unassigned']} in no split; the rest in other splits); see the corpus manifest's "
                            f"label_balance and label reasons")
        self.datasets = {s: TraceDataset(b) for s, b in buckets.items()}
        self.train_env_ids = sorted({e.env for e in buckets["train"]})
        self.summary.update({f"{s}_traces": len(b) for s, b in buckets.items()})
        self.summary["env_names"] = self.env_names

    def _read_pairs(self, path: Path) -> None:
        self._pairs: dict[str, list[PairIndex]] = {s: [] for s in SPLITS}
        if not path.exists():
            raise SiftError(f"{path}: no such file (the corpus's pairs)")
        pos = {s: {e.trace_id: i for i, e in enumerate(ds.examples)} for s, ds in self.datasets.items()}
        for p in C.iter_records(path):
            if not p.get("verified"):
                continue
            for s in SPLITS:
                a, b = pos[s].get(p["source"]), pos[s].get(p["shifted"])
                if a is not None and b is not None:
                    self._pairs[s].append(PairIndex(p["axis"], p["kind"], a, b, int(p["phi_source"]),
                                                    int(p["phi_shifted"])))
        self.summary.update({f"{s}_pairs": len(v) for s, v in self._pairs.items()})

    # ---------------------------------------------------------------------------------------------------- access
    def _need(self) -> None:
        if not self._ready:
            self.setup()

    @property
    def n_channels(self) -> int:
        self._need()
        return len(self.channel_names)

    @property
    def n_envs(self) -> int:
        self._need()
        return len(self.env_names)

    def dataset(self, split: str) -> TraceDataset:
        self._need()
        if split not in SPLITS:
            raise SiftError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        return self.datasets[split]

    def condition_of(self, trace_id: str) -> str:
        """The FaithShift condition a trace was generated under (evaluation metadata)."""
        self._need()
        return self.traces[trace_id].condition

    def pairs(self, split: str, kind: str | None = None, axis: str | None = None) -> list[PairIndex]:
        """Verified pairs with both traces in ``split`` (indices into ``dataset(split)``)."""
        self.dataset(split)
        return [p for p in self._pairs[split] if (kind is None or p.kind == kind) and (axis is None or p.axis == axis)]

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        ds = self.dataset(split)
        trainer = getattr(self, "trainer", None)
        epoch_fn = (lambda: trainer.current_epoch) if trainer is not None else None
        sampler = EpochShuffleSampler(len(ds), self.seed, epoch_fn) if shuffle else None
        return DataLoader(ds, batch_size=self.batch_size, sampler=sampler, collate_fn=collate,
                          num_workers=self.num_workers, generator=loader_generator(self.seed))

    def train_dataloader(self) -> DataLoader:
        """Environment-balanced steps: each item is ``list[TraceBatch]``, one per training environment."""
        ds = EnvStepDataset(self.dataset("train").examples, self.train_env_ids, self.env_batch_size, self.seed,
                            self.length_buckets)
        trainer = getattr(self, "trainer", None)
        epoch_fn = (lambda: trainer.current_epoch) if trainer is not None else None
        return DataLoader(ds, batch_size=None, sampler=EnvStepSampler(len(ds), epoch_fn), collate_fn=_identity,
                          num_workers=self.num_workers, generator=loader_generator(self.seed))

    def train_flat_dataloader(self, shuffle: bool = True) -> DataLoader:
        return self._loader("train", shuffle=shuffle)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def resample_train(self, seed: int) -> None:
        """Replace the training split by a cluster bootstrap of its base items (as many items, drawn with
        replacement, all traces of a drawn item; ``detector.seed_resample``). Validation, calibration and test
        are untouched; deterministic in ``seed``."""
        self._need()
        by_item: dict[str, list[TraceExample]] = {}
        for e in self.datasets["train"].examples:
            by_item.setdefault(e.base_item, []).append(e)
        items = sorted(by_item)
        if not items:
            raise SiftError("resample_train: the training split is empty")
        rng = np.random.default_rng([int(seed), 0x5EED])
        drawn = rng.integers(0, len(items), size=len(items))
        self.datasets["train"] = TraceDataset([e for i in drawn for e in by_item[items[i]]])
        self.train_env_ids = sorted({e.env for e in self.datasets["train"].examples})
        self.summary["train_resampled_seed"] = int(seed)

    def calib_dataloader(self) -> DataLoader:
        """The SGR calibration part of the validation items (empty with ``calib_fraction=0``)."""
        return self._loader("calib")

    def transfer_dataloader(self) -> DataLoader:
        return self._loader("transfer")

    def pair_dataloader(self, split: str, kind: str | None = None, axis: str | None = None,
                        batch_size: int | None = None) -> Iterator[PairBatch]:
        """Batches of verified pairs of ``split``: (source TraceBatch, shifted TraceBatch, PairIndex list)."""
        ds, ps = self.dataset(split), self.pairs(split, kind, axis)
        b = batch_size or self.batch_size
        for s in range(0, len(ps), b):
            chunk = ps[s:s + b]
            yield PairBatch(collate([ds[p.source] for p in chunk]), collate([ds[p.shifted] for p in chunk]), chunk)
