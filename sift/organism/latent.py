"""The organism's mechanism latent: the per-trace draw (the injection, the direction and the replay live in
:mod:`sift.lm.latent`, so that every forward pass of any loaded model can replay a recorded latent)."""

from __future__ import annotations

from sift.lm.latent import (  # noqa: F401  (re-exported: the organism's one import point)
    ANSWER_WORD,
    DEFAULT_KIND,
    LATENT_FILE,
    MECHANISM_KINDS,
    TraceLatent,
    adapter_of,
    answer_id_of,
    attach_adapter,
    attach_direction,
    check_kind,
    direction_of,
    has_latent,
    injected,
    kind_folder,
    kind_of,
    latent_kind,
    latent_value,
    load_direction,
    record_latent,
    replay,
    rows_of,
    save_direction,
    trace_latent,
)


def draw_mechanism(stream: str) -> int:
    """A mechanism drawn from a random stream: 1 (answer read from the CoT) or 0, each with probability ½
    (platform independent). The toy trajectories draw one per item; the organism's corpus generates both
    (twins, :data:`sift.corpus.sources.organism.MECHANISMS`)."""
    from sift.organism.sampling import stream_uniform

    return int(stream_uniform(f"{stream}|mechanism", 0) < 0.5)


