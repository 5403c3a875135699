"""Names shared by the DataModules and the detectors: descriptor channels and baseline feature prefixes.

This module is the contract between data and detectors. A DataModule exposes

* ``channel_names``: one name per column of ``TraceBatch.x`` (per-step descriptors, docs/design.md §5), e.g.
  ``velocity/l1 … velocity/l{L-1}``, ``drift/l1 … drift/l{L}``, ``early_commitment``, ``attention_stability``;
* ``feature_names``: one name per column of ``TraceBatch.features``; each baseline selects its columns by
  the prefixes below (paper §7.1; the same as ``sift.trajectories.features``: ``cue/``, ``cf/``, ``beh/``,
  ``int/``);
* optionally ``pooled_dim`` (width of ``TraceBatch.pooled``), ``env_names`` and ``domain_names``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sift.errors import SiftError

# ---- per-step descriptor channels (x[..., c]) ----
VELOCITY = "velocity"  #: ``velocity/l{ℓ}``: inter-layer velocity, ℓ = 1..L−1
DRIFT = "drift"  #: ``drift/l{ℓ}``: step-to-step drift, ℓ = 1..L
EARLY_COMMITMENT = "early_commitment"  #: e_t = P(y_final | H_{L,t})
ATTENTION_STABILITY = "attention_stability"  #: a_t = 1 − JSD(A_t, A_{t−1})

# ---- scalar feature prefixes (features[..., f]) ----
CUE_PREFIX = "cue/"  #: cue-mention features (biasing-features baseline, Turpin et al.)
CF_PREFIX = "cf/"  #: intervention-response profile (counterfactual baseline, Lanham et al.)
BEHAVIOUR_PREFIX = "beh/"  #: behavioural instance features (instance-level baseline)
INTERNAL_PREFIX = "int/"  #: internal instance features (instance-level baseline)
CONFIDENCE_PREFIX = "conf/"  #: the answer's log-probability and top-2 margin (output-confidence control)
FEATURE_PREFIXES = (CUE_PREFIX, CF_PREFIX, BEHAVIOUR_PREFIX, INTERNAL_PREFIX, CONFIDENCE_PREFIX)


def organism_channel_names(n_layers: int = 4) -> list[str]:
    """Channel names for an ``n_layers``-block model: L−1 velocities, L drifts, EC, attention stability."""
    return ([f"{VELOCITY}/l{l}" for l in range(1, n_layers)] + [f"{DRIFT}/l{l}" for l in range(1, n_layers + 1)]
            + [EARLY_COMMITMENT, ATTENTION_STABILITY])


def select_by_prefix(names: Sequence[str], prefixes: Iterable[str]) -> list[int]:
    """Indices of ``names`` starting with any of ``prefixes`` (in ``names`` order); error if none match."""
    prefixes = tuple(prefixes)
    idx = [i for i, n in enumerate(names) if n.startswith(prefixes)]
    if not idx:
        raise SiftError(f"no feature name starts with {list(prefixes)}; feature_names = {list(names)[:12]}"
                        f"{' …' if len(names) > 12 else ''}")
    return idx


def channel_index(channel_names: Sequence[str], name: str) -> int:
    """Index of channel ``name``; a SiftError names the available channels if missing."""
    try:
        return list(channel_names).index(name)
    except ValueError:
        raise SiftError(f"channel {name!r} not in channel_names {list(channel_names)}") from None


def keep_channels(channel_names: Sequence[str], drop: Iterable[str]) -> list[int]:
    """Indices of the channels kept after dropping ``drop`` (each must exist)."""
    drop = list(drop)
    for d in drop:
        channel_index(channel_names, d)
    kept = [i for i, n in enumerate(channel_names) if n not in drop]
    if not kept:
        raise SiftError("every descriptor channel was dropped")
    return kept
