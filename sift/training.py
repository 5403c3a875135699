"""``train(cfg)``: the plain training task behind ``sift-train`` (lightning-hydra-template style).

One run = one detector and one seed (or, with ``ensemble.n_members > 1``, N member runs plus their probability
average). Every run writes ``<output_dir>/results.json`` (config hash, seed, version, git state, metrics) and
checkpoints under ``paths.ckpt_dir`` with ``last.ckpt``; rerunning the same config resumes from ``last.ckpt``
(``resume``) or, if the run finished with the same config, returns its results (``skip_if_done``).
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sift import __version__
from sift.atomic import write_json
from sift.detectors.schedule import ValidationHistory, training_record
from sift.errors import SiftError
from sift.provenance import config_hash

#: top-level keys that do not change what is trained (excluded from ``config_hash``); ``sgr`` enters the hash
#: through the callbacks that read it (``callbacks=meta_eval``).
NON_HPARAM_KEYS = ("seed", "paths", "sgr", "logger", "resume", "skip_if_done", "ckpt_path", "allow_remote_ckpt",
                   "tags", "provenance", "test", "task_name", "hydra")
RESULTS_FILE = "results.json"


# ------------------------------------------------------------------------------------------- provenance
#: keys anywhere in the config that only say where things are written.
PATH_KEYS = ("dirpath", "save_dir", "default_root_dir", "output_dir", "ckpt_dir", "cache_dir")


def _strip(c: Any) -> Any:
    if isinstance(c, dict):
        return {k: _strip(v) for k, v in c.items() if k not in PATH_KEYS}
    if isinstance(c, list):
        return [_strip(v) for v in c]
    return c


def _hashable(cfg: DictConfig | dict, keep_seed: bool) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else copy.deepcopy(cfg)
    for k in NON_HPARAM_KEYS:
        if not (keep_seed and k == "seed"):
            c.pop(k, None)
    return _strip(c)


def hparams_hash(cfg: DictConfig | dict) -> str:
    """Hash of everything that defines the experiment except the seed and where outputs go (groups seeds)."""
    return config_hash(_hashable(cfg, keep_seed=False))


def run_hash(cfg: DictConfig | dict) -> str:
    """Hash of the config including the seed (identifies one run; resume/skip compare it)."""
    return config_hash(_hashable(cfg, keep_seed=True))


def _git_dir(start: Path) -> Path | None:
    for p in [start, *start.parents]:
        g = p / ".git"
        if g.is_dir():
            return g
        if g.is_file():  # worktree / submodule: "gitdir: <path>"
            txt = g.read_text().strip()
            if txt.startswith("gitdir:"):
                d = Path(txt.split(":", 1)[1].strip())
                return d if d.is_absolute() else (p / d).resolve()
    return None


def git_state(start: str | Path | None = None) -> dict[str, Any]:
    """Commit hash (read from ``.git`` files, no git call) and dirty flag of the code's repository.

    The dirty flag runs ``git --no-optional-locks status --porcelain --untracked-files=no`` (read-only, takes
    no index lock); it is ``None`` when git is missing or ``SIFT_NO_GIT=1``."""
    start = Path(start) if start is not None else Path(__file__).resolve().parent
    gd = _git_dir(start.resolve())
    if gd is None:
        return {"commit": None, "dirty": None, "branch": None}
    commit, branch = None, None
    try:
        head = (gd / "HEAD").read_text().strip()
        if head.startswith("ref:"):
            ref = head.split(":", 1)[1].strip()
            branch = ref.rsplit("/", 1)[-1] if ref.startswith("refs/heads/") else ref
            common = gd
            if (gd / "commondir").is_file():
                common = (gd / (gd / "commondir").read_text().strip()).resolve()
            for base in (gd, common):
                if (base / ref).is_file():
                    commit = (base / ref).read_text().strip()
                    break
            else:
                for base in (gd, common):
                    packed = base / "packed-refs"
                    if packed.is_file():
                        for line in packed.read_text().splitlines():
                            if line.endswith(" " + ref):
                                commit = line.split()[0]
                                break
        else:
            commit = head
    except OSError:
        pass
    dirty = None
    if os.environ.get("SIFT_NO_GIT") != "1":
        try:
            r = subprocess.run(["git", "--no-optional-locks", "-C", str(gd.parent), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=10,
                               env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
            if r.returncode == 0:
                dirty = bool(r.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return {"commit": commit, "dirty": dirty, "branch": branch}


# ------------------------------------------------------------------------------------------- W&B
def wandb_mode(offline: bool | None) -> str:
    """W&B mode: explicit ``offline`` wins; otherwise WANDB_MODE, else online iff WANDB_API_KEY is set."""
    env = os.environ.get("WANDB_MODE", "").lower()
    if offline is True:
        return "disabled" if env == "disabled" else "offline"
    if offline is False:
        return "online"
    if env in ("offline", "dryrun"):
        return "offline"
    if env in ("online", "disabled"):
        return env
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _wandb_key_available() -> bool:
    """An API key in WANDB_API_KEY or in ~/.netrc (what ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc(os.environ.get("NETRC") or None).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def quiet_wandb_offline(mode: str) -> None:
    """In offline mode W&B makes no network call: error reporting (Sentry) off, which would resolve its host."""
    if mode in ("offline", "disabled"):
        os.environ["WANDB_ERROR_REPORTING"] = "false"


def check_wandb(offline: bool | None, what: str = "logger.wandb") -> str:
    """The W&B mode, or one SiftError line when it would go online without an API key."""
    mode = wandb_mode(offline)
    if mode == "online" and not _wandb_key_available():
        raise SiftError(f"{what}: W&B is set online but no API key is configured (set WANDB_API_KEY or run "
                        f"`wandb login`), or log offline ({what}.offline=true) or not at all (logger=none)")
    return mode


def build_loggers(cfg: DictConfig) -> list[Any]:
    """Instantiate ``cfg.logger`` entries; a WandbLogger's ``offline: null`` is resolved by :func:`wandb_mode`."""
    out: list[Any] = []
    node = cfg.get("logger")
    if not node:
        return out
    for name, lc in node.items():
        if not isinstance(lc, DictConfig) or "_target_" not in lc:
            continue
        if lc._target_.endswith("WandbLogger"):
            lc = copy.deepcopy(lc)
            with _open(lc):
                mode = check_wandb(lc.pop("offline", None), f"logger.{name}")
                quiet_wandb_offline(mode)
                lc.offline = False  # Lightning's offline flag rewrites os.environ; pass mode= instead
                lc.mode = mode
                Path(lc.save_dir).mkdir(parents=True, exist_ok=True)
        out.append(instantiate(lc))
    return out


class _open:
    """Context manager that temporarily lifts struct mode on an OmegaConf node."""

    def __init__(self, node: DictConfig) -> None:
        self.node = node

    def __enter__(self) -> DictConfig:
        OmegaConf.set_struct(self.node, False)
        return self.node

    def __exit__(self, *exc: Any) -> None:
        OmegaConf.set_struct(self.node, True)


def _finish_wandb() -> None:
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except Exception:  # pragma: no cover
        pass


# ------------------------------------------------------------------------------------------- runs
def instantiate_node(node: DictConfig, drop: tuple[str, ...] = ("name",), exclude: tuple[str, ...] = (),
                     **kwargs: Any) -> Any:
    """Instantiate a ``_target_`` node without bookkeeping keys (``drop``: ``name``) that the target may not
    accept, and without the keys ``exclude`` names (settings of the run, never the target's arguments).
    Nested ``_target_`` nodes are passed as plain dicts (a detector builds its ``net`` and ``optimizer`` itself
    and saves their configs in its checkpoint)."""
    c = OmegaConf.to_container(node, resolve=True)
    target = c.get("_target_", "")
    for k in exclude:
        c.pop(k, None)
    for k in drop:
        if k in c and not _accepts(target, k):
            c.pop(k)
    return instantiate(c, _convert_="all", _recursive_=False, **kwargs)


def _accepts(target: str, arg: str) -> bool:
    import importlib
    import inspect

    mod, _, name = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(mod), name)
        sig = inspect.signature(obj)
    except (ImportError, AttributeError, ValueError, TypeError):
        return False
    return arg in sig.parameters or any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())


def load_results(out_dir: str | Path) -> dict[str, Any] | None:
    p = Path(out_dir) / RESULTS_FILE
    if not p.is_file():
        return None
    import json

    return json.loads(p.read_text())


def _hydra_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
    except Exception:  # pragma: no cover
        pass
    return []


def _data_name(cfg: DictConfig) -> str:
    return str(cfg.data.get("name") or cfg.data.get("_target_", "data").rsplit(".", 1)[-1])


def validate_train_config(cfg: DictConfig, what: str = "sift-train") -> None:
    """Checks that must pass before a run starts: epochs, the checkpoint to resume from, W&B credentials."""
    me = cfg.trainer.get("max_epochs")
    if isinstance(me, bool) or not isinstance(me, int) or me < 1:
        raise SiftError(f"{what}: trainer.max_epochs must be an integer >= 1, got {me!r} "
                        f"(-1, Lightning's 'no limit', is not accepted)")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise SiftError(f"{what}: seed must be a non-negative integer, got {cfg.seed!r}")
    ckpt = cfg.get("ckpt_path")
    if ckpt is not None:
        from sift.checkpoints import check_local

        check_local(ckpt, f"{what}: ckpt_path", allow_remote=bool(cfg.get("allow_remote_ckpt", False)))
    for name, lc in (cfg.get("logger") or {}).items():
        if isinstance(lc, DictConfig) and str(lc.get("_target_", "")).endswith("WandbLogger"):
            check_wandb(lc.get("offline"), f"{what}: logger.{name}")


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train what ``cfg`` describes; returns the results record (also written to ``results.json``).

    The config is validated and ``paths.output_dir`` locked (a second process on it refuses) first."""
    from sift.lock import OutputLock

    validate_train_config(cfg)
    out_dir = Path(cfg.paths.output_dir)
    with OutputLock(out_dir, "sift-train"):
        return _train_locked(cfg, out_dir)


def _finished_record(cfg: DictConfig, out_dir: Path) -> dict[str, Any] | None:
    """With ``skip_if_done``: the record of a run that finished with this config (None: train it)."""
    prev = load_results(out_dir)
    if cfg.get("skip_if_done", False) and prev and prev.get("status") == "done" and prev.get(
            "run_hash") == run_hash(cfg):
        print(f"sift-train: {out_dir} is done (same config); skipping")
        return prev
    return None


def _train_locked(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    prev = _finished_record(cfg, out_dir)
    if prev is not None:
        return prev
    n = int(cfg.get("ensemble", {}).get("n_members", 1) or 1)
    try:
        if n > 1:
            return _train_ensemble(cfg, out_dir, n)
        return _train_single(cfg, out_dir, kind="single")[0]
    finally:
        _finish_wandb()


#: detector-config keys that configure the run (and the registry entry), never the detector's constructor
DETECTOR_RUN_KEYS = ("seed_resample", "early_stopping", "registry")


def _resample_train(dm: Any, seed: int) -> None:
    """``detector.seed_resample``: a per-seed cluster bootstrap of the training split (by base item), so that
    deterministic fits (the logistic-regression baselines) vary with the seed like the seed's data would."""
    if not hasattr(dm, "resample_train"):
        raise SiftError(f"detector.seed_resample=true needs a DataModule with resample_train(seed); "
                        f"{type(dm).__name__} has none")
    dm.resample_train(seed)


def setup_data(cfg: DictConfig) -> Any:
    """The run's DataModule (``cfg.data``), prepared and set up for fitting."""
    dm = instantiate_node(cfg.data)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _extra_eval(model: Any, dm: Any) -> dict[str, float]:
    """Metrics on the DataModule's ``transfer`` loader when it has one with traces (held-out domain, model or
    shifted environment), at the threshold frozen in distribution."""
    import warnings

    from sift.detectors.module import binary_metrics
    from sift.metrics import auroc

    res: dict[str, float] = {}
    if not hasattr(dm, "transfer_dataloader"):
        return res
    out = model.predict_loader(dm.transfer_dataloader())
    if not out or out["prob"].numel() == 0:
        return res
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res["transfer/auroc"] = auroc(out["prob"].numpy(), out["label"].numpy())
    m = binary_metrics(out["prob"], out["label"], float(model.threshold))
    res.update({f"transfer/{k}": float(v) for k, v in m.items()})
    return res


def _record(cfg: DictConfig, kind: str, metrics: dict[str, float], t0: float, **extra: Any) -> dict[str, Any]:
    return {
        "status": "done", "kind": kind, "detector": str(cfg.detector.get("name", "detector")),
        "data": _data_name(cfg), "seed": int(cfg.seed), "config_hash": hparams_hash(cfg), "run_hash": run_hash(cfg),
        "sift_version": __version__, "torch_version": torch.__version__,
        "git": git_state() if cfg.get("provenance", {}).get("git", True) else None,
        "overrides": _hydra_overrides(), "metrics": {k: _num(v) for k, v in metrics.items()},
        "time_s": round(time.time() - t0, 2), **extra,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f  # NaN → null in JSON


def _log_run_info(loggers: list[Any], cfg: DictConfig, info: dict[str, Any]) -> None:
    for lg in loggers:
        try:
            lg.log_hyperparams({"cfg": OmegaConf.to_container(cfg, resolve=True), **info})
        except Exception as e:  # pragma: no cover - logging must not kill a run
            print(f"sift-train: warning: could not log hyperparameters to {type(lg).__name__}: {e}")


def _wandb_info(loggers: list[Any]) -> dict[str, Any] | None:
    for lg in loggers:
        if type(lg).__name__ == "WandbLogger":
            try:
                run = lg.experiment
                return {"id": run.id, "mode": lg._wandb_init.get("mode"), "dir": str(getattr(run, "dir", ""))}
            except Exception:  # pragma: no cover
                return None
    return None


def resume_finished_epochs_as_finished(trainer: pl.Trainer) -> None:
    """Resume a step-capped run from an epoch's ``last.ckpt`` as Lightning resumes an uncapped one.

    With ``trainer.max_steps`` set, Lightning 2.x (``_FitLoop.restarting``, ``_FitLoop.on_run_start``) treats
    every resume as "iteration-based": it marks the fit loop as restarting even when the checkpoint's epoch had
    finished and skips counting that epoch as completed, so the resumed run replays the finished epoch's end and
    trains one epoch fewer than the uninterrupted run (the crash matrix's "mid SIFT run" point: global step 59
    against 60). sift writes checkpoints only at validation / epoch ends, so the epoch-based bookkeeping is
    the right one; ``max_steps`` still stops training (``_TrainingEpochLoop._is_training_done``,
    ``_FitLoop.done`` read it directly). Pinned by ``tests/detectors/test_step_cap_resume.py``."""
    trainer.fit_loop._iteration_based_training = lambda: False  # type: ignore[method-assign]


@dataclass
class _Run:
    """One run between its setup and its record: what :func:`_train_single` and :func:`train_stacked` share."""

    cfg: DictConfig
    out_dir: Path
    kind: str
    t0: float
    dm: Any
    spec: Any
    model: Any
    trainer: pl.Trainer
    history: ValidationHistory
    loggers: list[Any]
    ckpt_path: str | None
    own_wandb_run: bool = False


def _prepare_run(cfg: DictConfig, out_dir: Path, kind: str, own_wandb_run: bool = False) -> _Run:
    """Seed, data, detector, callbacks, loggers, trainer and the checkpoint to resume from (nothing trained).
    ``own_wandb_run``: a W&B logger starts a run of its own now (a stacked group logs one W&B run per seed from one
    process; Lightning's logger would otherwise join the run already in progress)."""
    from sift.checkpoints import is_remote, load_checkpoint
    from sift.detectors.module import DataSpec, n_parameters

    t0 = time.time()
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    dm = setup_data(cfg)
    if cfg.detector.get("seed_resample", False):
        _resample_train(dm, int(cfg.seed))
    spec = DataSpec.from_datamodule(dm)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)  # init does not depend on data setup
    model = instantiate_node(cfg.detector, exclude=DETECTOR_RUN_KEYS, data=spec.as_dict())
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()
                 if isinstance(c, DictConfig) and "_target_" in c]
    history = ValidationHistory()
    callbacks.append(history)
    loggers = build_loggers(cfg)
    if own_wandb_run:
        for lg in loggers:
            if type(lg).__name__ == "WandbLogger":
                import wandb

                lg._experiment = wandb.init(**{**lg._wandb_init, "reinit": "create_new"})
    trainer: pl.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False,
                                      default_root_dir=str(out_dir))
    resume_finished_epochs_as_finished(trainer)
    git = git_state() if cfg.get("provenance", {}).get("git", True) else None
    _log_run_info(loggers, cfg, {"seed": int(cfg.seed), "git": git, "config_hash": hparams_hash(cfg),
                                 "n_parameters": n_parameters(model), "kind": kind})
    ckpt_dir = Path(cfg.paths.ckpt_dir)
    ckpt_path = cfg.get("ckpt_path")
    if ckpt_path is None and cfg.get("resume", True) and (ckpt_dir / "last.ckpt").is_file():
        ckpt_path = str(ckpt_dir / "last.ckpt")
        print(f"sift-train: resuming from {ckpt_path}")
    if ckpt_path is not None and not is_remote(ckpt_path):
        load_checkpoint(ckpt_path, what="checkpoint to resume from")  # data only: refuse before Lightning reads it
    return _Run(cfg, out_dir, kind, t0, dm, spec, model, trainer, history, loggers, ckpt_path, own_wandb_run)


def _fit(run: _Run) -> None:
    run.trainer.fit(run.model, datamodule=run.dm, ckpt_path=run.ckpt_path, weights_only=True)


def _finish_run(run: _Run, **extra: Any) -> dict[str, Any]:
    """Validate the best checkpoint, test, evaluate on the transfer loader and write ``results.json``."""
    from sift.detectors.module import n_parameters

    cfg, trainer, model, dm, out_dir = run.cfg, run.trainer, run.model, run.dm, run.out_dir
    ckpt_dir = Path(cfg.paths.ckpt_dir)
    # before validate(ckpt_path=best): loading a checkpoint restores the callbacks' state (early stopping,
    # validation history) to that of the best epoch, which would erase how and when the run stopped
    training = training_record(trainer, model, run.history)
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if not best and trainer.checkpoint_callback is not None and (ckpt_dir / "last.ckpt").is_file():
        best = str(ckpt_dir / "last.ckpt")
    metrics: dict[str, float] = {}
    vres = trainer.validate(model, datamodule=dm, ckpt_path=best or None, verbose=False, weights_only=True)
    metrics.update(vres[0] if vres else {})
    if cfg.get("test", True):
        tres = trainer.test(model, datamodule=dm, verbose=False)
        metrics.update(tres[0] if tres else {})
    metrics.update(_extra_eval(model, dm))
    for lg in run.loggers:
        lg.log_metrics({k: v for k, v in metrics.items() if k.startswith("transfer/")}, step=trainer.global_step)
    spec = run.spec
    rec = _record(cfg, run.kind, metrics, run.t0, threshold=float(model.threshold), best_ckpt=best or None,
                  last_ckpt=str(ckpt_dir / "last.ckpt") if (ckpt_dir / "last.ckpt").is_file() else None,
                  epochs=int(trainer.current_epoch), global_step=int(trainer.global_step),
                  training=training,
                  n_parameters=n_parameters(model), data_spec={"n_channels": len(spec.channel_names),
                                                               "n_features": len(spec.feature_names),
                                                               "pooled_dim": spec.pooled_dim,
                                                               "n_envs": spec.n_envs,
                                                               **_common_shape(dm)},
                  wandb=_wandb_info(run.loggers), **extra)
    write_json(out_dir / RESULTS_FILE, rec)
    for lg in run.loggers:
        lg.finalize("success")
        if run.own_wandb_run and type(lg).__name__ == "WandbLogger":
            lg.experiment.finish()  # the seed's own run (own_wandb_run)
    _finish_wandb()
    return rec


def _train_single(cfg: DictConfig, out_dir: Path, kind: str) -> tuple[dict[str, Any], Any, Any]:
    run = _prepare_run(cfg, out_dir, kind)
    _fit(run)
    return _finish_run(run, stacked=None), run.model, run.dm


# ------------------------------------------------------------------------------------------- stacked seeds
def stack_refusal(cfgs: Sequence[DictConfig]) -> str | None:
    """Why these runs cannot train as one stacked group (None: they can): they must differ in the seed only
    (and where they write) and be single runs."""
    if len(cfgs) < 2:
        return "a single seed"
    if len({hparams_hash(c) for c in cfgs}) != 1:
        return "the runs differ in more than the seed"
    if len({int(c.seed) for c in cfgs}) != len(cfgs):
        return "two runs share a seed"
    c0 = cfgs[0]
    if int(c0.get("ensemble", {}).get("n_members", 1) or 1) > 1:
        return "ensemble runs"
    return None


def train_stacked(cfgs: Sequence[DictConfig]) -> list[dict[str, Any]]:
    """Train the seeds ``cfgs`` (one detector config, several seeds; :func:`stack_refusal` must be None) stacked:
    one process, one batched training step for every seed still training (:mod:`sift.detectors.seed_stack`),
    each seed's own data order, dropout stream, early stopping, checkpoints and ``results.json``, written as its
    separate run writes them. Finished runs are skipped (``skip_if_done``); each run folder is locked. A detector
    whose net cannot stack trains its seeds one after the other. Returns the records in the order of ``cfgs``;
    each carries ``stacked``: the seeds it trained with (or ``None``)."""
    import contextlib
    import threading

    from sift.detectors.seed_stack import SeedStack, longest_input, stackable
    from sift.lock import OutputLock

    why = stack_refusal(cfgs)
    if why is not None:
        raise SiftError(f"train_stacked: these runs cannot stack ({why})")
    for c in cfgs:
        validate_train_config(c)
    records: dict[int, dict[str, Any]] = {}
    with contextlib.ExitStack() as locks:
        for c in cfgs:
            locks.enter_context(OutputLock(Path(c.paths.output_dir), "sift-train"))
        todo = []
        for i, c in enumerate(cfgs):
            prev = _finished_record(c, Path(c.paths.output_dir))
            if prev is not None:
                records[i] = prev
            else:
                todo.append(i)
        runs = {i: _prepare_run(cfgs[i], Path(cfgs[i].paths.output_dir), "single", own_wandb_run=True)
                for i in todo}
        seeds = [int(cfgs[i].seed) for i in todo]
        group = [int(c.seed) for c in cfgs]
        # a group resumed with one seed left still trains it stacked (beside a throwaway copy): the same numbers,
        # and its dropout stream, as in the uninterrupted group
        can = bool(todo) and all(stackable(r.model) for r in runs.values())
        if not can:
            for i in todo:
                _fit(runs[i])
        else:
            # the group's padded length: the longest input of the seeds still to train. Seeds of one main-job run
            # config share the training split (they differ in init, order and dropout), so this is also the length
            # of a resumed group whose finished seeds are not set up again
            steps = [longest_input(runs[i].model, runs[i].dm.train_dataloader()) for i in todo]
            stack = SeedStack([runs[i].model for i in todo], seeds,
                              steps=None if None in steps else max(s for s in steps if s is not None))
            stack.attach()
            errors: dict[int, BaseException] = {}

            def fit_one(i: int) -> None:
                try:
                    _fit(runs[i])
                except BaseException as e:  # noqa: BLE001 - reported after the group
                    errors[i] = e
                finally:
                    stack.leave(runs[i].model)

            threads = [threading.Thread(target=fit_one, args=(i,), name=f"sift-seed{cfgs[i].seed}", daemon=True)
                       for i in todo]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                stack.detach()
            if errors:  # the seeds that finished keep their records; a rerun resumes the failed ones
                for i in todo:
                    if i not in errors:
                        records[i] = _finish_run(runs[i], stacked=group)
                i, e = min(errors.items())
                raise SiftError(f"stacked seeds {seeds}: seed {cfgs[i].seed} failed ({type(e).__name__}: {e}); "
                                f"rerun to resume it from its last.ckpt") from e
            print(f"sift-train: seeds {seeds} trained stacked ({stack.n_steps} batched steps)")
        for i in todo:
            records[i] = _finish_run(runs[i], stacked=group if can else None)
    return [records[i] for i in range(len(cfgs))]


def _common_shape(dm: Any) -> dict[str, Any]:
    """``{"common_shape": …}`` when the DataModule mapped source models of different shapes onto one, else {}."""
    shape = getattr(dm, "common_shape", None)
    return {"common_shape": shape} if isinstance(shape, dict) and shape.get("mapped") else {}


def _train_ensemble(cfg: DictConfig, out_dir: Path, n: int) -> dict[str, Any]:
    from sift.detectors.ensemble import EnsembleDetector, member_seeds

    t0 = time.time()
    seeds = member_seeds(int(cfg.seed), n)
    paths: list[str] = []
    for i, s in enumerate(seeds):
        mcfg = copy.deepcopy(cfg)
        with _open(mcfg):
            mcfg.seed = s
            mcfg.ensemble.n_members = 1
            mcfg.paths.output_dir = str(out_dir / f"member_{i}")
            mcfg.paths.ckpt_dir = str(out_dir / f"member_{i}" / "checkpoints")
            if mcfg.get("logger"):
                for lc in mcfg.logger.values():
                    if isinstance(lc, DictConfig) and "save_dir" in lc:
                        lc.save_dir = mcfg.paths.output_dir
                    if isinstance(lc, DictConfig) and "name" in lc:
                        lc.name = f"{cfg.detector.name}-ens{cfg.seed}-m{i}-seed{s}"
        mdir = Path(mcfg.paths.output_dir)
        prev = load_results(mdir)
        if prev and prev.get("status") == "done" and prev.get("run_hash") == run_hash(mcfg):
            rec = prev
        else:
            rec = _train_single(mcfg, mdir, kind="member")[0]
        if not rec.get("best_ckpt"):
            raise SiftError(f"ensemble member {i} has no checkpoint (enable the model_checkpoint callback)")
        paths.append(rec["best_ckpt"])
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    dm = setup_data(cfg)
    ens = EnsembleDetector.from_checkpoints(paths, name=f"{cfg.detector.name}_ensemble",
                                            threshold_method=str(cfg.detector.get("threshold_method", "youden")))
    ens.freeze_threshold(dm.val_dataloader())
    loggers = build_loggers(cfg)
    _log_run_info(loggers, cfg, {"seed": int(cfg.seed), "member_seeds": seeds, "kind": "ensemble"})
    trainer: pl.Trainer = instantiate(cfg.trainer, logger=loggers or False, default_root_dir=str(out_dir),
                                      enable_checkpointing=False)
    metrics: dict[str, float] = {}
    vres = trainer.validate(ens, datamodule=dm, verbose=False)
    metrics.update(vres[0] if vres else {})
    if cfg.get("test", True):
        tres = trainer.test(ens, datamodule=dm, verbose=False)
        metrics.update(tres[0] if tres else {})
    metrics.update(_extra_eval(ens, dm))
    ens.save(out_dir / "ensemble.pt", paths)
    rec = _record(cfg, "ensemble", metrics, t0, threshold=float(ens.threshold), member_seeds=seeds,
                  members=paths, ensemble_file=str(out_dir / "ensemble.pt"), wandb=_wandb_info(loggers))
    write_json(out_dir / RESULTS_FILE, rec)
    for lg in loggers:
        lg.finalize("success")
    return rec
