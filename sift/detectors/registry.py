"""The detector registry: a detector is its config file ``configs/detector/<name>.yaml`` (``_target_``: its
LightningModule class) and what that file declares under ``registry`` about how the main job treats it.

    registry:
      reference: true    # the report's reference detector (the matched comparisons test the others against it)
      cost: 10           # relative training cost: the main job starts the costliest runs first
      ablations: true    # the ablation presets (configs/ablation/) apply: the main job's ablation runs train it
      factorial: true    # the objective × architecture design trains it with the other objective too
      control: true      # a shortcut control (reads no hidden state of the CoT): its own group in every table
      capacity_control: true  # the same-capacity text control the reference is compared with (Table 1)

Every key is optional (defaults: not the reference, cost 1, no ablations, no factorial cell, not a control).
The objective a detector trains with is read from its ``objective`` node: ``irm_dann`` (IRM and DANN on),
``erm`` (both off), ``irm`` / ``dann`` (one of them), or None for a detector without one (a fitted-once model). A user's
``--config-dir`` folder may add detectors: a ``detector/<name>.yaml`` there is registered like a shipped one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sift.errors import SiftError

#: the keys of a detector config's ``registry`` node
REGISTRY_KEYS = ("reference", "cost", "ablations", "factorial", "control", "capacity_control")
#: the run the main job derives from ``instance_ensemble``'s members (per seed, their probability average)
INSTANCE_ENSEMBLE = "instance_ensemble"
#: the factorial analysis's names of the two objectives, low level first
OBJECTIVE_LEVELS = {"erm": "ERM", "irm_dann": "IRM+DANN"}


@dataclass(frozen=True)
class DetectorEntry:
    """One registered detector."""

    name: str
    target: str  # its LightningModule class
    reference: bool = False
    cost: float = 1.0
    ablations: bool = False
    factorial: bool = False
    objective: str | None = None  # irm_dann | irm | dann | erm, None: no trainable objective
    control: bool = False
    capacity_control: bool = False

    @classmethod
    def from_config(cls, name: str, node: Mapping[str, Any]) -> DetectorEntry:
        """The entry of a detector config (``cfg.detector`` of a composed ``train`` config)."""
        reg = dict(node.get("registry") or {})
        unknown = sorted(set(reg) - set(REGISTRY_KEYS))
        if unknown:
            raise SiftError(f"detector/{name}.yaml: registry: unknown key(s) {unknown} (known: {list(REGISTRY_KEYS)})")
        return cls(name=name, target=str(node.get("_target_", "")), reference=bool(reg.get("reference", False)),
                   cost=float(reg.get("cost", 1.0)), ablations=bool(reg.get("ablations", False)),
                   factorial=bool(reg.get("factorial", False)), objective=objective_label(node),
                   control=bool(reg.get("control", False)), capacity_control=bool(reg.get("capacity_control", False)))

    def factorial_cell(self) -> tuple[str, list[str]]:
        """The other objective's cell of the factorial design: its variant name and ``sift-train`` overrides
        (IRM+DANN ↔ ERM), e.g. ``("sift_erm", [...use_irm=false, ...use_dann=false])``."""
        if self.objective not in ("irm_dann", "erm"):
            raise SiftError(f"detector {self.name}: registry.factorial needs an objective with IRM and DANN both "
                            f"on or both off, got {self.objective!r}")
        flip = "erm" if self.objective == "irm_dann" else "irm_dann"
        on = str(flip == "irm_dann").lower()
        return f"{self.name}_{flip}", [f"detector.objective.use_irm={on}", f"detector.objective.use_dann={on}"]


def objective_label(node: Mapping[str, Any]) -> str | None:
    """``irm_dann``, ``irm``, ``dann`` or ``erm`` from a detector config's ``objective`` node (None without one)."""
    obj = node.get("objective")
    if obj is None:
        return None
    irm, dann = bool(obj.get("use_irm", False)), bool(obj.get("use_dann", False))
    return {(True, True): "irm_dann", (True, False): "irm", (False, True): "dann"}.get((irm, dann), "erm")


def detector_entries(names: Iterable[str]) -> dict[str, DetectorEntry]:
    """The registry entries of the named detectors (each composed from its config, so a user's config folder
    and overrides apply); raises SiftError naming a detector without a config."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from sift.config import compose

    out = {}
    for name in dict.fromkeys(str(n) for n in names):
        try:
            node = compose("train", [f"detector={name}", "paths.output_dir=."]).detector
        except (HydraException, OmegaConfBaseException) as e:
            raise SiftError(f"detector {name!r}: {str(e).splitlines()[0]}") from None
        out[name] = DetectorEntry.from_config(name, node)
    return out


def registry_entry(name: str) -> DetectorEntry | None:
    """The registry entry of detector ``name``, or None when no detector config has that name (a report row that is
    not a registered detector: the instance ensemble, a factorial cell, a toy run). Cached per name and config
    folders (sift's and a user's ``$SIFT_CONFIG_DIR``)."""
    import os

    from sift.resources import config_dir

    return _entry_or_none(str(name), str(config_dir()), os.environ.get("SIFT_CONFIG_DIR", ""))


@lru_cache(maxsize=512)
def _entry_or_none(name: str, _config_root: str, _user_root: str) -> DetectorEntry | None:
    try:
        return detector_entries([name])[name]
    except SiftError:
        return None


def row_detector(row: str) -> str:
    """The detector of a report row: ``"<name>"``, ``"<name> (ensemble)"`` or ``"<name> [<ablation>]"``."""
    return str(row).split(" ")[0]


def is_control(row: str) -> bool:
    """Whether a report row is a shortcut control: its detector's registry entry says ``control``."""
    e = registry_entry(row_detector(row))
    return e is not None and e.control


def capacity_controls(rows: Iterable[str]) -> list[str]:
    """The rows whose detector is the same-capacity text control (registry ``capacity_control``), seed runs only
    (not their ensembles)."""
    out = []
    for r in rows:
        e = registry_entry(row_detector(r))
        if e is not None and e.capacity_control and row_detector(r) == str(r):
            out.append(str(r))
    return out


def reference_detector(entries: Mapping[str, DetectorEntry]) -> str | None:
    """The name of the reference detector among ``entries`` (None when none is; an error when several are)."""
    refs = [n for n, e in entries.items() if e.reference]
    if len(refs) > 1:
        raise SiftError(f"several reference detectors ({', '.join(refs)}): registry.reference may be true for one")
    return refs[0] if refs else None


def factorial_designs(entries: Mapping[str, DetectorEntry], reference: str | None = None
                      ) -> list[dict[str, tuple[str, str]]]:
    """The architecture × objective designs of the factorial analysis (paper App. F), from the registry.

    Every detector whose entry declares ``factorial`` trains with its own objective (run ``<name>``) and with the
    other one (its :meth:`DetectorEntry.factorial_cell`). The high architecture is the reference detector when it
    is factorial, else the last factorial detector; each other factorial detector is crossed with it in a design of
    four runs, run name → (architecture, objective), listed low level first (the other architecture before the
    high one, ERM before IRM+DANN). Fewer than two factorial detectors: no design.
    """
    fac = [e for e in entries.values() if e.factorial]
    if len(fac) < 2:
        return []
    high = entries[reference] if reference in entries and entries[reference].factorial else fac[-1]
    designs = []
    for low in fac:
        if low.name == high.name:
            continue
        design: dict[str, tuple[str, str]] = {}
        for e in (low, high):
            cell, _ = e.factorial_cell()
            flipped = "erm" if e.objective == "irm_dann" else "irm_dann"
            runs = sorted({e.name: str(e.objective), cell: flipped}.items(), key=lambda kv: kv[1] != "erm")
            design.update({name: (e.name, OBJECTIVE_LEVELS[obj]) for name, obj in runs})
        designs.append(design)
    return designs
