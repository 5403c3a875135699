"""The main job (``sift-faithshift``): every stage of docs/design.md §1, each resumable, each writing to disk.

    corpus/         sift-corpus      traces + verified pairs + manifest
    trajectories/   sift-extract     descriptor sequences, pooled states, intervention profiles
    runs/<key>/     sift-train       one detector × seed (main incl. controls, ablation, transfer), results.json
    runs/<key>/predictions/<split>.npz   per-trace P(faithful) of the run's best checkpoint
    report/         sift-evaluate    report.md, results.json, figures (+ W&B offline run)
    kinds/<kind>/{corpus,trajectories}   every mechanism kind of ``mechanisms`` but the primary (organism only);
                    its runs are runs/kinds/<kind>/<detector>/seed<s>, and every run of the cross-kind comparison
                    predicts the other kinds' test splits: runs/<key>/predictions/on_<kind>/test.npz

A rerun reuses finished work: the corpus and extraction caches resume by content hash, finished training
runs are skipped by their run hash (``skip_if_done``), predictions are reused when the run's hash matches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

import sift.corpus.config  # noqa: F401  (registers the source schemas the faithshift config's `source` uses)
from sift.atomic import write_json, write_text
from sift.config import compose
from sift.corpus.job import run_corpus, source_config
from sift.corpus.sources import get_source
from sift.detectors.registry import DetectorEntry, detector_entries
from sift.errors import SiftError
from sift.evaluation.kinds_section import cross_kind_file, kind_root, mechanism_kinds, primary_kind

SPLITS = ("val", "calib", "test", "transfer")


@dataclass
class RunSpec:
    """One detector training run of the main job."""

    key: str  # folder under runs/, e.g. "main/sift/seed0"
    group: str  # main | ablation | factorial | transfer_domain | transfer_model | kind
    detector: str
    seed: int
    overrides: list[str] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)  # e.g. {"ablation": "no_irm"} or {"holdout_domain": ...}
    cost: float = 1.0  # the detector's registry.cost: costlier runs start first


@dataclass
class StackSpec:
    """The seeds of one run config, trained stacked in one job (:func:`sift.training.train_stacked`)."""

    key: str  # e.g. "main/sift/seeds0-1-2-3" (where a failed job's log goes)
    runs: list[RunSpec]
    cost: float

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]


def stack_seeds(cfg: DictConfig, detector: str | None = None) -> bool:
    """``trainer.stack_seeds``: whether the seeds of a run config (of ``detector``; None: of any) train stacked.
    ``true`` | ``false`` | a list of detector names | ``auto`` (default): when the runs train on a GPU (where a
    small network's step is bound by kernel launches, not arithmetic). On CPU the stacked step is no faster than S
    separate ones (measured: docs/training.md, "Stacked seeds"), so ``auto`` keeps separate runs there."""
    v = (cfg.get("trainer") or {}).get("stack_seeds", "auto")
    if isinstance(v, bool):
        return v
    if OmegaConf.is_list(v) or isinstance(v, list):
        return detector is None or detector in [str(d) for d in v]
    if str(v) != "auto":
        raise SiftError(f"trainer.stack_seeds: expected true, false, auto or a list of detectors, got {v!r}")
    from sift.execution import gpus_per_job

    return gpus_per_job(cfg) > 0


def training_jobs(cfg: DictConfig, specs: list[RunSpec]) -> list[RunSpec | StackSpec]:
    """The jobs of the training stage: with ``trainer.stack_seeds``, the runs that differ only in the seed (one
    group, detector, overrides and tags) and whose detector trains stacked become one :class:`StackSpec`; every
    other run is a job of its own."""
    if not stack_seeds(cfg):
        return list(specs)
    from sift.detectors.seed_stack import config_stacks

    groups: dict[tuple, list[RunSpec]] = {}
    for s in specs:
        groups.setdefault((s.group, s.detector, tuple(s.overrides), tuple(sorted(s.tags.items()))), []).append(s)
    jobs: list[RunSpec | StackSpec] = []
    stacks: dict[tuple[str, ...], bool] = {}
    for members in groups.values():
        ov = tuple(members[0].overrides)
        if len(members) > 1 and stack_seeds(cfg, members[0].detector) and stacks.setdefault(
                ov, config_stacks(compose("train", list(ov)).detector)):
            base = members[0].key.rsplit("/", 1)[0]
            jobs.append(StackSpec(f"{base}/seeds{'-'.join(str(m.seed) for m in members)}", members,
                                  members[0].cost * len(members)))
        else:
            jobs += members
    return jobs


def ablated_detector(cfg: DictConfig, registry: dict[str, DetectorEntry]) -> str | None:
    """The job's detector that the ablation presets apply to (``registry.ablations``; at most one)."""
    named = [d for d in cfg.detectors if registry[d].ablations]
    if len(named) > 1:
        raise SiftError(f"detectors: {', '.join(named)} all declare registry.ablations; the ablation presets "
                        f"apply to one detector")
    if cfg.ablations and not named:
        raise SiftError(f"ablations: none of the detectors {list(cfg.detectors)} declares registry.ablations "
                        f"(give ablations=[], or list the detector the presets are written for)")
    return named[0] if named else None


def holdout_models(cfg: DictConfig) -> list[str]:
    """``transfer.holdout_models``: the listed families, or with ``auto`` every source model but the first."""
    hm = cfg.transfer.holdout_models
    if hm == "auto":
        c = corpus_config(cfg, Path(cfg.paths.output_dir))
        src = source_config(c.source)
        return get_source(src.type).families(src)[1:]
    if isinstance(hm, str) or hm is None:
        raise SiftError(f"transfer.holdout_models: expected a list of model families or 'auto', got {hm!r}")
    return [str(m) for m in hm]


def extra_kinds(cfg: DictConfig) -> list[str]:
    """The mechanism kinds that get their own corpus, trajectories and runs: every kind but the primary."""
    return [k for k in mechanism_kinds(cfg) if k != primary_kind(cfg)]


def kind_detectors(cfg: DictConfig) -> list[str]:
    """The detectors and controls compared across mechanism kinds: ``kind_detectors``, or the job's detectors and
    controls when null (each must be one of them: the primary kind's numbers are their main runs)."""
    known = list(dict.fromkeys([*cfg.detectors, *(cfg.get("controls") or [])]))
    listed = cfg.get("kind_detectors")
    if listed is None:
        return known
    for d in listed:
        if d not in known:
            raise SiftError(f"kind_detectors: {d!r} is not one of the job's detectors or controls ({known})")
        if list(listed).count(d) > 1:
            raise SiftError(f"kind_detectors: {d!r} is listed twice")
    return [str(d) for d in listed]


def run_kind(cfg: DictConfig, spec: RunSpec) -> str:
    """The mechanism kind whose trajectories a run trains on (the primary kind unless a ``kind`` run)."""
    return spec.tags.get("mechanism_kind") or primary_kind(cfg)


def cross_kinds(cfg: DictConfig, spec: RunSpec) -> list[str]:
    """The kinds whose test split a run predicts for the cross-kind matrix: every other kind, for the main and
    ``kind`` runs of the kind detectors with a seed of ``kind_seeds``; [] for any other run."""
    if spec.group not in ("main", "kind") or int(spec.seed) not in {int(s) for s in cfg.kind_seeds}:
        return []
    kinds = mechanism_kinds(cfg)
    if len(kinds) < 2 or spec.detector not in kind_detectors(cfg):
        return []
    return [k for k in kinds if k != run_kind(cfg, spec)]


def plan_runs(cfg: DictConfig) -> list[RunSpec]:
    """Every training run the config asks for: detectors × seeds, the ablations × seeds of the detector whose
    registry entry takes them, the factorial cells (the other objective of each detector whose entry declares
    ``factorial``), held-out-domain and held-out-model runs, and the kind detectors × ``kind_seeds`` on every
    mechanism kind but the primary."""
    controls = [d for d in cfg.get("controls") or [] if d not in cfg.detectors]
    reg = detector_entries([*cfg.detectors, *controls, *cfg.transfer.detectors])
    runs = [RunSpec(f"main/{d}/seed{s}", "main", d, int(s), [f"detector={d}"], cost=reg[d].cost)
            for d in cfg.detectors for s in cfg.seeds]
    # the shortcut controls (text only / prompt only): main runs like any detector, their own group in the tables
    runs += [RunSpec(f"main/{d}/seed{s}", "main", d, int(s), [f"detector={d}"], {"control": "true"},
                     cost=reg[d].cost) for d in controls for s in cfg.seeds]
    ab = ablated_detector(cfg, reg)
    runs += [RunSpec(f"ablation/{a}/seed{s}", "ablation", ab, int(s), [f"detector={ab}", f"ablation={a}"],
                     {"ablation": str(a)}, cost=reg[ab].cost) for a in cfg.ablations for s in cfg.ablation_seeds
             if ab is not None]
    # the factorial design (paper appendix F): the objective × architecture cells the main runs lack
    cells = [(d, *reg[d].factorial_cell()) for d in cfg.detectors if reg[d].factorial]
    runs += [RunSpec(f"factorial/{name}/seed{s}", "factorial", d, int(s), [f"detector={d}", *ov],
                     {"variant": name}, cost=reg[d].cost) for d, name, ov in cells for s in cfg.factorial_seeds]
    tr = cfg.transfer
    for d in tr.detectors:
        for s in tr.seeds:
            runs += [RunSpec(f"transfer/domain-{h}/{d}/seed{s}", "transfer_domain", d, int(s),
                             [f"detector={d}", f"data.holdout_domain={h}"], {"holdout_domain": str(h)},
                             cost=reg[d].cost) for h in tr.holdout_domains]
            runs += [RunSpec(f"transfer/model-{h}/{d}/seed{s}", "transfer_model", d, int(s),
                             [f"detector={d}", f"data.holdout_model={h}"], {"holdout_model": str(h)},
                             cost=reg[d].cost) for h in holdout_models(cfg)]
    # the other mechanism kinds: the same detectors on each kind's own corpus and trajectories
    extra = extra_kinds(cfg)
    kd = kind_detectors(cfg) if extra else []
    runs += [RunSpec(f"kinds/{k}/{d}/seed{s}", "kind", d, int(s), [f"detector={d}"],
                     {"mechanism_kind": k, **({"control": "true"} if d in controls else {})}, cost=reg[d].cost)
             for k in extra for d in kd for s in cfg.kind_seeds]
    return runs


class Stage:
    """Progress lines: ``[faithshift] <stage> ... (<seconds> s)``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> Stage:
        self.t0 = time.time()
        print(f"[faithshift] {self.name} ...", flush=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            print(f"[faithshift] {self.name} done ({time.time() - self.t0:.0f} s)", flush=True)


def _overrides_of(cfg: DictConfig) -> set[str]:
    return {str(o).lstrip("+~").split("=")[0].split(".")[0].split("/")[0] for o in cfg.corpus_overrides}


def corpus_config(cfg: DictConfig, out: Path, kind: str | None = None) -> DictConfig:
    """The corpus stage's ``sift-corpus`` config: the main job's ``source`` (unless ``corpus_overrides`` name
    one), ``conditions`` and ``domains``; its chunks run on the main job's ``executor`` and ``workers`` unless
    ``corpus_overrides`` set them. ``kind``: that mechanism kind's corpus (``source.mechanism_kind``, written under
    :func:`~sift.evaluation.kinds_section.kind_root`); None: the primary kind's."""
    own = _overrides_of(cfg)
    source = cfg.get("source")
    job = [f"{k}=[{','.join(map(str, cfg[k]))}]" for k in ("conditions", "domains")
           if cfg.get(k) is not None and k not in own]
    if source is not None and "source" not in own:
        job.append(f"source={source.type}")
    root = out if kind is None else kind_root(out, kind, primary_kind(cfg))
    c = compose("corpus", [f"output_dir={root / 'corpus'}", f"n_items={cfg.n_items}", f"seed={cfg.seed}", *job,
                           *cfg.corpus_overrides])
    with open_dict(c):
        if source is not None and "source" not in own:
            # the main job's source node, its interpolations (${n_items}, ${conditions} …) left to the corpus config
            c.source = OmegaConf.merge(c.source, OmegaConf.create(OmegaConf.to_container(source, resolve=False)))
        if kind is not None and c.source.get("type") == "organism":
            c.source.mechanism_kind = kind
        if "executor" not in own:
            c.executor = OmegaConf.create(OmegaConf.to_container(cfg.executor, resolve=True))
        if "workers" not in own:
            c.workers = int(cfg.workers)
    return c


def build_corpus(cfg: DictConfig, out: Path, kind: str | None = None) -> dict:
    return run_corpus(corpus_config(cfg, out, kind))


def source_models(cfg: DictConfig, out: Path, kind: str | None = None) -> dict[str, str]:
    """family label → the model the corpus source generated with (what extraction loads; a GGUF file's
    converted folder; an organism kind's weights folder)."""
    src = source_config(corpus_config(cfg, out, kind).source)
    return get_source(src.type).models(src)


def _extract_sets(cfg: DictConfig, key: str) -> bool:
    """Whether ``extract_overrides`` sets ``key`` itself (else extraction takes it from the corpus source)."""
    return key in {str(o).lstrip("+~").split("=")[0].split(".")[0] for o in cfg.extract_overrides}


def extract(cfg: DictConfig, out: Path, kind: str | None = None) -> dict | None:
    """The trajectory stage of the primary kind's corpus (``kind``: of that mechanism kind's corpus)."""
    from sift.trajectories.job import run_extract

    root = out if kind is None else kind_root(out, kind, primary_kind(cfg))
    c = compose("extract", [f"corpus_dir={root / 'corpus'}", f"output_dir={root / 'trajectories'}",
                            *cfg.extract_overrides])
    with open_dict(c):
        if not _extract_sets(cfg, "models"):
            c.models = OmegaConf.create(source_models(cfg, out, kind))
        if cfg.source.get("type") == "hf" and not _extract_sets(cfg, "dtype"):
            c.dtype = cfg.source.get("dtype")  # the states are read in the dtype the corpus was generated in
    return run_extract(c)


def max_epochs(cfg: DictConfig, detector: str) -> int:
    """The epoch cap of a detector's runs: ``max_epochs_by_detector[detector]`` if set, else ``max_epochs``."""
    by = cfg.get("max_epochs_by_detector") or {}
    return int(by.get(detector, cfg.max_epochs))


def max_steps(cfg: DictConfig, detector: str) -> int | None:
    """The optimizer-step cap of a detector's runs (``max_steps_by_detector``), or None: the cap that means the
    same training length whatever the split's size (a held-out-domain run has fewer steps per epoch)."""
    by = cfg.get("max_steps_by_detector") or {}
    return int(by[detector]) if detector in by else None


def train_config(cfg: DictConfig, out: Path, spec: RunSpec, kind: str | None = None) -> DictConfig:
    """A run's ``sift-train`` config, on the trajectories of its own mechanism kind (``kind``: of that kind, for
    the run's cross-kind predictions)."""
    run_dir = out / "runs" / spec.key
    steps = max_steps(cfg, spec.detector)
    data = kind_root(out, kind or run_kind(cfg, spec), primary_kind(cfg))
    return compose("train", [*spec.overrides, f"seed={spec.seed}", "data=trajectory",
                             f"data.trajectory_dir={data / 'trajectories'}", f"data.corpus_dir={data / 'corpus'}",
                             f"data.seed={cfg.seed}", f"trainer.max_epochs={max_epochs(cfg, spec.detector)}",
                             *([f"++trainer.max_steps={steps}"] if steps is not None else []),
                             *([f"data.env_batch_size={cfg.env_batch_size}"] if cfg.get("env_batch_size") else []),
                             f"paths.output_dir={run_dir}", f"data.cache_dir={data / 'cache'}",
                             "trainer.enable_progress_bar=false",
                             *([] if cfg.wandb else ["logger=csv"]), *cfg.train_overrides])


def train_run(cfg: DictConfig, out: Path, spec: RunSpec) -> tuple[dict, dict[str, Path]]:
    """Train one run and write its predictions (in the same process, so workers do both in parallel)."""
    import torch

    from sift.training import train

    torch.set_num_threads(int(cfg.torch_threads))  # fixed per run: results do not depend on `workers`
    record = train(train_config(cfg, out, spec))
    files = predict_run(cfg, out, spec, record)
    cross_predict(cfg, out, spec, record)
    return record, files


def train_stack(cfg: DictConfig, out: Path, stack: StackSpec) -> list[tuple[dict, dict[str, Path]]]:
    """Train a stacked group's seeds (one process) and write each run's predictions."""
    import torch

    from sift.training import train_stacked

    torch.set_num_threads(int(cfg.torch_threads))
    records = train_stacked([train_config(cfg, out, s) for s in stack.runs])
    res = []
    for spec, record in zip(stack.runs, records):
        files = predict_run(cfg, out, spec, record)
        cross_predict(cfg, out, spec, record)
        res.append((record, files))
    return res


def _train_job(cfg_yaml: str | None, out: str, spec: RunSpec | StackSpec, gpus: list[str] | None,
               cfg: DictConfig | None = None) -> Any:
    """One training job (a local worker process or a SLURM task; configs travel as YAML): a run, or a stacked
    group (a list of results). ``gpus``: the GPUs a local worker may take one of (a SLURM task gets its own
    through ``CUDA_VISIBLE_DEVICES``)."""
    from sift.execution import select_gpu

    select_gpu(gpus)
    c = cfg if cfg is not None else OmegaConf.create(cfg_yaml)
    if isinstance(spec, StackSpec):
        return train_stack(c, Path(out), spec)
    return train_run(c, Path(out), spec)


def train_all(cfg: DictConfig, out: Path, specs: list[RunSpec],
              jobs: list[RunSpec | StackSpec] | None = None) -> tuple[dict[str, dict], dict[str, dict[str, Path]]]:
    """Train every run and write its predictions on ``cfg.executor`` (``local``: ``cfg.workers`` processes at a
    time; ``slurm``: an array job), the costliest detectors' runs first (``registry.cost``); finished runs are
    skipped by run hash and up-to-date predictions reused; a failed run is retried ``executor.retries`` times.
    ``jobs``: the runs grouped into jobs (default :func:`training_jobs`; a stacked group is one job)."""
    from sift.execution import run_jobs

    order = sorted(training_jobs(cfg, specs) if jobs is None else jobs, key=lambda s: (-s.cost, s.key))
    records: dict[str, dict] = {}
    preds: dict[str, dict[str, Path]] = {}

    def done_run(spec: RunSpec, result: tuple[dict, dict[str, Path]]) -> None:
        records[spec.key], preds[spec.key] = result
        m = records[spec.key].get("metrics", {})
        print(f"[faithshift] run {len(records)}/{len(specs)} done: {spec.key} "
              f"val/auroc={m.get('val/auroc') or float('nan'):.3f} ({records[spec.key].get('time_s', 0):.0f} s)",
              flush=True)

    def done(job: RunSpec | StackSpec, result: Any) -> None:
        if isinstance(job, StackSpec):
            for spec, res in zip(job.runs, result):
                done_run(spec, res)
        else:
            done_run(job, result)

    run_jobs(cfg, out, order, _train_job, done)
    return records, preds


def training_meta(record: dict) -> dict[str, Any]:
    """What the report needs of a run's training record: converged or not (see
    :func:`sift.detectors.schedule.training_record`), stop epoch, best validation loss."""
    t = record.get("training") or {}
    return {k: t.get(k) for k in ("converged", "stopped_by", "stop_epoch", "best_val_loss")}


def predict_run(cfg: DictConfig, out: Path, spec: RunSpec, record: dict) -> dict[str, Path]:
    """Per-trace predictions of the run's best checkpoint on every split it has (reused when up to date)."""
    from sift.detectors.module import load_detector
    from sift.evaluation.collect import predict
    from sift.training import setup_data

    pdir = out / "runs" / spec.key / "predictions"
    stamp = pdir / "run_hash.txt"
    files = {s: pdir / f"{s}.npz" for s in SPLITS}
    if stamp.is_file() and stamp.read_text() == record["run_hash"]:
        return {s: p for s, p in files.items() if p.is_file()}
    ckpt = record.get("best_ckpt") or record.get("last_ckpt")
    if not ckpt:
        raise SiftError(f"{out / 'runs' / spec.key / 'results.json'}: the run saved no checkpoint")
    tc = train_config(cfg, out, spec)
    det = load_detector(ckpt, trusted=[str(tc.detector._target_)])
    dm = setup_data(tc)
    done = {}
    for s in SPLITS:
        if s == "transfer" and spec.group in ("main", "kind"):  # no held-out domain or model: nothing to transfer to
            continue
        p = predict(det, dm, s, spec.detector, spec.seed)
        if len(p):
            p.meta.update({"run": spec.key, "group": spec.group, **spec.tags, "run_hash": record["run_hash"],
                           "config_hash": record["config_hash"], "preset": str(cfg.get("preset_name", "")),
                           **training_meta(record)})
            done[s] = p.save(files[s])
    stamp.write_text(record["run_hash"])
    return done


_ITEMS: dict[tuple[str, int], dict[str, str]] = {}


def corpus_items(corpus_dir: Path) -> dict[str, str]:
    """Base item → domain of every trace of a corpus folder (read once per process and file version)."""
    from sift.corpus.store import iter_jsonl

    path = Path(corpus_dir) / "traces.jsonl"
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _ITEMS:
        _ITEMS[key] = {str(r["base_item"]): str(r["domain"]) for _, r in iter_jsonl(path)}
    return _ITEMS[key]


def check_same_test_items(dm: Any, train_corpus: Path, what: str) -> None:
    """The test split of ``dm`` (another kind's DataModule) is the one the run's own corpus gives: the same items
    split with the same seed, so a cross-kind prediction never scores an item the run trained on."""
    from sift.trajectories.splits import item_splits

    mine = {i for i, d in corpus_items(train_corpus).items() if d != dm.holdout_domain}
    want = item_splits(mine, dm.seed, dm.split_fractions, dm.calib_fraction)["test"]
    have = set(dm.split_items["test"])
    if have != want:
        raise SiftError(f"{what}: its test split ({len(have)} items) is not the run's own ({len(want)} items, "
                        f"{len(have ^ want)} differ); every kind's corpus needs the same n_items and seed")


def cross_predict(cfg: DictConfig, out: Path, spec: RunSpec, record: dict) -> dict[str, Path]:
    """Predictions of the run's best checkpoint on the test split of every other mechanism kind
    (:func:`cross_kinds`), ``runs/<key>/predictions/on_<kind>/test.npz``; reused when the run and that kind's
    trajectories are unchanged."""
    from sift.detectors.module import load_detector
    from sift.evaluation.collect import predict
    from sift.provenance import file_sha256
    from sift.training import setup_data

    done: dict[str, Path] = {}
    det = None
    for kind in cross_kinds(cfg, spec):
        path = cross_kind_file(out, spec.key, kind)
        tc = train_config(cfg, out, spec, kind)
        stamp = path.parent / "run_hash.txt"
        key = f"{record['run_hash']} {file_sha256(Path(tc.data.trajectory_dir) / 'trajectories.json', limit=None)}"
        if path.is_file() and stamp.is_file() and stamp.read_text() == key:
            done[kind] = path
            continue
        ckpt = record.get("best_ckpt") or record.get("last_ckpt")
        if not ckpt:
            raise SiftError(f"{out / 'runs' / spec.key / 'results.json'}: the run saved no checkpoint")
        det = det or load_detector(ckpt, trusted=[str(tc.detector._target_)])
        dm = setup_data(tc)
        own = kind_root(out, run_kind(cfg, spec), primary_kind(cfg)) / "corpus"
        check_same_test_items(dm, own, f"cross-kind predictions of run {spec.key} on {kind}")
        p = predict(det, dm, "test", spec.detector, spec.seed)
        p.meta.update({"run": spec.key, "group": spec.group, **spec.tags, "run_hash": record["run_hash"],
                       "config_hash": record["config_hash"], "preset": str(cfg.get("preset_name", "")),
                       "train_kind": run_kind(cfg, spec), "test_kind": kind})
        done[kind] = p.save(path)
        stamp.write_text(key)
    return done


def _positive_int(cfg: DictConfig, key: str, minimum: int = 1) -> int:
    v = OmegaConf.select(cfg, key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise SiftError(f"{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def validate_plan(cfg: DictConfig, out: Path) -> list[RunSpec]:
    """Check the whole run plan before any work: the job's numbers, every stage's config (composed with its
    overrides), every training run's config (detector names, holdout domains and models, epochs), and that
    ``out`` is writable. Returns the planned runs; raises SiftError naming the first problem."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from sift.lock import ensure_writable
    from sift.training import validate_train_config

    for key in ("n_items", "max_epochs", "workers", "torch_threads", "bootstrap.resamples",
                "bootstrap.appendix_resamples", "seed"):
        _positive_int(cfg, key, minimum=0 if key == "seed" else 1)
    stack_seeds(cfg)  # true | false | auto | a list of detectors
    for key in ("seeds", "ablation_seeds", "factorial_seeds", "transfer.seeds", "kind_seeds"):
        for s in OmegaConf.select(cfg, key) or []:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise SiftError(f"{key}: seeds must be non-negative integers, got {s!r}")
    if not cfg.detectors:
        raise SiftError("detectors: the main job needs at least one detector")
    extra = extra_kinds(cfg)
    if extra:
        kind_detectors(cfg)
        if not cfg.kind_seeds:
            raise SiftError("kind_seeds: the other mechanism kinds' runs need at least one seed")
        for s in cfg.kind_seeds:
            if s not in cfg.seeds:
                raise SiftError(f"kind_seeds: seed {s} is not one of seeds {list(cfg.seeds)} (the primary kind's "
                                f"cross-kind predictions come from its main runs)")
    known = {*cfg.detectors, *(cfg.get("controls") or [])}
    for det in cfg.get("undertrained_detectors") or []:
        if det not in known:
            raise SiftError(f"undertrained_detectors: {det!r} is not one of the job's detectors or controls "
                            f"({sorted(known)})")
    if cfg.get("env_batch_size") is not None:
        _positive_int(cfg, "env_batch_size")
    for key in ("max_epochs_by_detector", "max_steps_by_detector"):
        for det, cap in (cfg.get(key) or {}).items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise SiftError(f"{key}.{det}: a cap must be an integer >= 1, got {cap!r}")
    from sift.execution import validate_executor

    validate_executor(cfg)

    def comp(name: str, overrides: list[str], what: str) -> DictConfig:
        try:
            return compose(name, overrides)
        except (HydraException, OmegaConfBaseException) as e:
            raise SiftError(f"{what}: {str(e).splitlines()[0]}") from None

    try:
        corpus = corpus_config(cfg, out)
    except (HydraException, OmegaConfBaseException) as e:
        raise SiftError(f"corpus_overrides: {str(e).splitlines()[0]}") from None
    from sift.corpus.store import engine_config

    validate_executor(engine_config(corpus.executor, corpus.workers))
    comp("extract", [f"corpus_dir={out / 'corpus'}", f"output_dir={out / 'trajectories'}",
                     *cfg.extract_overrides], "extract_overrides")
    try:
        src = source_config(corpus.source)
    except OmegaConfBaseException as e:
        raise SiftError(f"source: {str(e).splitlines()[0]}") from None
    get_source(src.type)  # an unknown source type fails here
    src.validate()
    own_kind = getattr(src, "mechanism_kind", None)
    if extra and own_kind != primary_kind(cfg):
        raise SiftError(f"corpus_overrides: the corpus's mechanism kind {own_kind!r} is not the primary kind "
                        f"{primary_kind(cfg)!r}; set source.mechanism_kind instead")
    for kind in extra:  # each kind's corpus: its weights must be there (cot_routing has its own)
        try:
            source_config(corpus_config(cfg, out, kind).source).validate()
        except SiftError as e:
            raise SiftError(f"mechanisms ({kind}): {e}") from None
    domains = set(corpus.get("domains") or []) if src.type == "organism" else set()  # real items: known when loaded
    families = set(get_source(src.type).families(src))
    specs = plan_runs(cfg)
    for spec in specs:
        try:
            tc = train_config(cfg, out, spec)
        except (HydraException, OmegaConfBaseException) as e:
            bad = [o for o in spec.overrides if o.startswith("detector=") or o.startswith("ablation=")]
            raise SiftError(f"run {spec.key} ({', '.join(bad) or 'train_overrides'}): "
                            f"{str(e).splitlines()[0]}") from None
        validate_train_config(tc, what=f"run {spec.key}")
        hd, hm = tc.data.get("holdout_domain"), tc.data.get("holdout_model")
        if hd is not None and domains and hd not in domains:
            raise SiftError(f"run {spec.key}: data.holdout_domain={hd!r} is not a corpus domain "
                            f"({', '.join(sorted(domains))})")
        if hm is not None and families is not None and hm not in families:
            raise SiftError(f"run {spec.key}: data.holdout_model={hm!r} is not a source model "
                            f"({', '.join(sorted(families))})")
    if cfg.wandb:
        from sift.training import check_wandb

        check_wandb(None, "wandb")
    for d in cfg.instance_ensemble:
        if d not in cfg.detectors:
            raise SiftError(f"instance_ensemble: member {d!r} is not among detectors {list(cfg.detectors)} "
                            f"(list trained detectors, or instance_ensemble=[] for no instance-level ensemble)")
    ensure_writable(out, "paths.output_dir")
    return specs


def run_faithshift(cfg: DictConfig, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run (or resume) every stage; returns {"report": path, "results": path, "runs": n}.

    The plan is validated first; ``paths.output_dir`` is locked for the whole job (a second job on it refuses)."""
    from sift.lock import OutputLock

    out = Path(cfg.paths.output_dir)
    specs = validate_plan(cfg, out)
    with OutputLock(out, "sift-faithshift"):
        return _run_stages(cfg, out, specs)


def _run_stages(cfg: DictConfig, out: Path, specs: list[RunSpec]) -> dict[str, Any]:
    write_text(out / "faithshift_config.yaml", OmegaConf.to_yaml(cfg))
    extra = extra_kinds(cfg)
    with Stage("corpus"):
        build_corpus(cfg, out)
    for kind in extra:
        with Stage(f"corpus ({kind})"):
            build_corpus(cfg, out, kind)
    with Stage("trajectories"):
        extract(cfg, out)
    for kind in extra:
        with Stage(f"trajectories ({kind})"):
            extract(cfg, out, kind)
    where = (f"{cfg.workers} at a time" if cfg.executor.kind == "local"
             else f"on {cfg.executor.kind}, {cfg.executor.array_parallelism} at a time")
    jobs = training_jobs(cfg, specs)
    groups = [job for job in jobs if isinstance(job, StackSpec)]
    stacked = {r.key: job.seeds for job in groups for r in job.runs}
    with Stage(f"training {len(specs)} runs + predictions ({where}; {len(stacked)} runs in {len(groups)} stacked "
               f"groups)"):
        _, preds = train_all(cfg, out, specs, jobs)
    write_json(out / "runs" / "index.json",
               [{"key": s.key, "group": s.group, "detector": s.detector, "seed": s.seed, **s.tags,
                 "stacked_with": stacked.get(s.key),
                 "predictions": {k: str(v) for k, v in preds[s.key].items()},
                 **({"cross_kind": {k: str(cross_kind_file(out, s.key, k)) for k in cross_kinds(cfg, s)}}
                    if cross_kinds(cfg, s) else {})} for s in specs])
    with Stage("evaluation and report"):
        from sift.evaluation.faithshift_report import write_faithshift_report

        paths = write_faithshift_report(cfg, out, specs, preds)
    if cfg.get("export"):
        with Stage(f"export ({', '.join(cfg.export)})"):
            from sift.export import export

            export(out, out / "export", list(cfg.export))
        paths["export"] = str(out / "export")
    return {**paths, "runs": len(specs)}
