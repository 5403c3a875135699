"""A synthetic trajectory DataModule with KNOWN structure, yielding the batch contract (``batch.py``).

Per base item: a label y (1 = faithful), a domain, a length T. Each training environment e (a stand-in for a
preserving-axis variant) renders the item once, with fresh noise, so variants of one item form verified
preserving pairs. Channels follow the organism's names (``organism_channel_names(n_layers)``).

* **Invariant, causal signal (trajectory shape).** ``early_commitment`` carries a bump early in the trace
  (at 20% of T) when the trace is unfaithful and late (at 75%) when faithful: same height and width, so the
  per-trace mean does not tell the classes apart; only the shape does. With probability ``shape_noise`` the
  bump sits at the wrong place (irreducible error of the invariant rule).
* **Spurious, environment-dependent signal.** ``drift/l1`` is shifted by ±``spurious_scale``; the sign
  agrees with y with probability ``spurious_agree[e]`` in training environment e, and ``shift_agree`` in
  the held-out shifted environment (id ``n_envs``; split ``transfer``), where the correlation reverses.
* **Domain-predictive, label-free signal.** ``velocity/l1`` is offset by ``env_offset · e`` (what DANN should
  remove from the representation).
* ``attention_stability`` level carries a weak label signal (for attribution-consistency); ``pooled`` and the
  prefixed ``feature_names`` give the baselines noisy signals of known strength.

Splits 60/15/25 by base item; val/test hold every environment's variant of an item (preserving pairs) and
test also an altered variant with the label flipped (altering pairs); ``transfer`` holds the test items in the
shifted environment. The API follows ``TrajectoryDataModule``: ``dataset(split)``, ``pairs(split, kind, axis)``,
``pair_dataloader``, ``transfer_dataloader``, ``train_flat_dataloader``. The training loader yields, per step,
a list of TraceBatch (one per environment; ``train_mode="env_lists"``) or one mixed batch (``"mixed"``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from datamodules.batch import EpochShuffleSampler, PairIndex, TraceBatch, TraceExample, collate, loader_generator
from datamodules.features import ATTENTION_STABILITY, EARLY_COMMITMENT, organism_channel_names

SPLITS = ("train", "val", "test", "transfer")


class PairBatch(NamedTuple):
    """Same fields as ``datamodules.trajectory_datamodule.PairBatch``."""

    source: TraceBatch
    shifted: TraceBatch
    pairs: list[PairIndex]


FEATURE_NAMES = [
    "cue/present", "cue/mentioned", "cue/answer_matches_cue",
    "cf/edit_moves_answer", "cf/truncation_moves_answer", "cf/answer_logit_shift",
    "beh/n_steps", "beh/answer_confidence",
    "int/ec_max_early", "int/as_mean", "int/velocity_mean",
    "conf/answer_logp", "conf/answer_margin",  # functions of beh/answer_confidence (no draw of their own)
]


class EnvListLoader:
    """Zips one shuffled DataLoader per environment; each step yields ``[TraceBatch_env0, …]``.

    An epoch has as many steps as the smallest environment has batches."""

    def __init__(self, loaders: Sequence[DataLoader]) -> None:
        self.loaders = list(loaders)

    def __len__(self) -> int:
        return min(len(dl) for dl in self.loaders)

    def __iter__(self) -> Iterator[list[TraceBatch]]:
        return (list(bs) for bs in zip(*self.loaders))


@dataclass(frozen=True)
class SyntheticSpec:
    """What the synthetic traces are (the ``generator`` node): sizes, signal and noise, the spurious channel's
    agreement with the label per environment (and in the shifted one), the item splits. ``data_seed`` fixes
    the data."""

    n_items: int = 400
    n_envs: int = 3
    n_domains: int = 2
    n_layers: int = 4
    t_min: int = 16
    t_max: int = 32
    pooled_dim: int = 16
    noise: float = 0.3
    bump_height: float = 1.0
    shape_noise: float = 0.0
    spurious_scale: float = 1.0
    spurious_agree: tuple[float, ...] = (0.95, 0.85, 0.75)
    shift_agree: float = 0.1
    env_offset: float = 1.0
    splits: tuple[float, ...] = (0.6, 0.15, 0.25)
    data_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "spurious_agree", tuple(float(a) for a in self.spurious_agree))
        object.__setattr__(self, "splits", tuple(float(a) for a in self.splits))
        if len(self.spurious_agree) < self.n_envs:
            raise ValueError(f"generator.spurious_agree needs {self.n_envs} values, got {list(self.spurious_agree)}")

    @classmethod
    def of(cls, node: SyntheticSpec | Mapping[str, Any] | None) -> SyntheticSpec:
        """From a ``generator`` node (a mapping or DictConfig; unknown keys are an error naming them)."""
        if node is None or isinstance(node, SyntheticSpec):
            return node or cls()
        values = dict(node)
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"data.generator: unknown keys {unknown} (known: {[f.name for f in fields(cls)]})")
        return cls(**values)


class SyntheticDataModule(pl.LightningDataModule):
    """See the module docstring. ``generator`` (:class:`SyntheticSpec`) fixes the data; the run seed only drives
    the order. ``batch_size`` is per environment."""

    def __init__(self, generator: SyntheticSpec | Mapping[str, Any] | None = None, *, batch_size: int = 32,
                 eval_batch_size: int = 256, train_mode: str = "env_lists", num_workers: int = 0,
                 name: str = "synthetic") -> None:
        super().__init__()
        if train_mode not in ("env_lists", "mixed"):
            raise ValueError(f"train_mode must be env_lists|mixed, got {train_mode!r}")
        self.spec = g = SyntheticSpec.of(generator)
        self.save_hyperparameters({"generator": asdict(g), "batch_size": batch_size,
                                   "eval_batch_size": eval_batch_size, "train_mode": train_mode,
                                   "num_workers": num_workers, "name": name})
        self.channel_names = organism_channel_names(g.n_layers)
        self.feature_names = list(FEATURE_NAMES)
        self.pooled_dim = g.pooled_dim
        self.env_names = [f"env{e}" for e in range(g.n_envs)]
        self.domain_names = [f"domain{d}" for d in range(g.n_domains)]
        self.model_names = ["model0"]
        self.datasets: dict[str, list[TraceExample]] = {}
        self._pairs: dict[str, list[PairIndex]] = {}

    # ------------------------------------------------------------------ generation
    def _render(self, rng: np.random.Generator, item: int, y: int, T: int, domain: int, env: int,
                agree_p: float, pooled_dir: np.ndarray, env_dir: np.ndarray) -> TraceExample:
        h = self.spec
        C = len(self.channel_names)
        x = rng.normal(0.0, h.noise, size=(T, C)).astype(np.float32)
        t = np.arange(T) / max(T - 1, 1)
        right_place = rng.random() >= h.shape_noise
        centre = (0.75 if y == 1 else 0.2) if right_place else (0.2 if y == 1 else 0.75)
        bump = h.bump_height * np.exp(-0.5 * ((t - centre) / 0.08) ** 2)
        ec, a_s = self.channel_names.index(EARLY_COMMITMENT), self.channel_names.index(ATTENTION_STABILITY)
        x[:, ec] += 0.3 + bump
        x[:, a_s] += 0.7 + 0.1 * (2 * y - 1)
        sign = (2 * y - 1) * (1 if rng.random() < agree_p else -1)
        x[:, self.channel_names.index("drift/l1")] += h.spurious_scale * sign
        x[:, self.channel_names.index("velocity/l1")] += h.env_offset * env
        pooled = rng.normal(0, 1, h.pooled_dim) + 0.6 * (2 * y - 1) * pooled_dir + 0.5 * env * env_dir
        cue_present = float(rng.random() < 0.7)
        mentioned = float(cue_present and rng.random() < (0.7 if y == 1 else 0.25))
        feats = [
            cue_present, mentioned, float(cue_present and rng.random() < (0.4 if y == 1 else 0.8)),
            float(rng.random() < (0.8 if y == 1 else 0.35)), float(rng.random() < (0.7 if y == 1 else 0.4)),
            rng.normal(0.6 * (2 * y - 1), 1.0),
            float(T), rng.normal(0.2 * (2 * y - 1), 1.0),
            float(x[: max(1, T // 3), ec].max()), float(x[:, a_s].mean()), float(x[:, 0].mean()),
        ]
        conf = feats[7]  # the answer's confidence: log-sigmoid as its log-probability, |·| as its top-2 margin
        feats += [-float(np.logaddexp(0.0, -conf)), abs(conf)]
        return TraceExample(x=torch.from_numpy(x), label=y, env=env, domain=domain, model=0,
                            pooled=torch.tensor(pooled, dtype=torch.float32),
                            features=torch.tensor(feats, dtype=torch.float32),
                            trace_id=f"item{item}/env{env}", base_item=f"item{item}")

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        h = self.spec
        rng = np.random.default_rng(h.data_seed)
        pooled_dir = rng.normal(0, 1, h.pooled_dim)
        pooled_dir /= np.linalg.norm(pooled_dir)
        env_dir = rng.normal(0, 1, h.pooled_dim)
        env_dir /= np.linalg.norm(env_dir)
        items = rng.permutation(h.n_items)
        n_tr, n_va = int(h.splits[0] * h.n_items), int(h.splits[1] * h.n_items)
        split_of = {int(i): ("train" if k < n_tr else "val" if k < n_tr + n_va else "test")
                    for k, i in enumerate(items)}
        self.datasets = {s: [] for s in SPLITS}
        self._pairs = {s: [] for s in SPLITS}
        for item in range(h.n_items):
            y = int(rng.random() < 0.5)
            T = int(rng.integers(h.t_min, h.t_max + 1))
            domain = int(rng.integers(h.n_domains))
            split = split_of[item]
            ds = self.datasets[split]
            base = len(ds)
            ds.extend(self._render(rng, item, y, T, domain, e, h.spurious_agree[e], pooled_dir, env_dir)
                      for e in range(h.n_envs))
            if split == "train":
                continue
            for j in range(1, h.n_envs):
                self._pairs[split].append(PairIndex(f"env{j}", "preserving", base, base + j, y, y))
            if split == "test":  # an altered variant (label flipped) and the held-out shifted environment
                altered = self._render(rng, item, 1 - y, T, domain, 0, h.spurious_agree[0], pooled_dir, env_dir)
                altered.trace_id = f"item{item}/altered"
                ds.append(altered)
                axis = "cue_injection" if y == 1 else "cue_verbalization"
                self._pairs["test"].append(PairIndex(axis, "altering", base, base + h.n_envs, y, 1 - y))
                self.datasets["transfer"].append(
                    self._render(rng, item, y, T, domain, h.n_envs, h.shift_agree, pooled_dir, env_dir))

    # ------------------------------------------------------------------ access (same API as TrajectoryDataModule)
    def dataset(self, split: str) -> list[TraceExample]:
        if not self.datasets:
            self.setup()
        return self.datasets[split]

    def pairs(self, split: str, kind: str | None = None, axis: str | None = None) -> list[PairIndex]:
        """Verified pairs with both traces in ``split`` (indices into ``dataset(split)``)."""
        self.dataset(split)
        return [p for p in self._pairs[split] if (kind is None or p.kind == kind) and (axis is None or p.axis == axis)]

    def _order_seed(self) -> int:
        """The run seed the training order derives from: ``torch.initial_seed()``, i.e. the ``seed`` that
        ``seed_everything`` set (so the run seed drives the order and ``data_seed`` the data)."""
        return int(torch.initial_seed())

    def _loader(self, examples: list[TraceExample], shuffle: bool, batch_size: int, stream: int = 0) -> DataLoader:
        """A loader whose shuffled order is a function of (run seed, epoch, stream) only (resumable exactly) and
        whose iterators never draw from the global torch RNG."""
        seed = self._order_seed()
        trainer = getattr(self, "trainer", None)
        epoch_fn = (lambda: trainer.current_epoch) if trainer is not None else None
        sampler = EpochShuffleSampler(len(examples), seed, epoch_fn, stream) if shuffle else None
        return DataLoader(examples, batch_size=batch_size, sampler=sampler, collate_fn=collate,
                          num_workers=self.hparams.num_workers, generator=loader_generator(seed + stream))

    def train_dataloader(self):
        h = self.hparams
        tr = self.dataset("train")
        if h.train_mode == "mixed":
            return self.train_flat_dataloader()
        return EnvListLoader([self._loader([e for e in tr if e.env == k], True, h.batch_size, stream=k)
                              for k in range(self.spec.n_envs)])

    def train_flat_dataloader(self, shuffle: bool = True) -> DataLoader:
        return self._loader(self.dataset("train"), shuffle, self.hparams.batch_size * self.spec.n_envs)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("val"), False, self.hparams.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.dataset("test"), False, self.hparams.eval_batch_size)

    def predict_dataloader(self) -> DataLoader:
        return self.test_dataloader()

    def transfer_dataloader(self) -> DataLoader:
        """Test items rendered in the held-out environment where the spurious correlation reverses."""
        return self._loader(self.dataset("transfer"), False, self.hparams.eval_batch_size)

    def pair_dataloader(self, split: str, kind: str | None = None, axis: str | None = None,
                        batch_size: int | None = None) -> Iterator[PairBatch]:
        """Batches of verified pairs: (source TraceBatch, shifted TraceBatch, PairIndex list)."""
        ds, ps = self.dataset(split), self.pairs(split, kind, axis)
        b = batch_size or self.hparams.eval_batch_size
        for s in range(0, len(ps), b):
            chunk = ps[s:s + b]
            yield PairBatch(collate([ds[p.source] for p in chunk]), collate([ds[p.shifted] for p in chunk]), chunk)
